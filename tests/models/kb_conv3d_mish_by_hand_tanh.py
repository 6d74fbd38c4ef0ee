"""KernelBench style: Conv3d (stride and padding tuples) -> mish by hand (x * torch.tanh(F.softplus(x))) -> tanh."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        x = self.conv(x)
        x = x * 0.5
        x = x * torch.tanh(F.softplus(x))
        x = torch.tanh(x)
        return x


batch_size = 2
in_channels = 2
out_channels = 4
depth, height, width = 5, 7, 6
kernel_size = 3
stride = (1, 2, 1)
padding = (1, 1, 0)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]
