"""Functional convolutions whose weight and bias the forward computes from the model's tensors: a masked weight
(``self.weight * self.mask``, the mask a buffer), a weight normalised by hand (``w / w.norm(p=2, ...)``, the bias
doubled), a transposed convolution's weight scaled by exp of a 0-dim parameter. Each is computed from the model's
tensors at every call of its fused chain."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, 3, 3))
        self.bias = nn.Parameter(torch.randn(cout))
        self.register_buffer("mask", (torch.rand(cout, cin, 3, 3) > 0.3).float())
        self.w = nn.Parameter(torch.randn(cout, cin, 3, 3))
        self.b = nn.Parameter(torch.randn(cout))
        self.t = nn.Parameter(torch.randn(cin, cout, 2, 2))
        self.log_scale = nn.Parameter(torch.tensor(-0.5))

    def forward(self, x):
        y = torch.relu(F.conv2d(x, self.weight * self.mask, self.bias, padding=1))
        w = self.w / self.w.norm(p=2, dim=(1, 2, 3), keepdim=True)
        z = torch.sigmoid(F.conv2d(x, w, self.b * 2, stride=2))
        u = torch.tanh(F.conv_transpose2d(x, self.t * self.log_scale.exp(), None, stride=2))
        return y.sum() + z.sum() + u.sum()


def get_inputs():
    return [torch.randn(2, 4, 11, 9)]


def get_init_inputs():
    return [4, 5]
