"""Patch embeddings (ViT, Swin, PVT): a strided convolution, then x.flatten(2).transpose(1, 2) and a LayerNorm over
the channels of the tokens; Swin's x.permute(0, 2, 3, 1) then LayerNorm(C) left channels-last."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, c, patch):
        super().__init__()
        self.vit = nn.Conv2d(cin, c, patch, stride=patch)
        self.vit_norm = nn.LayerNorm(c)
        self.swin = nn.Conv2d(cin, c, patch, stride=patch)
        self.swin_norm = nn.LayerNorm(c)

    def forward(self, x):
        t = self.vit(x).flatten(2).transpose(1, 2)
        t = self.vit_norm(t)
        s = self.swin(x).permute(0, 2, 3, 1)
        s = self.swin_norm(s)
        return t, s


def get_inputs():
    return [torch.randn(2, 3, 13, 11)]


def get_init_inputs():
    return [3, 6, 4]
