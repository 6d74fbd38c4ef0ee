"""ConvTranspose2d; r = x.clone(); x = (x + b) * r + r, with .detach() and .contiguous() as identities."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.bias = nn.Parameter(torch.randn(6, 1, 1))

    def forward(self, x):
        x = self.conv_transpose(x)
        original = x.clone().detach()
        x = x.contiguous() + self.bias
        x = x * original
        return x + original


def get_inputs():
    return [torch.randn(2, 4, 5, 6)]


def get_init_inputs():
    return []
