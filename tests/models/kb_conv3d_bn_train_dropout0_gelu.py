"""Conv3d, BatchNorm3d in training mode (KernelBench builds its models in training mode), nn.Dropout(p=0.0)
(an identity even in training mode), then nn.GELU(approximate='tanh')."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, eps, momentum):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm3d(out_channels, eps=eps, momentum=momentum)
        self.dropout = nn.Dropout(p=0.0)
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = self.dropout(x)
        x = self.gelu(x)
        return x


batch_size = 3
in_channels = 2
out_channels = 4
depth, height, width = 5, 6, 7
kernel_size = 3
eps = 1e-5
momentum = 0.1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, eps, momentum]
