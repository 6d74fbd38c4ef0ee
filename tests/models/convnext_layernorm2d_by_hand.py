"""ConvNeXt's block: depthwise Conv2d(24, k7) -> LayerNorm2d written by hand (mean and biased variance over the
channels, eps inside the square root, weight[:, None, None] * x + bias[:, None, None]) -> GELU; and a 3-D one whose
difference x - u is computed once, times torch.rsqrt, then times a (C, 1, 1, 1) parameter (its weight) -> ReLU."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm2d(nn.Module):
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c))
        self.bias = nn.Parameter(torch.randn(c))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        x = self.weight[:, None, None] * x + self.bias[:, None, None]
        return x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(24, 24, 7, padding=3, groups=24)
        self.norm = LayerNorm2d(24)
        self.conv3 = nn.Conv3d(3, 10, 3)
        self.gamma = nn.Parameter(torch.randn(10, 1, 1, 1))

    def forward(self, x, v):
        y = F.gelu(self.norm(self.dw(x)))
        z = self.conv3(v)
        d = z - torch.mean(z, dim=1, keepdim=True)
        z = d * torch.rsqrt(torch.square(d).mean(dim=1, keepdim=True) + 1e-5)
        return y, F.relu(z * self.gamma)


def get_inputs():
    return [torch.randn(2, 24, 15, 17), torch.randn(2, 3, 6, 7, 9)]


def get_init_inputs():
    return []
