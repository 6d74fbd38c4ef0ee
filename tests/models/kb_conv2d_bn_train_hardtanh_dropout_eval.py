"""KernelBench style: Conv2d (bias=False) -> BatchNorm2d in training mode (the KernelBench default) -> Hardtanh
-> nn.Dropout(p=0.0) -> nn.GELU(approximate='tanh')."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.hardtanh = nn.Hardtanh(min_val=-0.5, max_val=0.5)
        self.dropout = nn.Dropout(p=0.0)
        self.gelu = nn.GELU(approximate='tanh')

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = self.hardtanh(x)
        x = self.dropout(x)
        x = self.gelu(x)
        return x


batch_size = 4
in_channels = 3
out_channels = 8
height, width = 9, 10
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
