"""Parametrizations a user registers (torch.nn.utils.parametrize.register_parametrization) on convolutions: one that
normalises each output channel's filter and a second stacked on it that scales by exp of a learned log-gain (the
importer traces into both: the weight is computed from the originals at every call); one that in training mode
updates a running scale buffer (in place) and spectral_norm's (whose power iteration writes u and v in training
mode): those two compute otherwise in training mode, so their convolutions stay modules of their own, in PyTorch,
with that reason in the map. Eval mode."""
import torch
import torch.nn as nn
from torch.nn.utils import parametrizations, parametrize


class UnitFilters(nn.Module):
    def forward(self, w):
        return w / w.flatten(1).norm(dim=1).view(-1, 1, 1, 1)


class Gain(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.log_gain = nn.Parameter(torch.randn(channels, 1, 1, 1) * 0.3)

    def forward(self, w):
        return w * self.log_gain.exp()


class RunningScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))

    def forward(self, w):
        if self.training:
            self.scale.mul_(0.9).add_(0.1 * w.detach().abs().mean())
        return w / self.scale


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.a = nn.Conv2d(cin, cout, 3, padding=1)
        parametrize.register_parametrization(self.a, "weight", UnitFilters())
        parametrize.register_parametrization(self.a, "weight", Gain(cout))
        self.b = nn.Conv2d(cout, cout, 3, padding=1)
        parametrize.register_parametrization(self.b, "weight", RunningScale())
        self.c = parametrizations.spectral_norm(nn.Conv2d(cout, cout, 1))
        self.eval()

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.tanh(self.b(y))
        return torch.sigmoid(self.c(y))


def get_inputs():
    return [torch.randn(2, 3, 10, 9)]


def get_init_inputs():
    return [3, 4]
