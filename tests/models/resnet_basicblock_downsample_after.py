"""torchvision's BasicBlock, as written there: ``identity = x``, the two convolutions, then the downsampling shortcut
``identity = self.downsample(x)`` after them, ``out += identity``, ``out = self.relu(out)``. In graph order the
shortcut's convolution is the block's last: its chain takes the add (the main path's value, computed before it, is
its extra input) and the relu; where the block has no downsampling, the second convolution's chain does (the block's
input is its extra input). Eval mode, as the model would be served."""
import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = BasicBlock(8, 8)
        down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
        self.layer2 = BasicBlock(8, 16, 2, down)
        self.eval()

    def forward(self, x):
        return self.layer2(self.layer1(x))


def get_inputs():
    return [torch.randn(2, 8, 13, 11)]


def get_init_inputs():
    return []
