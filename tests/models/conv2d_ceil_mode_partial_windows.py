"""Pools whose ceil_mode=True adds a partial last window at the traced sizes (and an average with padding and
count_include_pad=False): each joins its chain as PyTorch's own pool, run after the fused region inside ModelNew
(the kernels pool whole windows in floor mode); what follows it may be a later region."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.conv2 = nn.Conv2d(3, 5, 3)

    def forward(self, x):
        a = self.pool(self.conv(x)).relu()
        b = F.avg_pool2d(torch.tanh(self.conv2(x)), 3, 2, padding=1, ceil_mode=True, count_include_pad=False) * 2
        return a.sum() + b.sum()


def get_inputs():
    return [torch.randn(2, 3, 12, 11)]


def get_init_inputs():
    return []
