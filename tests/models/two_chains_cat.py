"""Two chains separated by torch.cat: Conv2d -> relu -> *2, cat with the input, Conv2d -> sigmoid -> sum."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 5, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3)

    def forward(self, x):
        y = self.conv1(x).relu() * 2.0
        y = torch.cat([y, x], dim=1)
        y = torch.sigmoid(self.conv2(y))
        return torch.sum(y, dim=1)


def get_inputs():
    return [torch.randn(2, 3, 10, 10)]


def get_init_inputs():
    return []
