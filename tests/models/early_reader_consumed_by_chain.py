"""A convolution's output read early outside its chain, and that read's value an operand of a later op of the chain
(an SE-style gate of the raw output, ``relu(y) * s`` with ``s = y.mean(...)``): an operand computed from the
convolution's output is none of a chain's, so the chain ends before that op anyway; where the read comes between two
ops of the chain, the chain is cut before it first (conv_a: conv -> relu, the tanh and the product in PyTorch). With
the gate's read first (conv_b), the chain starts at it, and the relu of the output, read before the sigmoid of the
gate, cuts it there: conv -> amax, the relu reading the output the chain returns."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv2d(4, 8, 3, padding=1)
        self.conv_b = nn.Conv2d(4, 8, 1)

    def forward(self, x):
        y = self.conv_a(x)
        z = torch.relu(y)
        s = y.mean((2, 3), keepdim=True)
        a = torch.tanh(z) * s
        w = self.conv_b(x)
        m = w.amax(1, keepdim=True)
        b = torch.relu(w) * torch.sigmoid(m)
        return a, b


def get_inputs():
    return [torch.randn(2, 4, 7, 10)]


def get_init_inputs():
    return []
