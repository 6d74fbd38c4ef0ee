"""Near misses of a chain returning its convolution's output: a value of the chain after the convolution returned
beside it (the chain ends where that value is read twice, as ever), and the convolution's output read outside the
chain before the chain's last value (the fused chain hands the output back only at its end: the chain is cut before
that read, conv -> tanh, returning the output, which the product reads; the sigmoid after it stays in PyTorch)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv2d(3, 8, 3)
        self.conv_b = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        s = torch.sigmoid(self.conv_a(x))
        w = self.conv_b(x)
        u = torch.tanh(w)
        m = w * 3
        v = torch.sigmoid(u)
        return torch.tanh(s), s, v, m


def get_inputs():
    return [torch.randn(2, 3, 12, 10)]


def get_init_inputs():
    return []
