"""In-place ops as statements on the conv's output: x.mul_(a (C, 1, 1) parameter), then x.add_(a 0-dim parameter),
each reading x after the write before it (the write's result: the chain goes on through them), F.silu(inplace=True),
F.hardtanh(inplace=True); nn.Hardtanh(0, 6); the model returns a tuple (the chain's value and a second output)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.scale = nn.Parameter(torch.randn(4, 1, 1))
        self.shift = nn.Parameter(torch.tensor(0.1))
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.act = nn.Hardtanh(0.0, 6.0)

    def forward(self, x):
        x = self.conv(x)
        x.mul_(self.scale)
        x.add_(self.shift)
        x = F.silu(x, inplace=True)
        x = F.hardtanh(x, -1.0, 1.0, inplace=True)
        y = self.act(self.conv2(x))
        return x, y.amax(dim=(2, 3))


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
