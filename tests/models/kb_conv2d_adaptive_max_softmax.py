"""KernelBench style: F.conv2d on the module's own weight and bias -> F.adaptive_max_pool2d(x, (3, 3)) ->
torch.softmax(x, dim=1) -> x.sum(dim=[2, 3]) (every spatial dim) -> .unsqueeze(-1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size) * 0.2)
        self.bias = nn.Parameter(torch.randn(out_channels) * 0.1)

    def forward(self, x):
        x = F.conv2d(x, self.weight, self.bias, stride=1, padding=(1, 0))
        x = F.adaptive_max_pool2d(x, (3, 3))
        x = torch.softmax(x, dim=1)
        x = x.sum(dim=[2, 3])
        return x.unsqueeze(-1)


batch_size = 2
in_channels = 3
out_channels = 5
height, width = 12, 11
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
