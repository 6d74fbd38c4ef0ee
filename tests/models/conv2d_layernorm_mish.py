"""Conv2d -> LayerNorm over (C, H, W) -> Mish -> SiLU -> Hardsigmoid -> x.exp().log() -> sqrt(abs)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.ln = nn.LayerNorm([4, 6, 6], eps=1e-6)
        self.mish = nn.Mish()
        self.silu = nn.SiLU()

    def forward(self, x):
        x = self.silu(self.mish(self.ln(self.conv(x))))
        x = nn.functional.hardsigmoid(x)
        x = x.exp().log()
        return torch.sqrt(torch.abs(x))


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
