"""Calls by keyword: a Conv1d module called as ``self.conv(input=x)`` (tuple-of-one kernel, padding and stride), a
BatchNorm1d as ``self.bn(input=y)``, and ``F.conv1d(input=x, weight=self.w, bias=None, padding="same")``. Two chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, kernel_size=(3,), padding=(1,), stride=(2,))
        self.bn = nn.BatchNorm1d(6)
        self.w = nn.Parameter(torch.randn(6, 4, 3))
        self.eval()

    def forward(self, x):
        y = self.bn(input=self.conv(input=x))
        y = F.softplus(y, beta=2, threshold=10)
        z = F.conv1d(input=x, weight=self.w, bias=None, stride=1, padding="same")
        return y.relu().sum(dim=2) + z.tanh().mean(dim=2)


def get_inputs():
    return [torch.randn(2, 4, 15)]


def get_init_inputs():
    return []
