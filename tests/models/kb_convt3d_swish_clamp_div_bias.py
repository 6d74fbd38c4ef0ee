"""ConvTranspose3d, torch.sigmoid(x) * x (swish, the sigmoid first), torch.clamp(x, min=..., max=...), x / 2.0,
and a bias of shape (1, C, 1, 1, 1)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.sigmoid(x) * x
        x = torch.clamp(x, min=-0.5, max=0.75)
        x = x / 2.0
        x = x + self.bias
        return x


batch_size = 2
in_channels = 3
out_channels = 4
depth, height, width = 3, 5, 4
kernel_size = 3
stride = 2
padding = 1
bias_shape = (1, out_channels, 1, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, bias_shape]
