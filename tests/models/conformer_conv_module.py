"""A Conformer convolution module (Gulati et al. 2020), as ESPnet and torchaudio write it: a LayerNorm over the
features of a (batch, time, features) input, a transpose to channels first, a pointwise Conv1d to twice the
features, a GLU over the channels, a depthwise Conv1d, BatchNorm1d, SiLU, a pointwise Conv1d, dropout."""
import torch
import torch.nn as nn

batch_size = 3
time_steps = 37
d_model = 20
kernel_size = 7


class Model(nn.Module):
    def __init__(self, d_model, kernel_size, dropout=0.1):
        super().__init__()
        self.layer_norm = nn.LayerNorm(d_model)
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, kernel_size=1, stride=1, padding=0, bias=True)
        self.glu = nn.GLU(dim=1)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel_size, stride=1, padding=(kernel_size - 1) // 2,
                                        groups=d_model, bias=True)
        self.batch_norm = nn.BatchNorm1d(d_model)
        self.activation = nn.SiLU()
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, kernel_size=1, stride=1, padding=0, bias=True)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = self.layer_norm(x)
        x = x.transpose(1, 2)
        x = self.pointwise_conv1(x)
        x = self.glu(x)
        x = self.depthwise_conv(x)
        x = self.batch_norm(x)
        x = self.activation(x)
        x = self.pointwise_conv2(x)
        x = self.dropout(x)
        return x.transpose(1, 2)


def get_inputs():
    return [torch.randn(batch_size, time_steps, d_model)]


def get_init_inputs():
    return [d_model, kernel_size]
