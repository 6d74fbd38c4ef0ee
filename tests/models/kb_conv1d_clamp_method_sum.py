"""KernelBench style: Conv1d -> x.clamp(min=0.0) -> torch.clamp(x, min=0.0, max=1.0) -> * 3 -> torch.sum(x, dim=1)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super().__init__()
        self.conv1d = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride)

    def forward(self, x):
        x = self.conv1d(x)
        x = x.clamp(min=0.0)
        x = torch.clamp(x, min=0.0, max=1.0)
        x = x * 3
        x = torch.sum(x, dim=1)
        return x


batch_size = 3
in_channels = 4
out_channels = 6
length = 37
kernel_size = 5
stride = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride]
