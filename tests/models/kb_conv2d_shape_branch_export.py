"""Python control flow on a shape (``if x.shape[1] % 2 == 0``) and a loop over a size: torch.fx cannot trace
them, torch.export specializes them to the example's shapes (the importer's second way in)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        if x.shape[1] % 2 == 0:
            x = torch.relu(x)
        else:
            x = torch.tanh(x)
        x = torch.min(x, torch.tensor(2.0))  # a constant made in the forward (exported as a lifted tensor)
        for _ in range(x.size(0) // 2):
            x = x * self.scale
        return torch.amax(x, dim=1)


batch_size = 4
in_channels = 3
out_channels = 6
height, width = 8, 7
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
