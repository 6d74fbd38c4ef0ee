# A model file saved in Latin-1, with no encoding declared: "café" in this comment is byte 0xe9, not UTF-8.
# Python refuses the file as source (python model.py: SyntaxError); importlib compiled it: the import refuses it.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
