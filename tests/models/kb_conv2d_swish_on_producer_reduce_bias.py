"""KernelBench style: Conv2d -> x * torch.sigmoid(x) on the convolution's output -> x.mean(dim=[2, 3],
keepdim=True) -> + self.bias (per channel, after the reduction) -> torch.logsumexp over channels -> * 10.0."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = x * torch.sigmoid(x)
        x = x.mean(dim=[2, 3], keepdim=True)
        x = x + self.bias
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = x * 10.0
        return x


batch_size = 3
in_channels = 3
out_channels = 7
height, width = 9, 8
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
