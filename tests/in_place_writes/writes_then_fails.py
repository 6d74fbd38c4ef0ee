"""A forward that writes its buffer in place and then fails at some inputs (a width of 9): whichever run of
importer.trace_differs fails, the user's buffer is left as it was."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps.add_(1)
        if x.shape[-1] == 9:
            raise ValueError("a width of 9 is refused")
        return self.conv(x) + self.steps, self.steps


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
