"""Sizes read off the chain's values: x.sum(dim=2) / x.shape[-1] (a mean written by hand: the size at the traced
shape, a number), and a forward that returns a value's size beside the chain's output (``return y, x.shape[-1]``:
the chain's output is y, not the size read after it). Two chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.conv = nn.Conv3d(3, 5, 3)
        self.scale = nn.Parameter(torch.rand(1, 5, 1, 1, 1) + 0.5)

    def forward(self, s, v):
        s = torch.tanh(self.up(s)) * 0.5 + 0.5
        s = s.sum(dim=2) / s.shape[-1]
        s = s.softmax(dim=-1)
        v = self.conv(v) * self.scale
        v = torch.max(v, 1, keepdim=True).values
        v = v.min(2)[0]
        return s, F.relu(v), v.shape[-1]


def get_inputs():
    return [torch.randn(3, 8, 13), torch.randn(2, 3, 6, 7, 8)]


def get_init_inputs():
    return []
