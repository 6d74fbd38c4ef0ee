"""Nested nn.Sequential: (Conv3d, BatchNorm3d in eval mode), then (ReLU, (Hardswish, Identity)), then a flatten
of the spatial dims."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv3d(in_channels, out_channels, kernel_size, bias=False), nn.BatchNorm3d(out_channels)),
            nn.Sequential(nn.ReLU(inplace=True), nn.Sequential(nn.Hardswish(), nn.Identity())),
        )
        self.eval()

    def forward(self, x):
        x = self.features(x)
        return torch.flatten(x, 2)


batch_size = 2
in_channels = 3
out_channels = 5
depth, height, width = 4, 6, 7
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
