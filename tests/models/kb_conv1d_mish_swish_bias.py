"""Conv1d, F.mish, x * torch.sigmoid(x), and a bias of shape (C, 1) then one of shape (1, C, 1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride)
        self.bias = nn.Parameter(torch.randn(out_channels, 1))
        self.shift = nn.Parameter(torch.randn(1, out_channels, 1))

    def forward(self, x):
        x = self.conv(x)
        x = F.mish(x)
        x = x * torch.sigmoid(x)
        x = x + self.bias
        x = x - self.shift
        return x


batch_size = 3
in_channels = 4
out_channels = 6
length = 23
kernel_size = 5
stride = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride]
