"""A causal dilated convolution written TCN-style without weight norm: a Conv1d padded by (k - 1) * d on both
sides, the right padding chomped off (x[:, :, :-pad].contiguous(), and the same by narrow), ReLU, dropout; a
UNet-style crop of a 2-D output's borders (x[..., 2:-2, 1:])."""
import torch
import torch.nn as nn


class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, :-self.chomp_size].contiguous()


class Model(nn.Module):
    def __init__(self, n_inputs=6, n_outputs=10, kernel_size=3, dilation=2, dropout=0.2):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv1 = nn.Conv1d(n_inputs, n_outputs, kernel_size, padding=self.pad, dilation=dilation)
        self.chomp1 = Chomp1d(self.pad)
        self.relu1 = nn.ReLU()
        self.dropout1 = nn.Dropout(dropout)
        self.conv2 = nn.Conv1d(n_outputs, n_outputs, kernel_size, padding=self.pad, dilation=dilation)
        self.conv3 = nn.Conv2d(n_inputs, n_outputs, 3, padding=1)

    def forward(self, x, y):
        h = self.dropout1(self.relu1(self.chomp1(self.conv1(x))))
        c = self.conv2(h)
        h = torch.tanh(c.narrow(2, 0, c.shape[2] - self.pad)) * 2.0
        z = self.conv3(y)
        z = torch.sigmoid(z[..., 2:-2, 1:] * 0.5)
        return h, z


def get_inputs():
    return [torch.randn(3, 6, 41), torch.randn(2, 6, 13, 10)]


def get_init_inputs():
    return [6, 10, 3, 2]
