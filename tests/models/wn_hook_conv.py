"""Convolutions whose weight a forward pre-hook computes, as older code bases write them: the old
``torch.nn.utils.weight_norm`` (WeightNorm: weight = torch._weight_norm(weight_v, weight_g, dim)) on a Conv1d and
a ConvTranspose1d, and ``torch.nn.utils.prune`` (weight = weight_orig * weight_mask; the bias pruned too) on a
Conv2d. Each hook's computation is known: the fused chain computes the weight from weight_v / weight_g or
weight_orig / weight_mask at every call."""
import warnings

import torch
import torch.nn as nn
from torch.nn.utils import prune, weight_norm


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        with warnings.catch_warnings():  # deprecated in favour of the parametrization: the old form is the point
            warnings.simplefilter("ignore", FutureWarning)
            self.conv = weight_norm(nn.Conv1d(channels, channels, 5, padding=2))
            self.up = weight_norm(nn.ConvTranspose1d(channels, 4, 3, stride=2), dim=1)
        self.image = nn.Conv2d(1, 6, 3, padding=1)
        prune.l1_unstructured(self.image, "weight", amount=0.4)
        prune.random_unstructured(self.image, "bias", amount=0.5)
        with torch.no_grad():
            self.conv.weight_g.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        y = torch.relu(self.up(y))
        return torch.sigmoid(self.image(y.unsqueeze(1))) * 2.0


def get_inputs():
    return [torch.randn(2, 6, 17)]


def get_init_inputs():
    return [6]
