"""Conv2d, nn.InstanceNorm2d, x / 2.0, torch.clamp(x, min=0.0) (a lower bound only), then the spatial mean
subtracted: x - x.mean(dim=(2, 3), keepdim=True) on a later value, read twice (a mean centring)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.instance_norm = nn.InstanceNorm2d(out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = self.instance_norm(x)
        x = x / 2.0
        x = torch.clamp(x, min=0.0)
        x = x - x.mean(dim=(2, 3), keepdim=True)
        return x


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 9, 8
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
