"""``r = x; x *= 3.0`` on a convolution's output (issue 22): eager multiplies the one tensor both names hold, so the
later ``tanh(x) - r`` reads the product twice; torch.fx records ``x * 3`` as a new tensor (its trace computes
``tanh(3y) - y``), torch.export records the write. The import takes torch.export's trace, where ``x.mul_(3.0)`` goes
on the chain as its op."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        r = x
        x *= 3.0
        x = torch.tanh(x) - r
        return torch.relu(x)


batch_size = 2
in_channels = 3
out_channels = 5
height, width = 9, 11
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
