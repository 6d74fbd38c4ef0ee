"""Options a user passes that the vocabulary does not take, each said: AdaptiveAvgPool2d((None, 1)) (CoordAttention),
softmax(dtype=), max_pool2d(return_indices=True), torch.max(x, 1)[1] and .max(1).indices; what it takes:
AdaptiveMaxPool2d(3) on 7 x 9 (uneven windows), divisor_override, a dilated max pool, F.normalize(p=1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 4, 3) for _ in range(9)])
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.amp = nn.AdaptiveMaxPool2d(3)
        self.div = nn.AvgPool2d(3, stride=2, divisor_override=2)

    def forward(self, x):
        c = [conv(x) for conv in self.convs]
        a = torch.relu(self.pool_h(c[0]))
        b = torch.sigmoid(self.amp(c[1]))
        d = torch.tanh(self.div(c[2]))
        e = F.max_pool2d(c[3], 3, 2, 1, dilation=2).relu()
        f = torch.max(torch.relu(c[4]), 1)[1]
        g = torch.relu(c[5]).max(1).indices
        h = F.softmax(c[6], dim=1, dtype=torch.float64)
        i, idx = F.max_pool2d(torch.relu(c[7]), 2, return_indices=True)
        j = F.normalize(torch.relu(c[8]), p=1.0, dim=1)
        return a, b, d, e, f, g, h, i, idx, j


def get_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_init_inputs():
    return []
