"""SRResNet's residual block in eval mode, PReLU three ways: nn.PReLU(C) (a slope per channel), nn.PReLU() (one slope)
after the residual add, and F.prelu(x, self.slope) on a model parameter of shape (C,). Three chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, c=6):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.act1 = nn.PReLU(c, init=0.2)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)
        self.act2 = nn.PReLU()
        self.conv3 = nn.Conv2d(c, 4, 3, stride=2)
        self.slope = nn.Parameter(torch.randn(4))
        self.eval()

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)))
        y = self.act2(self.bn2(self.conv2(y)) + x)
        return F.prelu(self.conv3(y), self.slope)


def get_inputs():
    return [torch.randn(2, 6, 10, 9)]


def get_init_inputs():
    return []
