"""KernelBench style (Conv2d_ReLU_HardSwish): hardswish written as x * torch.clamp((x + 3) / 6, 0, 1) after a
ReLU, a doubling written x + x, then a second convolution straight after the first chain's last op."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.conv_out = nn.Conv2d(out_channels, out_channels, 1, bias=False)

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x * torch.clamp((x + 3) / 6, 0, 1)
        x = x + x
        x = self.conv_out(x)
        return torch.sigmoid(x)


batch_size = 2
in_channels = 3
out_channels = 5
height, width = 10, 9
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
