"""Two branches of the input, each Conv2d -> ReLU -> MaxPool2d(2) -> GroupNorm -> + a registered per-channel
buffer (one for both), concatenated: the norm and the shift after the pool are a later region of each chain
(fusetune/pipeline.py), one problem for both (their convolutions differ, the pooled tensors, norms and shifts'
shapes do not); the shift is a buffer, not a Parameter, in the generated models' place of one."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout, groups):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(cin, cout, kernel_size=5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.gn1 = nn.GroupNorm(groups, cout)
        self.gn2 = nn.GroupNorm(groups, cout)
        self.register_buffer("shift", torch.randn(cout, 1, 1))

    def forward(self, x):
        a = self.gn1(self.pool(F.relu(self.conv1(x)))) + self.shift
        b = self.gn2(F.max_pool2d(torch.relu(self.conv2(x)), 2)) + self.shift
        return torch.cat([a, b], dim=1)


def get_inputs():
    return [torch.randn(2, 3, 13, 11)]


def get_init_inputs():
    return [3, 8, 4]
