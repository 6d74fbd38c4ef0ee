"""A model and its input in channels_last (model.to(memory_format=torch.channels_last) in __init__, the example
input channels_last): the chains as in the contiguous layout."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 6, 3, groups=6)
        self.to(memory_format=torch.channels_last)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.nn.functional.hardswish(self.conv2(y)).mean((2, 3))


def get_inputs():
    return [torch.randn(2, 3, 9, 7).contiguous(memory_format=torch.channels_last)]


def get_init_inputs():
    return []
