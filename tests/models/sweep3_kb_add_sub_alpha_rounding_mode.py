"""KernelBench level-2 style arithmetic by torch's keyword arguments: torch.sub(x, 1, alpha=0.5) (x - 0.5),
x.div(d, rounding_mode=None) (a true division by a (C, 1, 1, 1) parameter), F.hardtanh_, torch.max(x, 1).values; a
second chain torch.add(y, 0.5, alpha=2), torch.sub(self.b, y, alpha=0.5) (the chain's value on the right: mul -0.5
then add b), y.add(y, alpha=3) (mul 4), F.log_softmax(dim=1), y.sum(dim=(-2, -1), keepdim=True); a third stops at
torch.add(z, self.b, alpha=2) (alpha scaling a tensor operand is not in the vocabulary)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.d = nn.Parameter(torch.rand(4, 1, 1, 1) + 0.5)
        self.conv2 = nn.Conv2d(3, 5, 3, groups=1, padding="same", dilation=2, bias=False)
        self.b = nn.Parameter(torch.randn(5, 1, 1))
        self.conv3 = nn.Conv2d(3, 5, 1)

    def forward(self, x, s):
        x = self.conv(x)
        x = torch.sub(x, 1, alpha=0.5)
        x = x.div(self.d, rounding_mode=None)
        x = F.hardtanh_(x, -1.0, 1.0)
        x = torch.max(x, 1).values
        y = self.conv2(s)
        y = torch.add(y, 0.5, alpha=2)
        y = torch.sub(self.b, y, alpha=0.5)
        y = y.add(y, alpha=3)
        y = F.log_softmax(y, dim=1)
        y = y.sum(dim=(-2, -1), keepdim=True)
        z = torch.relu(self.conv3(s))
        z = torch.add(z, self.b, alpha=2)
        return x, y, z


def get_inputs():
    return [torch.randn(2, 3, 2, 6, 5), torch.randn(2, 3, 7, 6)]


def get_init_inputs():
    return []
