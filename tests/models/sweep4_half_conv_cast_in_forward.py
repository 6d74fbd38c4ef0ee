"""Mixed precision by hand: a convolution kept in float16 (.half() in __init__) on x.half(), its result .float().
The model runs; its trace, cast to float32 on the CPU, does not: the error says so."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.half_conv = nn.Conv2d(3, 4, 3).half()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        h = torch.relu(self.half_conv(x.half())).float()
        return torch.sigmoid(self.conv(h))


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
