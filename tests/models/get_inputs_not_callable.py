"""get_inputs a list, not the function the convention names: said not callable, not missing."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


get_inputs = [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
