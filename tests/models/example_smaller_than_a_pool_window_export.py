"""The same too-small example in a forward that branches on a size: torch.fx cannot trace it, torch.export's fake
run refuses the pool (torch logs it with its own traceback); the import says both reasons in one line."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.pool = nn.MaxPool2d(3, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if y.shape[-1] > 1:
            y = y * 2.0
        return self.pool(y)


def get_inputs():
    return [torch.randn(2, 3, 4, 5)]


def get_init_inputs():
    return []
