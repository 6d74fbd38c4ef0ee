"""timm's Conv2dSame (TensorFlow SAME padding computed with math.ceil on x.size(): torch.export traces it; the even
pad folds into the stride-1 convolution, the uneven one before the stride-2 convolution stays in PyTorch) and a
Conv2d subclass calling self._conv_forward on a scaled weight."""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_same_padding(x: int, k: int, s: int, d: int):
    return max((math.ceil(x / s) - 1) * s + (k - 1) * d + 1 - x, 0)


def pad_same(x, k, s, d=(1, 1), value=0):
    ih, iw = x.size()[-2:]
    pad_h, pad_w = get_same_padding(ih, k[0], s[0], d[0]), get_same_padding(iw, k[1], s[1], d[1])
    if pad_h > 0 or pad_w > 0:
        x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2], value=value)
    return x


class Conv2dSame(nn.Conv2d):
    """timm's Conv2dSame: TensorFlow's 'SAME' padding computed from the input's size."""

    def forward(self, x):
        x = pad_same(x, self.kernel_size, self.stride, self.dilation)
        return F.conv2d(x, self.weight, self.bias, self.stride, (0, 0), self.dilation, self.groups)


class ScaledConv(nn.Conv2d):
    def forward(self, x):
        return self._conv_forward(x, self.weight * 0.5, self.bias)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.s1 = Conv2dSame(3, 6, 3, stride=1)
        self.s2 = Conv2dSame(6, 6, 3, stride=2)
        self.bn = nn.BatchNorm2d(6)
        self.sc = ScaledConv(6, 4, 3, padding=1)

    def forward(self, x):
        x = F.silu(self.s1(x))
        x = F.silu(self.bn(self.s2(x)))
        return torch.tanh(self.sc(x))


def get_inputs():
    return [torch.randn(2, 3, 9, 12)]


def get_init_inputs():
    return []
