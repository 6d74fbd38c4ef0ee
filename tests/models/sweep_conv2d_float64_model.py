"""A float64 model: the kernels take float32, float16 and bfloat16, so its configs are float32, and say why."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.double()

    def forward(self, x):
        return torch.relu(self.conv(x)).amax(dim=1)


def get_inputs():
    return [torch.randn(2, 3, 10, 12, dtype=torch.float64)]


def get_init_inputs():
    return []
