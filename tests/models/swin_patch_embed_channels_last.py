"""Patch embeddings normalised in token layout: Swin's ``proj(x).permute(0, 2, 3, 1)`` -> LayerNorm(C) left
channels-last (then ``.view(n, h * w, c)``, which needs the tokens contiguous); SegFormer's OverlapPatchEmbed
(``_, _, H, W = x.shape``, ``flatten(2).transpose(1, 2)``, LayerNorm(C, eps=1e-6)) with a position embedding, dropout
and the reshape back to NCHW; wav2vec2's feature layer (Conv1d, ``transpose(1, 2)``, F.layer_norm over (C,) with the
model's weight and bias, ``transpose(1, 2)`` back); a video patch embedding (Conv3d, tokens, LayerNorm without
affine). Each a convolution -> channel_layer_norm chain, the views after it in PyTorch."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.swin = nn.Conv2d(3, 8, 4, stride=4)
        self.swin_norm = nn.LayerNorm(8)
        self.seg = nn.Conv2d(3, 8, 7, stride=4, padding=3)
        self.seg_norm = nn.LayerNorm(8, eps=1e-6)
        self.pos = nn.Parameter(torch.randn(1, 12, 8))
        self.drop = nn.Dropout(0.1)
        self.wav = nn.Conv1d(3, 6, 3, stride=2)
        self.wav_w = nn.Parameter(torch.rand(6) + 0.5)
        self.wav_b = nn.Parameter(torch.randn(6))
        self.vid = nn.Conv3d(3, 5, 2, stride=2)
        self.vid_norm = nn.LayerNorm(5, elementwise_affine=False)
        with torch.no_grad():  # the norms' parameters moved off identity
            for norm in (self.swin_norm, self.seg_norm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_()

    def forward(self, x, a, v):
        s = self.swin_norm(self.swin(x).permute(0, 2, 3, 1))
        n, h, w, c = s.shape
        s = s.view(n, h * w, c)
        t = self.seg(x)
        _, _, hh, ww = t.shape
        t = self.seg_norm(t.flatten(2).transpose(1, 2))
        t = self.drop(t + self.pos)
        t = t.transpose(1, 2).reshape(n, -1, hh, ww)
        u = F.layer_norm(self.wav(a).transpose(1, 2), (6,), self.wav_w, self.wav_b, 1e-5).transpose(1, 2)
        z = self.vid_norm(self.vid(v).flatten(2).transpose(1, 2))
        return s, t, u, z


def get_inputs():
    return [torch.randn(2, 3, 13, 11), torch.randn(2, 3, 17), torch.randn(2, 3, 4, 6, 6)]


def get_init_inputs():
    return []
