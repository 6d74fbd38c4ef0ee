"""A UNet decoder step as milesial/Pytorch-UNet writes it (``Up``: ConvTranspose2d(in, in // 2, 2, stride=2), F.pad
to the skip's size, ``torch.cat([x2, x1], dim=1)``, DoubleConv conv-BN-ReLU twice), its bilinear variant
(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)), an F.interpolate(nearest) step, and the 1x1
OutConv. Eval mode."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DoubleConv(nn.Module):
    def __init__(self, in_channels, out_channels, mid_channels=None):
        super().__init__()
        if not mid_channels:
            mid_channels = out_channels
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(mid_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, in_channels, out_channels, bilinear=True):
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = DoubleConv(in_channels, out_channels, in_channels // 2)
        else:
            self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diffY = x2.size()[2] - x1.size()[2]
        diffX = x2.size()[3] - x1.size()[3]
        x1 = F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])
        x = torch.cat([x2, x1], dim=1)
        return self.conv(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inc = DoubleConv(3, 8)
        self.down1 = Down(8, 16)
        self.down2 = Down(16, 32)
        self.up1 = Up(32, 16, bilinear=False)
        self.up2 = Up(24, 8, bilinear=True)
        self.side = nn.Conv2d(32, 12, 3, padding=1)
        self.outc = nn.Conv2d(8, 2, kernel_size=1)
        self.eval()

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        y = F.interpolate(F.relu(self.side(x3)), size=x.shape[-2:], mode="nearest")
        return self.outc(x + y[:, :8])


def get_inputs():
    return [torch.randn(2, 3, 18, 22)]


def get_init_inputs():
    return []
