"""KernelBench style: Conv2d -> F.relu(inplace=True) -> F.interpolate (not in the vocabulary) -> Conv2d -> x.sigmoid()
-> torch.cumsum (not in the vocabulary): two chains, each ending cleanly."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scale_factor):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size, stride=2)
        self.scale_factor = scale_factor

    def forward(self, x):
        x = F.relu(self.conv1(x), inplace=True)
        x = F.interpolate(x, scale_factor=self.scale_factor, mode='nearest')
        x = self.conv2(x).sigmoid()
        x = torch.cumsum(x, dim=1)
        return x


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 6, 5
kernel_size = 3
scale_factor = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale_factor]
