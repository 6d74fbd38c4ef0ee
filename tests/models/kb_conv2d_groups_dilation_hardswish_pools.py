"""KernelBench style: grouped, dilated Conv2d -> F.hardswish -> F.max_pool2d -> F.avg_pool2d with stride != kernel
-> x.relu()."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, dilation):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, groups=groups, dilation=dilation, padding=2)

    def forward(self, x):
        x = self.conv(x)
        x = F.hardswish(x)
        x = F.max_pool2d(x, kernel_size=2)
        x = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)
        return x.relu()


batch_size = 2
in_channels = 4
out_channels = 8
height, width = 13, 14
kernel_size = 3
groups = 2
dilation = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups, dilation]
