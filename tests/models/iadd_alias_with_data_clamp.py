"""No trace computes this model: ``out = y; out += 1.0`` writes y in place, which torch.fx records as a new tensor (its
trace computes something else), and the forward clamps a parameter through ``.data`` (weight clipping), which
torch.export cannot trace. The import fails, naming both."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.scale = nn.Parameter(torch.full((1, 4, 1, 1), 2.0))

    def forward(self, x):
        self.scale.data.clamp_(0.0, 1.5)
        y = self.conv(x) * self.scale
        out = y
        out += 1.0
        return torch.tanh(out) + y


def get_inputs():
    return [torch.randn(2, 3, 6, 7)]


def get_init_inputs():
    return []
