"""Conv2d -> torch.where(x > 0, x, x * 0.2) (a leaky relu) -> torch.clamp with tensor bounds (0-dim buffers: numbers)
-> x / torch.tensor(2.0) -> dropout (eval); a second Conv2d clamped by parameters: x.clamp(min=a (C, 1, 1) parameter,
max=a 0-dim parameter) (maximum then minimum), then torch.clamp_max by torch.tensor(0.4, device=x.device) (clamp's
tensor bounds must be on the input's device: a CPU one fails on a GPU, in eager too)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.register_buffer("lo", torch.tensor(-0.3))
        self.register_buffer("hi", torch.tensor(0.7))
        self.drop = nn.Dropout(0.3)
        self.conv2 = nn.Conv2d(5, 4, 3)
        self.floor = nn.Parameter(torch.randn(4, 1, 1) * 0.3)
        self.ceiling = nn.Parameter(torch.tensor(0.5))
        self.eval()

    def forward(self, x):
        x = self.conv(x)
        x = torch.where(x > 0, x, x * 0.2)
        x = torch.clamp(x, min=self.lo, max=self.hi)
        x = x / torch.tensor(2.0)
        x = self.drop(x)
        x = self.conv2(x).clamp(min=self.floor, max=self.ceiling)
        return torch.clamp_max(x, torch.tensor(0.4, device=x.device))


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
