"""out = y; out += b writes y in place (a tensor's += is in place): a later read of y reads the sum."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        out = y
        out += 1.0
        out = torch.tanh(out)
        return out + y


def get_inputs():
    return [torch.randn(2, 3, 6, 7)]


def get_init_inputs():
    return []
