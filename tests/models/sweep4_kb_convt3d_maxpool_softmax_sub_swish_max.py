"""KernelBench ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max: a padded strided max pool, a channel softmax,
self.subtract.view(1, -1, 1, 1, 1) (a (C,) parameter viewed in the forward), torch.sigmoid(x) * x, torch.max over
channels [0]."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, pool_kernel_size,
                 pool_stride, pool_padding):
        super(Model, self).__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                                 output_padding=output_padding)
        self.max_pool = nn.MaxPool3d(kernel_size=pool_kernel_size, stride=pool_stride, padding=pool_padding)
        self.subtract = nn.Parameter(torch.randn(out_channels))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.max_pool(x)
        x = torch.softmax(x, dim=1)
        x = x - self.subtract.view(1, -1, 1, 1, 1)
        x = torch.sigmoid(x) * x
        x = torch.max(x, dim=1)[0]
        return x


batch_size = 2
in_channels, out_channels = 3, 5
depth, height, width = 3, 4, 5
kernel_size, stride, padding, output_padding = 3, 2, 1, 1
pool_kernel_size, pool_stride, pool_padding = 2, 2, 0


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, pool_kernel_size, pool_stride,
            pool_padding]
