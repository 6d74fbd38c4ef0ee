"""KernelBench style: Conv2d -> torch.min over the channels (keepdim) -> + a bias of shape (1, 1, 1) -> * a
scale of shape (1, 1) -> tanh. After the channel reduction the value has one channel, so a (C, 1, 1) parameter
could not apply, but a (1, 1, 1) one is a single value: the config declares both shape: scalar (bound to the
user's tensors as 0-dim views), and the ops run in the kernels after the reduction."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(1, 1, 1))
        self.scale = nn.Parameter(torch.randn(1, 1))

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, dim=1, keepdim=True)[0]
        x = x + self.bias
        x = x * self.scale
        return torch.tanh(x)


batch_size = 2
in_channels = 3
out_channels = 6
height, width = 9, 10
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
