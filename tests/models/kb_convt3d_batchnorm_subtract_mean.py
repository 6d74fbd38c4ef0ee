"""KernelBench style (level 2, ConvTranspose3d -> BatchNorm3d -> subtract the spatial mean): the mean written as
torch.mean(x, dim=(2, 3, 4), keepdim=True) and subtracted from the batch norm's output, which both read: a
mean centring, a later region of kernels after the batch norm's."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias=True):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, bias=bias)
        self.batch_norm = nn.BatchNorm3d(out_channels)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.batch_norm(x)
        x = x - torch.mean(x, dim=(2, 3, 4), keepdim=True)
        return x


batch_size = 2
in_channels = 3
out_channels = 6
depth, height, width = 3, 5, 4
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]
