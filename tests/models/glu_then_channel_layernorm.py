"""A gated convolution then a layer norm over the channels left (C/2 of the convolution's), in both forms real
code writes it (permuted around nn.LayerNorm, and by hand), then an activation: the norm is matched at the chain's
channels after the glu, not the convolution's."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(5, 14, 3, padding=1)
        self.norm = nn.LayerNorm(7, eps=1e-6)
        self.conv2 = nn.Conv2d(5, 10, 3)
        self.weight = nn.Parameter(torch.rand(5) + 0.5)
        self.bias = nn.Parameter(torch.randn(5))

    def forward(self, x):
        a = F.glu(self.conv(x), dim=1)
        a = self.norm(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        b = F.glu(self.conv2(x), dim=1)
        u = b.mean(1, keepdim=True)
        s = (b - u).pow(2).mean(1, keepdim=True)
        b = (b - u) / torch.sqrt(s + 1e-5)
        b = self.weight[:, None, None] * b + self.bias[:, None, None]
        return F.gelu(a), torch.tanh(b)


def get_inputs():
    return [torch.randn(2, 5, 11, 13)]


def get_init_inputs():
    return []
