"""A 4-D example input to a Conv1d: torch's error speaks of 2-D 'unbatched' and 3-D 'batched' inputs; the import's
names the module and the rank and layout it expects."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(3, 8, 3)

    def forward(self, x):
        return torch.tanh(self.conv1(x))


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
