"""An example input without its batch dim: Conv2d takes the 3-D tensor as one unbatched sample, the batch norm
after it fails. The error names the batch norm, then the convolution and the rank it expects."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv1(x)))


def get_inputs():
    return [torch.randn(3, 8, 8)]


def get_init_inputs():
    return []
