"""A mean centring over the channels on a transposed convolution's output that the forward also returns (issue 23):
the centring's mean and subtraction are two of the output's three readers, the third the model's output (through
``x.clone()``); the chain takes the centring and the tanh and returns the convolution's output too (outputs:
[chain, producer])."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride)

    def forward(self, x):
        x = self.conv(x)
        r = x.clone()
        x = x - torch.mean(x, dim=1, keepdim=True)
        return torch.tanh(x), r


batch_size = 2
in_channels = 3
out_channels = 8
height, width = 8, 6
kernel_size = 3
stride = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride]
