"""Negative dims throughout: Conv2d -> nn.Softmax2d (softmax over dim -3) -> x - x.mean(dim=(-1, -2), keepdim=True)
-> torch.max(x, dim=-1).values (to [N, C, H]) -> x.sum(-1) (to [N, C]); a second Conv2d -> logsumexp(dim=-3,
keepdim=True) -> x.mean(1, True) (positional keepdim). nn.Softmax2d is softmax over dim -3."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.softmax2d = nn.Softmax2d()
        self.conv2 = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.softmax2d(self.conv(x))
        y = y - y.mean(dim=(-1, -2), keepdim=True)
        y = torch.max(y, dim=-1).values
        y = y.sum(-1)
        z = torch.logsumexp(self.conv2(x), dim=-3, keepdim=True)
        z = z.mean(1, True)
        return y.sum() + z.sum()


def get_inputs():
    return [torch.randn(2, 3, 7, 6)]


def get_init_inputs():
    return []
