"""Found by the importer's fuzz test (tests/model_fuzz.py): ``sigmoid(y) * tanh(y)`` right on a convolution's output
(two functions of it, which no ``by: producer`` reading takes), once with the output also returned: an expression."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv1d(3, 4, 3, stride=2)
        self.p = nn.Parameter(torch.randn(6, 1))

    def forward(self, x):
        y = self.conv(x)
        r = y
        y = torch.sigmoid(y) * torch.tanh(y)
        y = y + self.p
        z = self.conv2(x)
        z = torch.sigmoid(z) * torch.tanh(z) - 0.5
        return y, r, z


def get_inputs():
    return [torch.randn(3, 3, 17)]


def get_init_inputs():
    return []
