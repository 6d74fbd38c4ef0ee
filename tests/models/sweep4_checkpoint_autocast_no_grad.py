"""Contexts real models wrap blocks in: torch.utils.checkpoint.checkpoint(self.block, x) in training mode,
torch.autocast(enabled=False) around the head, torch.no_grad() around the last one. Each block its chain."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3)
        self.block = Block(6)
        self.head = nn.Conv2d(6, 6, 1)
        self.tail = nn.Conv2d(6, 4, 1)
        self.use_checkpoint = True

    def forward(self, x):
        x = torch.relu(self.stem(x))
        if self.use_checkpoint and self.training:
            x = checkpoint(self.block, x, use_reentrant=False)
        else:
            x = self.block(x)
        with torch.autocast("cpu", enabled=False):
            y = torch.sigmoid(self.head(x))
        with torch.no_grad():
            z = torch.tanh(self.tail(y))
        return z


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
