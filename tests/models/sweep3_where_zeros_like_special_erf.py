"""Elementwise regions written with more of torch's names: torch.where(x < 0, torch.zeros_like(x), x) (relu),
torch.minimum(x, torch.tensor(6.0)), an erf GELU by torch.special.erf (BERT's ``0.5 * x * (1 + erf(x / sqrt(2)))``),
torch.where(x > 0, x, torch.full_like(x, 0.0)) then x.add(bias.view(-1, 1, 1)) and x.mean(dim=1, keepdim=True)."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, stride=2)
        self.conv2 = nn.Conv2d(3, 4, 3)
        self.bias = nn.Parameter(torch.randn(5))

    def forward(self, x):
        y = self.conv(x)
        y = torch.where(y < 0, torch.zeros_like(y), y)
        y = torch.minimum(y, torch.tensor(6.0))
        y = torch.mul(y, 2)
        y = y.add(self.bias.view(-1, 1, 1))
        y = y.mean(dim=1, keepdim=True)
        g = self.conv2(x)
        g = 0.5 * g * (1.0 + torch.special.erf(g / math.sqrt(2.0)))
        g = torch.where(g > 0, g, torch.full_like(g, 0.0))
        return y, g


def get_inputs():
    return [torch.randn(2, 3, 9, 8)]


def get_init_inputs():
    return []
