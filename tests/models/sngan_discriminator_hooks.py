"""An SNGAN-style discriminator as the GAN code bases write it: convolutions wrapped in ``torch.nn.utils.spectral_norm``
(a forward pre-hook that recomputes ``conv.weight`` from weight_orig at each call) and in
``torch.nn.utils.parametrizations.spectral_norm`` (ParametrizedConv2d), LeakyReLU(0.1), a plain last block, and a
user's forward hook that records a feature map (as feature-matching losses do). A module with forward hooks stays in
PyTorch (the fused chain would never call it); the plain convolutions are chains. Eval mode."""
import torch
import torch.nn as nn
from torch.nn.utils import parametrizations, spectral_norm


class DBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.c1 = spectral_norm(nn.Conv2d(cin, cout, 3, 1, 1))
        self.c2 = parametrizations.spectral_norm(nn.Conv2d(cout, cout, 4, 2, 1))
        self.act = nn.LeakyReLU(0.1)

    def forward(self, x):
        return self.act(self.c2(self.act(self.c1(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = DBlock(3, 8)
        self.conv = nn.Conv2d(8, 16, 3, 1, 1)
        self.bn = nn.BatchNorm2d(16)
        self.feat = nn.LeakyReLU(0.1)
        self.head = nn.Conv2d(16, 16, 3, 2, 1)
        self.out = nn.LeakyReLU(0.1)
        self.features = {}
        self.feat.register_forward_hook(self._keep)
        self.train()
        with torch.no_grad():
            for _ in range(2):  # a few power iterations, as training leaves them
                self(torch.randn(2, 3, 15, 13))
        self.features.clear()
        self.eval()

    def _keep(self, module, inputs, output):
        self.features["feat"] = output

    def forward(self, x):
        h = self.feat(self.bn(self.conv(self.block(x))))
        return self.out(self.head(h)).sum(dim=(2, 3))


def get_inputs():
    return [torch.randn(2, 3, 15, 13)]


def get_init_inputs():
    return []
