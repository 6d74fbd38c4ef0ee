"""Found by the importer's fuzz test (tests/model_fuzz.py): ``torch.sigmoid(input=x)`` (no positional argument) on a
convolution's output that the model also returns; the walk's check for a channel layer norm written out read each
reader's first positional argument and failed (IndexError), leaving the convolution without a chain."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3, 2, 2, 2) * 0.3)
        self.conv_bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        x = F.conv_transpose3d(x, self.weight, self.conv_bias)
        r = x
        x = torch.sigmoid(input=x)
        x = torch.logsumexp(x, dim=[2, 3, 4])
        x = F.relu(x, inplace=True)
        return x, r


def get_inputs():
    return [torch.randn(2, 3, 3, 4, 5)]


def get_init_inputs():
    return []
