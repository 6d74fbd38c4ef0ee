"""torchvision's Inception-v3 BasicConv2d (conv, BN(eps=0.001), ``F.relu(x, inplace=True)``) and InceptionA
(1x1, 5x5, double 3x3 branches, ``F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)`` pool branch, torch.cat), and
DeepLabV3's ASPP (atrous 3x3 branches, ASPPPooling: AdaptiveAvgPool2d(1), conv, BN, ReLU, F.interpolate bilinear back;
project conv-BN-ReLU-Dropout). Eval mode."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicConv2d(nn.Module):
    def __init__(self, in_channels, out_channels, **kwargs):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        return F.relu(x, inplace=True)


class InceptionA(nn.Module):
    def __init__(self, in_channels, pool_features):
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 8, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 6, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(6, 8, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 8, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(8, 12, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(12, 12, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)

    def forward(self, x):
        branch1x1 = self.branch1x1(x)
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)
        branch_pool = self.branch_pool(branch_pool)
        return torch.cat([branch1x1, branch5x5, branch3x3dbl, branch_pool], 1)


class ASPPConv(nn.Sequential):
    def __init__(self, in_channels, out_channels, dilation):
        super().__init__(nn.Conv2d(in_channels, out_channels, 3, padding=dilation, dilation=dilation, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU())


class ASPPPooling(nn.Sequential):
    def __init__(self, in_channels, out_channels):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(in_channels, out_channels, 1, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU())

    def forward(self, x):
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class ASPP(nn.Module):
    def __init__(self, in_channels, atrous_rates, out_channels=8):
        super().__init__()
        modules = [nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
                                 nn.ReLU())]
        for rate in atrous_rates:
            modules.append(ASPPConv(in_channels, out_channels, rate))
        modules.append(ASPPPooling(in_channels, out_channels))
        self.convs = nn.ModuleList(modules)
        self.project = nn.Sequential(nn.Conv2d(len(self.convs) * out_channels, out_channels, 1, bias=False),
                                     nn.BatchNorm2d(out_channels), nn.ReLU(), nn.Dropout(0.5))

    def forward(self, x):
        _res = []
        for conv in self.convs:
            _res.append(conv(x))
        res = torch.cat(_res, dim=1)
        return self.project(res)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixed = InceptionA(5, 4)
        self.aspp = ASPP(32, [2, 3])
        self.eval()

    def forward(self, x):
        return self.aspp(self.mixed(x))


def get_inputs():
    return [torch.randn(2, 5, 11, 13)]


def get_init_inputs():
    return []
