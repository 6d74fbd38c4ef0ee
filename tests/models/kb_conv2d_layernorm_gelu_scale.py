"""KernelBench style: Conv2d (padding='same') -> nn.LayerNorm over (C, H, W) -> F.gelu -> * scaling_factor ->
torch.mean(x, dim=1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, height, width, scaling_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding='same')
        self.layer_norm = nn.LayerNorm((out_channels, height, width))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv(x)
        x = self.layer_norm(x)
        x = F.gelu(x)
        x = x * self.scaling_factor
        return torch.mean(x, dim=1)


batch_size = 2
in_channels = 3
out_channels = 5
height, width = 7, 9
kernel_size = 3
scaling_factor = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, height, width, scaling_factor]
