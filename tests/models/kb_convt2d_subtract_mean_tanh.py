"""KernelBench style: ConvTranspose2d -> x - x.mean(dim=(2, 3), keepdim=True) on the convolution's output ->
tanh; then a second ConvTranspose2d's BatchNorm2d (train) whose output feeds both its mean and the subtraction:
each a mean centring (the value read twice, by the mean and by the subtraction of it), one op of the chain."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.conv_transpose2 = nn.ConvTranspose2d(out_channels, out_channels, kernel_size, padding=padding)
        self.batch_norm = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x - x.mean(dim=(2, 3), keepdim=True)
        x = torch.tanh(x)
        x = self.batch_norm(self.conv_transpose2(x))
        x = x - torch.mean(x, dim=(2, 3), keepdim=True)
        return x


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 5, 6
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]
