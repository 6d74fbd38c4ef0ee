"""KernelBench style: Conv2d -> x * self.scale (nn.Parameter(torch.randn(out_channels, 1, 1))) -> avg pool ->
torch.logsumexp over channels (keepdim) -> torch.max(x, dim=1, keepdim=True)[0] -> x.view(x.size(0), -1)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, pool_kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scale = nn.Parameter(torch.randn(out_channels, 1, 1))
        self.avg_pool = nn.AvgPool2d(pool_kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = x * self.scale
        x = self.avg_pool(x)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.max(x, dim=1, keepdim=True)[0]
        x = x.view(x.size(0), -1)
        return x


batch_size = 2
in_channels = 3
out_channels = 6
height, width = 14, 12
kernel_size = 3
pool_kernel_size = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, pool_kernel_size]
