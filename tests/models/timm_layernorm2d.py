"""timm's (and torchvision's) LayerNorm2d: an nn.LayerNorm subclass whose forward permutes to channels last around
F.layer_norm over the channels (traced through); after a Conv2d(16 -> 20, k3, stride 2), then GELU."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm2d(nn.LayerNorm):
    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        return x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 20, 3, stride=2)
        self.norm = LayerNorm2d(20)
        with torch.no_grad():
            self.norm.weight.normal_()
            self.norm.bias.normal_()

    def forward(self, x):
        return F.gelu(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(2, 16, 17, 21)]


def get_init_inputs():
    return []
