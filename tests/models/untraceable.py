"""Data-dependent control flow: torch.fx cannot trace it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        x = self.conv(x)
        if x.sum() > 0:
            return torch.relu(x)
        return x


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
