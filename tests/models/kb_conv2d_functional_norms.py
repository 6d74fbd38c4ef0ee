"""Norms called as functions on the model's own tensors: F.group_norm(x, groups, self.gn_weight, self.gn_bias,
eps), F.instance_norm(x) without affine tensors, F.layer_norm over the trailing dims with a weight and a bias
kept as a buffer; each tensor binds by the user's attribute path. A weight without a bias stops the chain."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, groups, height, width):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.side = nn.Conv2d(in_channels, out_channels, 3)
        self.gn_weight = nn.Parameter(torch.rand(out_channels) + 0.5)
        self.gn_bias = nn.Parameter(torch.randn(out_channels))
        self.ln_weight = nn.Parameter(torch.rand(height - 2, width - 2) + 0.5)
        self.register_buffer("ln_bias", torch.randn(height - 2, width - 2))
        self.lone_weight = nn.Parameter(torch.rand(out_channels))
        self.groups = groups

    def forward(self, x):
        a = F.group_norm(self.conv(x), self.groups, self.gn_weight, self.gn_bias, eps=1e-3)
        a = F.instance_norm(torch.tanh(a))
        b = F.layer_norm(F.silu(self.side(x)), (height - 2, width - 2), self.ln_weight, self.ln_bias)
        b = F.group_norm(b * 2.0, 2, weight=self.lone_weight)
        return a.mean() + b.mean()


batch_size = 2
in_channels = 3
out_channels = 6
groups = 3
height, width = 7, 9


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, groups, height, width]
