"""Conv2d, a leaky ReLU written as torch.where(x > 0, x, x * 0.2), then nn.Softplus with its own beta."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, negative_slope):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.negative_slope = negative_slope
        self.softplus = nn.Softplus(beta=2.0, threshold=10.0)

    def forward(self, x):
        x = self.conv(x)
        x = torch.where(x > 0, x, x * self.negative_slope)
        x = self.softplus(x)
        return x


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 8, 9
kernel_size = 3
negative_slope = 0.2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, negative_slope]
