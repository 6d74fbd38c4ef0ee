"""Convolutions configured by string and mode: padding='same' (odd and even kernels, dilated), padding='valid',
padding_mode='circular' / 'replicate' / 'reflect' on the module itself."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.same = nn.Conv2d(3, 4, 3, padding="same")
        self.same_even = nn.Conv2d(3, 4, (2, 4), padding="same")
        self.same_dilated = nn.Conv1d(3, 4, 3, padding="same", dilation=2)
        self.valid = nn.Conv2d(3, 4, 3, padding="valid")
        self.circular = nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular")
        self.replicate = nn.Conv3d(3, 4, 3, padding=1, padding_mode="replicate")
        self.reflect = nn.Conv1d(3, 4, 3, padding=1, padding_mode="reflect")

    def forward(self, x, v):
        s = torch.relu(self.same(x))
        e = torch.tanh(self.same_even(x))
        d = torch.sigmoid(self.same_dilated(x.mean(2)))
        va = torch.relu(self.valid(x))
        c = torch.nn.functional.silu(self.circular(x))
        r = torch.relu(self.replicate(v))
        f = torch.tanh(self.reflect(x.mean(3)))
        return s, e, d, va, c, r, f


def get_inputs():
    return [torch.randn(2, 3, 7, 9), torch.randn(2, 3, 3, 5, 6)]


def get_init_inputs():
    return []
