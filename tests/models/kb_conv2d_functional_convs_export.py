"""Functional convolutions on the model's parameters (F.conv2d, then F.conv_transpose2d) around a branch on a shape
(``if y.shape[-1] > 3``): torch.fx cannot trace it, torch.export does, and both convolutions start chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, mid_channels, out_channels):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(mid_channels, in_channels, 3, 3) * 0.2)
        self.bias = nn.Parameter(torch.randn(mid_channels))
        self.weight_t = nn.Parameter(torch.randn(mid_channels, out_channels, 2, 2) * 0.2)

    def forward(self, x):
        y = F.conv2d(x, self.weight, self.bias, padding=1)
        if y.shape[-1] > 3:
            y = torch.relu(y)
        z = F.conv_transpose2d(y, self.weight_t, stride=2)
        return torch.sigmoid(z)


batch_size = 2
in_channels = 3
mid_channels = 4
out_channels = 5
height, width = 7, 9


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, mid_channels, out_channels]
