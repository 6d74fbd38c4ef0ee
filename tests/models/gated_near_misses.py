"""Products of halves that are no glu: the gate on the first half, unequal halves, a half read twice; and indexes
that are no slice of the vocabulary (the batch sliced, None, an integer)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(4, 10, 3)
        self.b = nn.Conv1d(4, 10, 3)
        self.c = nn.Conv1d(4, 10, 3)
        self.d = nn.Conv1d(4, 10, 3)
        self.e = nn.Conv1d(4, 10, 3)
        self.f = nn.Conv1d(4, 10, 3)

    def forward(self, x):
        a, b = self.a(x).chunk(2, dim=1)
        swapped = torch.sigmoid(a) * b
        p, q = torch.split(self.b(x), [4, 6], dim=1)
        unequal = p[:, :, :] * torch.sigmoid(q[:, :4])
        r, s = self.c(x).chunk(2, dim=1)
        twice = r * torch.sigmoid(s) + r
        batch = self.d(x)[1:]
        none = self.e(x)[:, None, :, 1:]
        integer = self.f(x)[:, 3]
        return swapped, unequal, twice, batch, none, integer


def get_inputs():
    return [torch.randn(2, 4, 17)]


def get_init_inputs():
    return []
