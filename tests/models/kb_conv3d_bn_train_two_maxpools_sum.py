"""KernelBench style (Conv3d_BatchNorm_MaxPool_MaxPool_Sum): Conv3d -> BatchNorm3d (train) -> two MaxPool3d in a
row -> torch.sum(x, dim=1, keepdim=True)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, eps, momentum):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm3d(out_channels, eps=eps, momentum=momentum)
        self.max_pool1 = nn.MaxPool3d(kernel_size=2)
        self.max_pool2 = nn.MaxPool3d(kernel_size=3)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = self.max_pool1(x)
        x = self.max_pool2(x)
        x = torch.sum(x, dim=1, keepdim=True)
        return x


batch_size = 2
in_channels = 3
out_channels = 4
depth, height, width = 6, 12, 13
kernel_size = 3
eps = 1e-5
momentum = 0.1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, eps, momentum]
