"""KernelBench-style custom pointwise forms, each after an op (so the chain's value, read twice, is not the
convolution's output): x * torch.sigmoid(x + 3) / 6, x * torch.tanh(x) and CLIP's QuickGELU x * torch.sigmoid(1.702
* x), no activation of the vocabulary, imported as expressions, each the value's whole pointwise run: x *
sigmoid(x + 3) / 6 (the parameter's scale ends it), x * tanh(x) with the relu after it, and the QuickGELU with
torch.sigmoid(x) * x * 2.0 and x / (1 + torch.exp(-x)) - 0.5 after it (x read 8 times), the chain going on after
each. Then x * torch.where(x > 0, 1.0, 0.5) + x, which no expression writes (a comparison): the chain ends there."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.norm = nn.GroupNorm(num_groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size, padding=1)
        self.scale = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.5 + 1.0)

    def forward(self, x):
        x = self.conv(x)
        x = self.norm(x)
        x = x * torch.sigmoid(x + 3) / 6
        x = x * self.scale
        x = x * torch.tanh(x)
        x = torch.relu(x)
        y = self.conv2(x) - 0.25
        y = y * torch.sigmoid(1.702 * y)
        y = torch.sigmoid(y) * y * 2.0
        y = y / (1 + torch.exp(-y)) - 0.5
        y = y.max(dim=1, keepdim=True)[0]
        return y * torch.where(y > 0, 1.0, 0.5) + y


batch_size = 2
in_channels = 3
out_channels = 16
height, width = 13, 11
kernel_size = 3
num_groups = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
