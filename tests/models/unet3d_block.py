"""A 3D UNet / V-Net decoder block (nnU-Net's stacked convs): ConvTranspose3d upsampling, concatenated with the
encoder's skip, then twice Conv3d, InstanceNorm3d (affine), LeakyReLU(0.01)."""
import torch
import torch.nn as nn

batch_size = 2
in_channels = 12
out_channels = 6
depth, height, width = 5, 7, 6


class Model(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.ConvTranspose3d(in_channels, out_channels, kernel_size=2, stride=2)
        self.conv1 = nn.Conv3d(2 * out_channels, out_channels, 3, padding=1)
        self.norm1 = nn.InstanceNorm3d(out_channels, eps=1e-5, affine=True)
        self.act1 = nn.LeakyReLU(negative_slope=0.01, inplace=True)
        self.conv2 = nn.Conv3d(out_channels, out_channels, 3, padding=1)
        self.norm2 = nn.InstanceNorm3d(out_channels, eps=1e-5, affine=True)
        self.act2 = nn.LeakyReLU(negative_slope=0.01, inplace=True)

    def forward(self, x, skip):
        x = torch.cat([self.up(x), skip], dim=1)
        x = self.act1(self.norm1(self.conv1(x)))
        return self.act2(self.norm2(self.conv2(x)))


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width),
            torch.randn(batch_size, out_channels, 2 * depth, 2 * height, 2 * width)]


def get_init_inputs():
    return [in_channels, out_channels]
