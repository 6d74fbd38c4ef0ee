"""In-place forms (y.mul_(s), .relu_(), F.elu_) and powers by other names (torch.rsqrt, .square(), 2 / x,
torch.reciprocal) on a chain; and an in-place F.hardsigmoid whose input the multiply after it also reads
(b * hardsigmoid_(b) is hardsigmoid(b) squared, not hardswish: the multiply reads the write's result). Two chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 5, 3)

    def forward(self, x):
        y = self.conv(x).mul_(0.5)
        y = F.elu_(y.relu_())
        y = torch.rsqrt(y + 1.0).square()
        y = torch.reciprocal(2.0 / y)
        b = self.conv2(x) * 2.0
        s = F.hardsigmoid(b, inplace=True)
        return y.sum() + (b * s).mean()


def get_inputs():
    return [torch.randn(2, 3, 9, 8)]


def get_init_inputs():
    return []
