"""KernelBench style: Conv2d -> + self.bias (out_channels, 1, 1) -> swish by hand (torch.sigmoid(x) * x) -> / 2.0."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape, divisor):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x)
        x = x + self.bias
        x = torch.sigmoid(x) * x
        x = x / self.divisor
        return x


batch_size = 2
in_channels = 3
out_channels = 6
height, width = 11, 9
kernel_size = 3
bias_shape = (out_channels, 1, 1)
divisor = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape, divisor]
