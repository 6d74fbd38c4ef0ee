"""An example input too small for the model: the pool's window is larger than the convolution's output. The fake
kernel's refusal (which torch logs with its own traceback) falls back to running the trace, whose error is the
import's, in one line."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.pool = nn.MaxPool2d(3, 2)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


def get_inputs():
    return [torch.randn(2, 3, 4, 5)]


def get_init_inputs():
    return []
