"""torchvision's MobileNetV2 InvertedResidual, as written there: ``Conv2dNormActivation`` blocks (conv, BN, ReLU6 as
an nn.Sequential), the projection conv + BN, ``x + self.conv(x)`` where the stride is 1 and the channels match. Eval."""
import torch
import torch.nn as nn


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, in_planes, out_planes, kernel_size=3, stride=1, groups=1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden_dim, kernel_size=1))
        layers.extend([
            Conv2dNormActivation(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ])
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(3, 8, stride=2),
            InvertedResidual(8, 8, 1, 1),
            InvertedResidual(8, 12, 2, 6),
            InvertedResidual(12, 12, 1, 6),
        )
        self.eval()

    def forward(self, x):
        return self.features(x)


def get_inputs():
    return [torch.randn(2, 3, 19, 17)]


def get_init_inputs():
    return []
