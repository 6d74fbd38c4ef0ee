"""Lazy modules (nn.LazyConv2d, nn.LazyBatchNorm2d, nn.LazyConvTranspose2d): their shapes are materialized by the
first forward, so a model straight from its constructor has uninitialized parameters."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.LazyConv2d(5, 3)
        self.bn = nn.LazyBatchNorm2d()
        self.up = nn.LazyConvTranspose2d(4, 2, stride=2)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return torch.sigmoid(self.up(x))


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
