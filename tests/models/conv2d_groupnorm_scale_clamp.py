"""Conv2d -> GroupNorm -> x * self.scale (per channel) -> clamp -> torch.min(x, torch.tensor(0.5))."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin=3, cout=8, groups=4):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=2)
        self.group_norm = nn.GroupNorm(groups, cout, eps=1e-4)
        self.scale = nn.Parameter(torch.randn(cout, 1, 1))

    def forward(self, x):
        x = self.group_norm(self.conv(x))
        x = x * self.scale
        x = x.clamp(min=-1.0, max=2.0)
        return torch.min(x, torch.tensor(0.5))


def get_inputs():
    return [torch.randn(2, 3, 15, 13)]


def get_init_inputs():
    return [3, 8, 4]
