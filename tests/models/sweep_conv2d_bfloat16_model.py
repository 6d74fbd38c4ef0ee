"""A model kept in bfloat16 (its module cast in __init__, its inputs bfloat16): the import traces it in float32
on the CPU, and its configs take the model's dtype."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.GroupNorm(4, cout)
        self.to(torch.bfloat16)

    def forward(self, x):
        return torch.nn.functional.silu(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(2, 6, 11, 9, dtype=torch.bfloat16)]


def get_init_inputs():
    return [6, 16]
