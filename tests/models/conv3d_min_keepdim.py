"""Conv3d -> torch.min(x, dim=1, keepdim=True)[0] -> softmax over depth."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, kernel_size=3)

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, dim=1, keepdim=True)[0]
        return torch.softmax(x, dim=2)


def get_inputs():
    return [torch.randn(2, 3, 6, 7, 5)]


def get_init_inputs():
    return []
