"""KernelBench style: Conv3d (bias=False, kernel tuple) -> InstanceNorm3d(affine=True) -> F.leaky_relu ->
nn.AvgPool3d -> nn.AdaptiveAvgPool3d((1, 1, 1)) -> torch.flatten(x, 1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, bias=False)
        self.instance_norm = nn.InstanceNorm3d(out_channels, affine=True)
        self.pool = nn.AvgPool3d(kernel_size=2)
        self.gap = nn.AdaptiveAvgPool3d((1, 1, 1))

    def forward(self, x):
        x = self.conv(x)
        x = self.instance_norm(x)
        x = F.leaky_relu(x, negative_slope=0.1)
        x = self.pool(x)
        x = self.gap(x)
        return torch.flatten(x, 1)


batch_size = 2
in_channels = 2
out_channels = 4
depth, height, width = 6, 7, 8
kernel_size = (3, 2, 3)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
