"""A softmax over every position of each channel written with views, as KernelBench writes it: the sizes read
off x.shape, x.view(b, c, d * h * w), softmax over the last dim, x.view(b, c, d, h, w) back (an unflatten),
then a per-channel scale; the shape's parts join the chain. A second convolution unflattens with x.unflatten
and nn.Unflatten."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, limit):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=1)
        self.side = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.scale = nn.Parameter(torch.rand(1, out_channels, 1, 1, 1) + 0.5)
        self.limit = limit
        self.split = nn.Unflatten(2, (2, -1))

    def forward(self, x):
        y = torch.clamp(self.conv(x), -self.limit, self.limit)
        b, c, d, h, w = y.shape
        y = y.view(b, c, d * h * w)
        y = torch.softmax(y, dim=-1)
        y = y.view(b, c, d, h, w)
        y = y * self.scale
        z = torch.flatten(torch.relu(self.side(x)), 2)
        z = self.split(torch.log_softmax(z, dim=2)).unflatten(3, (1, -1))
        return y.sum() + z.sum()


batch_size = 2
in_channels = 3
out_channels = 4
depth, height, width = 4, 5, 6
kernel_size = 3
limit = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, limit]
