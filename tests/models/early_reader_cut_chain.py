"""A convolution's output read outside its chain before the chain's last value (issue 22): an SE-style squeeze of
the raw output, ``y.mean((2, 3), keepdim=True)``, written after the batch norm and relu but before the tanh. The
chain is cut before the tanh (conv -> batch_norm -> relu) and returns the convolution's output too (outputs: [chain,
producer]), which the mean reads; the tanh and the ops after it stay in PyTorch, reading the chain's value. The second
convolution's output is read by a sum over the channels between its first and second op: conv -> sigmoid."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1)
        self.bn = nn.BatchNorm2d(12)
        self.conv2 = nn.Conv2d(12, 6, 3)

    def forward(self, x):
        y = self.conv(x)
        h = torch.relu(self.bn(y))
        s = y.mean((2, 3), keepdim=True)
        h = torch.tanh(h * 0.5) + s
        w = self.conv2(h)
        g = torch.sigmoid(w)
        t = w.sum(1, keepdim=True)
        g = torch.clamp(g - 0.25, min=0.0)
        return g * t


def get_inputs():
    return [torch.randn(2, 3, 11, 9)]


def get_init_inputs():
    return []
