"""Conv2d, a scaling by a float attribute, torch.logsumexp(x, dim=1, keepdim=True) over the channels, then
torch.relu."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scaling_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv(x)
        x = x * self.scaling_factor
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.relu(x)
        return x


batch_size = 2
in_channels = 3
out_channels = 7
height, width = 10, 9
kernel_size = 3
scaling_factor = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scaling_factor]
