"""A diffusion VAE's block: conv_in's output read by GroupNorm+SiLU (its chain) and by the residual add after the
block's second convolution; and the block's last convolution returned beside its relu (``return relu(y), y``). Each
of those chains returns its convolution's output too (outputs: [chain, producer]), which the other readers read."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_in = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16)
        self.conv_mid = nn.Conv2d(16, 16, 3, padding=1)
        self.conv_out = nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        r = F.silu(self.norm(h))
        r = self.conv_mid(r)
        h = h + r
        y = self.conv_out(h)
        return torch.relu(y), y


def get_inputs():
    return [torch.randn(2, 3, 13, 11)]


def get_init_inputs():
    return []
