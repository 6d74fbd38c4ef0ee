"""torchvision's ShuffleNetV2 InvertedResidual (``x1, x2 = x.chunk(2, dim=1)``, ``torch.cat((x1, self.branch2(x2)), 1)``,
channel_shuffle by view / transpose / contiguous / view), GhostNet's GhostModule (primary conv, cheap depthwise
operation, ``torch.cat([x1, x2], dim=1)[:, :self.oup, :, :]``), and CBAM's spatial attention
(``torch.cat((torch.max(x, 1)[0].unsqueeze(1), torch.mean(x, 1).unsqueeze(1)), dim=1)``, conv 7x7, BN, sigmoid,
``x * scale``). Eval mode."""
import math

import torch
import torch.nn as nn


def channel_shuffle(x, groups):
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    x = x.view(batchsize, num_channels, height, width)
    return x


class ShuffleUnit(nn.Module):
    def __init__(self, inp, oup):
        super().__init__()
        branch_features = oup // 2
        self.branch2 = nn.Sequential(
            nn.Conv2d(branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(branch_features, branch_features, 3, 1, 1, groups=branch_features, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        out = torch.cat((x1, self.branch2(x2)), dim=1)
        return channel_shuffle(out, 2)


class GhostModule(nn.Module):
    def __init__(self, inp, oup, kernel_size=1, ratio=2, dw_size=3, stride=1, relu=True):
        super().__init__()
        self.oup = oup
        init_channels = math.ceil(oup / ratio)
        new_channels = init_channels * (ratio - 1)
        self.primary_conv = nn.Sequential(
            nn.Conv2d(inp, init_channels, kernel_size, stride, kernel_size // 2, bias=False),
            nn.BatchNorm2d(init_channels),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )
        self.cheap_operation = nn.Sequential(
            nn.Conv2d(init_channels, new_channels, dw_size, 1, dw_size // 2, groups=init_channels, bias=False),
            nn.BatchNorm2d(new_channels),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )

    def forward(self, x):
        x1 = self.primary_conv(x)
        x2 = self.cheap_operation(x1)
        out = torch.cat([x1, x2], dim=1)
        return out[:, :self.oup, :, :]


class SpatialGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.spatial = nn.Sequential(nn.Conv2d(2, 1, 7, 1, 3, bias=False), nn.BatchNorm2d(1, eps=1e-5, momentum=0.01))

    def forward(self, x):
        x_compress = torch.cat((torch.max(x, 1)[0].unsqueeze(1), torch.mean(x, 1).unsqueeze(1)), dim=1)
        x_out = self.spatial(x_compress)
        scale = torch.sigmoid(x_out)
        return x * scale


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.shuffle = ShuffleUnit(8, 8)
        self.ghost = GhostModule(8, 11)
        self.gate = SpatialGate()
        self.eval()

    def forward(self, x):
        return self.gate(self.ghost(self.shuffle(x)))


def get_inputs():
    return [torch.randn(2, 8, 13, 10)]


def get_init_inputs():
    return []
