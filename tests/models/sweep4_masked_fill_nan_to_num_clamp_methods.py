"""Guards users write after a convolution: x.masked_fill(x < 0, 0.0) (relu), torch.nan_to_num, clamp_min /
clamp_max and their in-place forms, sigmoid_ / tanh_ on a clone."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)
        self.b = nn.Conv2d(3, 4, 3, padding=1)
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        a = self.a(x)
        a = a.masked_fill(a < 0, 0.0)
        a = torch.nan_to_num(a * 2.0)
        b = self.b(x).clamp_min(-0.5)
        b = torch.clamp_max(b, 0.5).clamp_min_(-0.25)
        c = self.c(x).clone().sigmoid_()
        c = c.clone().tanh_().mul_(3.0)
        return a, b, c


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
