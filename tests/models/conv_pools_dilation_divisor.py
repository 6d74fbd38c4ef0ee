"""Pool options PyTorch names and the vocabulary takes: MaxPool2d(3, 2, padding=1, dilation=2, ceil_mode=True) on 21 x
29 (ceil mode adds no window there), AvgPool2d(3, 2, padding=1, count_include_pad=False, divisor_override=4),
F.max_pool3d with dilation (1, 2, 2), and F.avg_pool3d(2, divisor_override=3). Four chains, each pool in its
config with its options."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 5, 3)
        self.pool = nn.MaxPool2d(3, 2, padding=1, dilation=2, ceil_mode=True)
        self.conv2 = nn.Conv2d(3, 6, 3)
        self.avg = nn.AvgPool2d(3, 2, padding=1, count_include_pad=False, divisor_override=4)
        self.conv3 = nn.Conv3d(2, 4, 3)
        self.conv4 = nn.Conv3d(2, 4, 2)

    def forward(self, x, v):
        a = self.pool(F.relu(self.conv1(x)))
        b = self.avg(F.gelu(self.conv2(x)))
        c = F.max_pool3d(torch.tanh(self.conv3(v)), (1, 2, 3), stride=(1, 2, 2), dilation=(1, 2, 2))
        d = F.avg_pool3d(torch.sigmoid(self.conv4(v)), 2, divisor_override=3)
        return a, b, c, d


def get_inputs():
    return [torch.randn(2, 3, 23, 31), torch.randn(2, 2, 7, 13, 11)]


def get_init_inputs():
    return []
