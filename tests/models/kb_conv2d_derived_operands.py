"""Per-channel operands computed in the forward from the model's tensors alone: a batch norm folded by hand
(w = weight / sqrt(running_var + eps); y * w + (bias - running_mean * w)), exp of a 0-dim parameter, sigmoid of a
(C,) parameter read by both chains (g.view(1, -1, 1, 1), g[:, None, None]), a parameter times 2 after a reshape;
and self.weight[:, None, None], a plain view. Each is an operand of its chain, computed from the model's tensors
at every call (never a constant of the import)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)  # never called: its tensors are folded into the convolution's output
        self.scale = nn.Parameter(torch.tensor(0.3))
        self.gate = nn.Parameter(torch.randn(channels))
        self.conv2 = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.weight = nn.Parameter(torch.randn(channels))
        self.bias = nn.Parameter(torch.randn(channels))
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.normal_()
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        w = self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)
        g = torch.sigmoid(self.gate)
        y = self.conv(x) * w[None, :, None, None] + (self.bn.bias - self.bn.running_mean * w)[None, :, None, None]
        y = torch.relu(y) * self.scale.exp() * g.view(1, -1, 1, 1)
        z = self.conv2(x) * self.weight[:, None, None] + self.bias.reshape(1, -1, 1, 1) * 2
        return torch.cat([y, torch.tanh(z) * g[:, None, None]], dim=1)


def get_inputs():
    return [torch.randn(2, 5, 13, 11)]


def get_init_inputs():
    return [5, 7]
