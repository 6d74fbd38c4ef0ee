"""Conv2d, then x * self.scale of shape (C, 1, 1), + self.bias of shape (1, C, 1, 1), * self.alpha, a 0-dim
nn.Parameter: all three are the config's per-channel parameters under the user's names (the last two bound as
views of the user's tensors)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scale_shape, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scale = nn.Parameter(torch.randn(scale_shape))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.alpha = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        x = self.conv(x)
        x = x * self.scale
        x = x + self.bias
        x = x * self.alpha
        return x


batch_size = 2
in_channels = 3
out_channels = 5
height, width = 9, 11
kernel_size = 3
scale_shape = (out_channels, 1, 1)
bias_shape = (1, out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale_shape, bias_shape]
