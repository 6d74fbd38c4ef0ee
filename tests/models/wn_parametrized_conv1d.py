"""HiFi-GAN / MelGAN style blocks in their reference code's form: convolutions wrapped in
``torch.nn.utils.parametrizations.weight_norm`` (ParametrizedConv1d, ParametrizedConvTranspose1d: the weight is
torch._weight_norm(original1, original0, dim) at every access), each followed by a leaky relu; a weight-normed
Conv2d without bias (dim=None: one norm for the whole weight). The importer traces into the parametrization: each
convolution's weight is computed from original0 / original1 at every call of its fused chain."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm


class Model(nn.Module):
    def __init__(self, channels, up_channels):
        super().__init__()
        self.pre = weight_norm(nn.Conv1d(channels, channels, 7, padding=3))
        self.up = weight_norm(nn.ConvTranspose1d(channels, up_channels, 4, stride=2, padding=1))
        self.res = weight_norm(nn.Conv1d(up_channels, up_channels, 3, padding=2, dilation=2))
        self.image = weight_norm(nn.Conv2d(1, 3, 3, padding=1, bias=False), dim=None)
        with torch.no_grad():  # trained-looking magnitudes, not the initial norms of v
            for conv in (self.pre, self.up, self.res, self.image):
                g = conv.parametrizations.weight.original0
                g.copy_(torch.rand_like(g) + 0.5)

    def forward(self, x):
        y = F.leaky_relu(self.pre(x), 0.1)
        y = F.leaky_relu(self.up(y), 0.1)
        y = torch.tanh(self.res(y)) * 0.5
        z = torch.sigmoid(self.image(y.unsqueeze(1)))
        return z


def get_inputs():
    return [torch.randn(2, 6, 19)]


def get_init_inputs():
    return [6, 5]
