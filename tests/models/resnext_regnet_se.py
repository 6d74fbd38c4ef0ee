"""torchvision's ResNeXt Bottleneck (groups=32, width_per_group=4 scaled down: groups 4 here for size, but the grouped
3x3 as written there), and RegNet's ResBottleneckBlock with its SqueezeExcitation (ReLU inside, as RegNet's
``SqueezeExcitation(width, width_se_out, activation=nn.ReLU)``), both with the downsampling shortcut. Eval mode."""
import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels, squeeze_channels):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Sigmoid()

    def forward(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        scale = self.scale_activation(scale)
        return scale * input


class ResBottleneckBlock(nn.Module):
    """RegNet's: proj shortcut (conv-BN) where the shape changes, f = a (1x1) b (grouped 3x3) se c (1x1, BN no act)."""

    def __init__(self, width_in, width_out, stride, group_width, se_ratio):
        super().__init__()
        self.proj = None
        if width_in != width_out or stride != 1:
            self.proj = nn.Sequential(nn.Conv2d(width_in, width_out, 1, stride, bias=False), nn.BatchNorm2d(width_out))
        g = width_out // group_width
        self.f = nn.Sequential()
        self.f.add_module("a", nn.Sequential(nn.Conv2d(width_in, width_out, 1, bias=False), nn.BatchNorm2d(width_out),
                                             nn.ReLU(inplace=True)))
        self.f.add_module("b", nn.Sequential(nn.Conv2d(width_out, width_out, 3, stride, 1, groups=g, bias=False),
                                             nn.BatchNorm2d(width_out), nn.ReLU(inplace=True)))
        self.f.add_module("se", SqueezeExcitation(width_out, int(round(se_ratio * width_in))))
        self.f.add_module("c", nn.Sequential(nn.Conv2d(width_out, width_out, 1, bias=False), nn.BatchNorm2d(width_out)))
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        if self.proj is not None:
            x = self.proj(x) + self.f(x)
        else:
            x = x + self.f(x)
        return self.activation(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        down = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.resnext = Bottleneck(16, 8, 2, down, groups=4, base_width=4 * 4)
        self.regnet1 = ResBottleneckBlock(32, 24, 1, 8, 0.25)
        self.regnet2 = ResBottleneckBlock(24, 24, 1, 8, 0.25)
        self.eval()

    def forward(self, x):
        return self.regnet2(self.regnet1(self.resnext(x)))


def get_inputs():
    return [torch.randn(2, 16, 13, 11)]


def get_init_inputs():
    return []
