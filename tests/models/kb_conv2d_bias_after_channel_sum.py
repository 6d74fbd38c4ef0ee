"""A trap for a wrong config: a per-channel bias added after the channels are summed away (it broadcasts the value
back out) must stay in PyTorch; a per-channel parameter of shape (1, C, 1, 1) is one value per channel (a view)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv_a = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.conv_b = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))
        self.scale = nn.Parameter(torch.randn(1, out_channels, 1, 1))

    def forward(self, x):
        a = torch.sum(torch.relu(self.conv_a(x)), dim=1, keepdim=True)
        a = a + self.bias
        b = torch.tanh(self.conv_b(x)) * self.scale
        return a + b


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 8, 7
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
