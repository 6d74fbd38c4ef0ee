"""KernelBench style: nn.ReLU(inplace=True) on the convolution's output, which a residual add reads afterwards
(it reads the rectified values: the ReLU overwrote them); then a second convolution whose in-place ReLU is
harmless (nothing else reads its input) -> F.relu(x, inplace=True) -> x.view(x.size(0), -1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size, stride=2)

    def forward(self, x):
        y = self.conv1(x)
        z = self.relu(y)
        x = z + y
        x = self.conv2(x) * 0.5
        x = F.relu(x, inplace=True)
        return x.view(x.size(0), -1)


batch_size = 2
in_channels = 3
out_channels = 4
height, width = 9, 8
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
