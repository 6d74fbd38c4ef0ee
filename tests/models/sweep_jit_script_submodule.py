"""Submodules compiled by torch.jit.script (an activation, a 1x1 convolution): torch.fx calls them as they are,
so no chain goes through them, and optimize hands back a model that runs them, not a crash."""
import torch
import torch.nn as nn


class Act(nn.Module):
    def forward(self, x):
        return torch.clamp(x, max=4.0) * 0.5


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = torch.jit.script(Act())
        self.conv2 = torch.jit.script(nn.Conv2d(8, 8, 1))

    def forward(self, x):
        x = self.act(self.conv(x))
        return torch.relu(self.conv2(x))


def get_inputs():
    return [torch.randn(2, 3, 12, 12)]


def get_init_inputs():
    return []
