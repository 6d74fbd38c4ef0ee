"""KernelBench level-2 style, a model of two inputs: ``forward(self, x, add_input)`` adds the second (of the
convolution's output shape) after a transposed convolution, then hardswish, then reads it again (the larger of the
two, element by element), then a per-channel scale. The whole chain is one config whose extra input is
``add_input``, the forward's own argument name."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, scale_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.scale = nn.Parameter(torch.randn(scale_shape))

    def forward(self, x, add_input):
        x = self.conv_transpose(x)
        x = x + add_input
        x = F.hardswish(x)
        x = torch.maximum(x, add_input)
        return x * self.scale


batch_size = 2
in_channels = 3
out_channels = 6
height, width = 7, 5
kernel_size = 3
stride = 2
padding = 1
output_padding = 1
scale_shape = (out_channels, 1, 1)


def get_inputs():
    out_h, out_w = (height - 1) * stride - 2 * padding + kernel_size + output_padding, \
        (width - 1) * stride - 2 * padding + kernel_size + output_padding
    return [torch.randn(batch_size, in_channels, height, width), torch.randn(batch_size, out_channels, out_h, out_w)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, scale_shape]
