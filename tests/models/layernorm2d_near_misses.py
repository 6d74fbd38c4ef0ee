"""Near misses of ConvNeXt's LayerNorm2d, which must not become a layer norm over the channels: eps outside the
square root, the unbiased variance (x.var(1)), a mean over the spatial dims, and a permute around a LayerNorm over
the last dim that is not the channels (permute(0, 2, 1, 3): over H)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3)
        self.b = nn.Conv2d(3, 8, 3)
        self.c = nn.Conv2d(3, 8, 3)
        self.d = nn.Conv2d(3, 8, 3)
        self.ln = nn.LayerNorm(9)

    def forward(self, x):
        a = self.a(x)
        u = a.mean(1, keepdim=True)
        s = (a - u).pow(2).mean(1, keepdim=True)
        a = (a - u) / (torch.sqrt(s) + 1e-6)
        b = self.b(x)
        u = b.mean(1, keepdim=True)
        b = (b - u) / torch.sqrt(b.var(1, keepdim=True) + 1e-6)
        c = self.c(x)
        u = c.mean((2, 3), keepdim=True)
        s = (c - u).pow(2).mean((2, 3), keepdim=True)
        c = (c - u) / torch.sqrt(s + 1e-6)
        d = self.ln(self.d(x).permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        return a, b, c, d


def get_inputs():
    return [torch.randn(2, 3, 11, 11)]


def get_init_inputs():
    return []
