"""pytorch/examples' fast_neural_style TransformerNet pieces as written there: ConvLayer (``nn.ReflectionPad2d(k // 2)``
then an unpadded Conv2d), InstanceNorm2d(affine=True), ResidualBlock, UpsampleConvLayer (F.interpolate nearest, then a
ConvLayer); and the other ways code pads before an unpadded convolution: ReplicationPad2d with per-dim sizes,
ZeroPad2d, F.pad(mode="circular" / "reflect" / "replicate") before F.conv2d, nn.Conv2d and nn.Conv1d. An even pad
read by the convolution alone is the convolution's padding and padding_mode (the pad joins its chain); a
ConstantPad2d of 0.5 and ZeroPad2d((0, 1, 0, 1)) (TF's "same" at stride 2) stay in PyTorch. Eval mode."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvLayer(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super().__init__()
        reflection_padding = kernel_size // 2
        self.reflection_pad = nn.ReflectionPad2d(reflection_padding)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        out = self.reflection_pad(x)
        out = self.conv2d(out)
        return out


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in1 = nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in2 = nn.InstanceNorm2d(channels, affine=True)
        self.relu = nn.ReLU()

    def forward(self, x):
        residual = x
        out = self.relu(self.in1(self.conv1(x)))
        out = self.in2(self.conv2(out))
        out = out + residual
        return out


class UpsampleConvLayer(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, upsample=None):
        super().__init__()
        self.upsample = upsample
        reflection_padding = kernel_size // 2
        self.reflection_pad = nn.ReflectionPad2d(reflection_padding)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        x_in = x
        if self.upsample:
            x_in = F.interpolate(x_in, mode="nearest", scale_factor=self.upsample)
        out = self.reflection_pad(x_in)
        out = self.conv2d(out)
        return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = ConvLayer(3, 8, kernel_size=9, stride=1)
        self.in1 = nn.InstanceNorm2d(8, affine=True)
        self.conv2 = ConvLayer(8, 8, kernel_size=3, stride=2)
        self.in2 = nn.InstanceNorm2d(8, affine=True)
        self.res1 = ResidualBlock(8)
        self.deconv1 = UpsampleConvLayer(8, 8, kernel_size=3, stride=1, upsample=2)
        self.in4 = nn.InstanceNorm2d(8, affine=True)
        self.relu = nn.ReLU()
        self.rep = nn.Sequential(nn.ReplicationPad2d((2, 2, 1, 1)), nn.Conv2d(8, 8, (3, 5)))
        self.zero = nn.Sequential(nn.ZeroPad2d(1), nn.Conv2d(8, 8, 3, stride=2))
        self.const = nn.Sequential(nn.ConstantPad2d(1, 0.5), nn.Conv2d(8, 8, 3))
        self.uneven = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(8, 8, 3, stride=2))
        self.w = nn.Parameter(torch.randn(8, 8, 3, 3) * 0.1)
        self.c5 = nn.Conv2d(8, 8, 3)
        self.c6 = nn.Conv1d(8, 8, 3)
        self.eval()

    def forward(self, x):
        y = self.relu(self.in1(self.conv1(x)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.res1(y)
        y = self.relu(self.in4(self.deconv1(y)))
        y = torch.tanh(self.rep(y))
        y = torch.sigmoid(self.zero(y))
        z = F.pad(y, [1, 1, 1, 1], mode="circular")
        z = F.elu(F.conv2d(z, self.w, None, 1, 0))
        z = F.relu(self.c5(F.pad(z, (1, 1, 1, 1), "reflect")))
        u = torch.relu(self.const(z)).sum((2, 3)) + torch.relu(self.uneven(z)).mean((2, 3))
        v = torch.tanh(self.c6(F.pad(z.flatten(2), (1, 1), mode="replicate"))).mean(-1)
        return u + v


def get_inputs():
    return [torch.randn(2, 3, 14, 12)]


def get_init_inputs():
    return []
