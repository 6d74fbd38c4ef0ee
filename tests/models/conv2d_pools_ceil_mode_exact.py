"""Pools as ResNet-D and GoogLeNet write them, at sizes where ceil_mode=True adds no window (the kernels pool them
as floor mode at the config's shape, the model running PyTorch's forward at any other): AvgPool2d(2, 2,
ceil_mode=True, count_include_pad=False) on an even size (no padding: the two counts agree), MaxPool2d(3, 2,
ceil_mode=True) on 13; and a MaxPool2d(3, 2, ceil_mode=True) on 14, whose partial last window makes it PyTorch's
pool, after its chain's fused region. Three chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.down = nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)
        self.conv2 = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(3, 6, 2)

    def forward(self, x):
        a = self.down(F.relu(self.conv1(x)))
        b = F.max_pool2d(torch.tanh(self.conv2(x[:, :, :13, :13])), 3, 2, ceil_mode=True)
        c = self.pool(torch.sigmoid(self.conv3(x[:, :, :15, :15])))
        return a.sum() + b.sum() + c.sum()


def get_inputs():
    return [torch.randn(2, 3, 16, 14)]


def get_init_inputs():
    return []
