"""In-place writes through views after a convolution: F.relu(a[:, :2], inplace=True), b[:, 0] = 0.0,
c.narrow(1, 0, 2).mul_(2.0) on a chain's value, d[d < 0] = 0.0 on a clone (torch.export's trace): the written values
are read by no chain but the one before the write."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)
        self.b = nn.Conv2d(3, 4, 3)
        self.c = nn.Conv2d(3, 4, 3)
        self.d = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        a = self.a(x)
        F.relu(a[:, :2], inplace=True)
        a = torch.sigmoid(a)
        b = self.b(x)
        b[:, 0] = 0.0
        b = torch.tanh(b)
        c = torch.relu(self.c(x))
        c.narrow(1, 0, 2).mul_(2.0)
        c = c * 3.0
        d = self.d(x).clone()
        d[d < 0] = 0.0
        d = d.exp()
        return a, b, c, d


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
