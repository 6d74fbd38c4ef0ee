"""Conv2d, torch.nn.functional.hardtanh with its bounds by keyword, F.softmax(x, dim=1), then
torch.mean(x, dim=[2, 3], keepdim=True) (a list of dims)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, hardtanh_min, hardtanh_max):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.hardtanh_min = hardtanh_min
        self.hardtanh_max = hardtanh_max

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.hardtanh(x, min_val=self.hardtanh_min, max_val=self.hardtanh_max)
        x = F.softmax(x, dim=1)
        x = torch.mean(x, dim=[2, 3], keepdim=True)
        return x


batch_size = 2
in_channels = 3
out_channels = 6
height, width = 7, 10
kernel_size = 3
hardtanh_min = -0.5
hardtanh_max = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, hardtanh_min, hardtanh_max]
