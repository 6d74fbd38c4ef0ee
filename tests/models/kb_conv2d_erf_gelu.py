"""Conv2d, then GELU written out with torch.erf: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))), then a
ReLU."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        x = torch.relu(x)
        return x


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 7, 8
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
