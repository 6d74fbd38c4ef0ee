"""Found by the importer's fuzz test (tests/model_fuzz.py): an activation written out (a tanh GELU; relu as
masked_fill) right on a convolution's output that a residual also reads. The region takes the convolution's first
readers, the residual reads the convolution's output by name (by: producer)."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose2d(3, 5, 3, stride=2)
        self.conv2 = nn.Conv2d(3, 4, 3)
        self.act = nn.Softsign()

    def forward(self, x):
        y = self.conv(x)
        r = y
        y = 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))
        y = y * torch.sigmoid(y)
        y = r + y
        z = self.conv2(x)
        s = z.clone()
        z = z.masked_fill(z < 0, 0.0)
        z = self.act(z)
        return y, z * s


def get_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_init_inputs():
    return []
