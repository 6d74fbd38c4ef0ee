"""Causal convolutions padded unevenly by F.pad before an unpadded convolution: WaveNet / Demucs's
``F.pad(x, ((k - 1) * d, 0))`` then a dilated Conv1d, its halves gated by tanh * sigmoid; PixelCNN-style
``F.pad(x, (1, 0, 1, 0))`` then a 2x2 Conv2d and ELU; the same uneven pad before a stride-2 convolution (its windows
would not line up with an even padding's: the pad stays in PyTorch). The convolution takes the pad evenly (the larger
side) and the chain starts by cropping what the smaller side adds (slices)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, c=4, k=2, d=2):
        super().__init__()
        self.pad = (k - 1) * d
        self.causal = nn.Conv1d(c, 2 * c, k, dilation=d)
        self.masked = nn.Conv2d(3, 4, 2)
        self.strided = nn.Conv2d(3, 4, 3, stride=2)

    def forward(self, s, x):
        h = self.causal(F.pad(s, (self.pad, 0)))
        a, b = h.chunk(2, dim=1)
        g = torch.tanh(a) * torch.sigmoid(b)
        m = F.elu(self.masked(F.pad(x, (1, 0, 1, 0))))
        t = torch.relu(self.strided(F.pad(x, (0, 1, 0, 1))))
        return g, m, t


def get_inputs():
    return [torch.randn(2, 4, 11), torch.randn(2, 3, 7, 6)]


def get_init_inputs():
    return []
