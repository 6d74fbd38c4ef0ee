"""KernelBench style: Conv2d -> relu -> flatten -> torch.matmul (not in the vocabulary: the chain ends before it)
-> sigmoid in PyTorch."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, features, hidden):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.weight = nn.Parameter(torch.randn(features, hidden) * 0.1)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = x.view(x.size(0), -1)
        x = torch.matmul(x, self.weight)
        return torch.sigmoid(x)


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 7, 7
kernel_size = 3
features = out_channels * 5 * 5
hidden = 10


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, features, hidden]
