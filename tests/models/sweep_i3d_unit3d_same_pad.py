"""I3D's Unit3D (piergiaj/pytorch-i3d): TensorFlow 'SAME' padding computed from x.size() in the forward and applied
with F.pad, Conv3d without bias, BatchNorm3d(eps=0.001, momentum=0.01), relu. torch.fx cannot trace its if on a size;
torch.export's aten.pad is F.pad: the even pad (1 a side) is the first convolution's padding, the uneven one
of the strided second (0, 1) stays in PyTorch."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Unit3D(nn.Module):
    def __init__(self, cin, cout, kernel_shape=(1, 1, 1), stride=(1, 1, 1)):
        super().__init__()
        self.kernel_shape, self.stride = kernel_shape, stride
        self.conv3d = nn.Conv3d(cin, cout, kernel_shape, stride=stride, padding=0, bias=False)
        self.bn = nn.BatchNorm3d(cout, eps=0.001, momentum=0.01)

    def compute_pad(self, dim, s):
        if s % self.stride[dim] == 0:
            return max(self.kernel_shape[dim] - self.stride[dim], 0)
        return max(self.kernel_shape[dim] - (s % self.stride[dim]), 0)

    def forward(self, x):
        batch, channel, t, h, w = x.size()
        pad_t, pad_h, pad_w = self.compute_pad(0, t), self.compute_pad(1, h), self.compute_pad(2, w)
        pad = (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2, pad_t // 2, pad_t - pad_t // 2)
        x = F.pad(x, pad)
        return F.relu(self.bn(self.conv3d(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Unit3D(3, 4, (3, 3, 3), (1, 1, 1))
        self.b = Unit3D(4, 8, (3, 3, 3), (2, 2, 2))
        self.eval()

    def forward(self, x):
        return self.b(self.a(x))


def get_inputs():
    return [torch.randn(1, 3, 4, 9, 10)]


def get_init_inputs():
    return []
