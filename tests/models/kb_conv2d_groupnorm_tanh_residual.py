"""Conv2d, GroupNorm, torch.tanh, then a residual ``x = x + original`` of the convolution's output: the
convolution's value read after the norm."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        original = x
        x = self.group_norm(x)
        x = torch.tanh(x)
        x = x + original
        return x


batch_size = 2
in_channels = 3
out_channels = 8
height, width = 7, 9
kernel_size = 3
num_groups = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
