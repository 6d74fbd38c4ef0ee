"""Conv2d -> GELU (tanh) -> MaxPool2d -> avg_pool2d: one chain of modules and functionals."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1)
        self.act = nn.GELU(approximate="tanh")
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        x = self.pool(self.act(self.conv(x)))
        return F.avg_pool2d(x, kernel_size=2, stride=1)


def get_inputs():
    return [torch.randn(2, 3, 12, 10)]


def get_init_inputs():
    return [3, 8]
