"""A model of mixed dtypes: a float32 stem, then a body kept in float16, the value cast to each convolution's own
dtype (``.to(self.body.weight.dtype)``): each chain's config takes its convolution's dtype."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3)
        self.body = nn.Conv2d(8, 8, 3).half()

    def forward(self, x):
        y = torch.relu(self.stem(x))
        return torch.sigmoid(self.body(y.to(self.body.weight.dtype)))


def get_inputs():
    return [torch.randn(2, 3, 12, 13)]


def get_init_inputs():
    return []
