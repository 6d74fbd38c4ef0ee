"""A 0-dim nn.Parameter applied after the channels are summed (torch.sum(x, dim=1, keepdim=True)): no longer
one value per channel of the convolution, but one value: a scalar parameter (shape: scalar); a 0-dim buffer is a
number."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("offset", torch.tensor(0.25))

    def forward(self, x):
        x = self.conv(x)
        x = x + self.offset
        x = torch.sum(x, dim=1, keepdim=True)
        x = x / self.temperature
        return x


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 6, 9
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
