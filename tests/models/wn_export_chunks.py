"""Weight-normed convolutions (torch.nn.utils.parametrizations) applied to each chunk of the input in a Python loop
over ``list(x.chunk(2, 0))``, which torch.fx cannot trace: torch.export's trace, where the weight is
``aten._weight_norm`` on original1 / original0, computed from them at every call of each chunk's fused chain. A
spectral-normed convolution after it: torch.export traces through its parametrization too (eval mode's, without the
power iteration), which computes otherwise in training mode, so that convolution stays in PyTorch. Eval mode."""
import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = weight_norm(nn.Conv2d(cin, cout, 3, padding=1))
        self.sn = spectral_norm(nn.Conv2d(cout, cout, 1))
        with torch.no_grad():
            g = self.conv.parametrizations.weight.original0
            g.copy_(torch.rand_like(g) + 0.5)
        self.eval()

    def forward(self, x):
        out = []
        for part in list(x.chunk(2, 0)):
            out.append(torch.sigmoid(self.sn(torch.relu(self.conv(part)) * 0.5)))
        return torch.cat(out)


def get_inputs():
    return [torch.randn(4, 3, 9, 7)]


def get_init_inputs():
    return [3, 5]
