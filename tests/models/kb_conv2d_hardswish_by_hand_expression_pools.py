"""KernelBench style: its hand-written hardswish with a sigmoid for the relu6, x * torch.sigmoid(x + 3) / 6 (no op
of the vocabulary; after a scale, so that the value it reads twice is not the convolution's output), imported whole
as one expression, / 6 included, then a max pool, which reads every value (the expression falls, then rises). A second convolution's value,
shifted, then y + torch.tanh(y) * 0.5, an expression that rises (fusetune/ops/expression.py proves it), and a max
pool, which then reads each window's largest raw value alone (tests/test_plan.py). A third's value through four
z * torch.tanh(z) in a row: x read 2, 4, 8, then 16 times, past the importer's EXPRESSION_MAX_READS, so the run is
an expression of the first three and one of the fourth."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size)
        self.conv3 = nn.Conv2d(out_channels, out_channels, 1)
        self.scale = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.5 + 1.0)

    def forward(self, x):
        x = self.conv(x) * self.scale
        x = x * torch.sigmoid(x + 3) / 6
        x = F.max_pool2d(x, 2)
        y = self.conv2(x) - 0.5
        y = y + torch.tanh(y) * 0.5
        y = F.max_pool2d(y, 2)
        z = self.conv3(y) * 0.5
        for _ in range(4):
            z = z * torch.tanh(z)
        return z


batch_size = 2
in_channels = 3
out_channels = 8
height, width = 22, 19
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
