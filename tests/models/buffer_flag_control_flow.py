"""A forward whose control flow reads a buffer (Glow's ActNorm and VQ codebooks keep an ``initialized`` flag):
torch.fx cannot branch on a proxied buffer, so the import traces again with buffers read as values (their
arithmetic then a constant of the trace); the chain before the branch is found either way."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.register_buffer("initialized", torch.tensor(1, dtype=torch.uint8))

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if self.initialized.item() == 0:  # a data-dependent first call, as ActNorm's
            y = y * 2
        return y


def get_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_init_inputs():
    return []
