"""ConvTranspose2d, x.max(dim=1, keepdim=True)[0] (a method, its values), then tanh twice, as a method and as a
function."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x.max(dim=1, keepdim=True)[0]
        x = x.tanh()
        x = torch.tanh(x)
        return x


batch_size = 2
in_channels = 4
out_channels = 6
height, width = 5, 6
kernel_size = 3
stride = 2
padding = 1
output_padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding]
