"""Per-channel tensors of shape (C,) reshaped in the forward: x + self.bias.view(1, -1, 1, 1), then
x * self.scale[None, :, None, None] after a ReLU; the views are part of the chain."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)
        self.bias = nn.Parameter(torch.randn(out_channels))
        self.scale = nn.Parameter(torch.randn(out_channels))

    def forward(self, x):
        x = self.conv(x)
        x = x + self.bias.view(1, -1, 1, 1)
        x = torch.relu(x)
        x = x * self.scale[None, :, None, None]
        return x


batch_size = 2
in_channels = 3
out_channels = 6
height, width = 7, 9
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
