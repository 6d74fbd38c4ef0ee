"""Conv2d -> Hardswish -> ELU -> MaxPool2d(ceil_mode=True), a partial last window at 7: the pool is PyTorch's,
after the fused region (the kernels pool whole windows in floor mode)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.pool = nn.MaxPool2d(2, ceil_mode=True)

    def forward(self, x):
        x = nn.functional.hardswish(self.conv(x))
        x = nn.functional.elu(x, alpha=0.5)
        return self.pool(x)


def get_inputs():
    return [torch.randn(2, 3, 9, 9)]


def get_init_inputs():
    return []
