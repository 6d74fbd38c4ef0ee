"""ECAPA-TDNN's TDNN block (Conv1d, ReLU, BatchNorm1d: the norm after the activation) and its 1-D squeeze-excitation:
s = x.mean(dim=2, keepdim=True), conv1d-ReLU-conv1d-sigmoid, x * s; the block's residual add. The map names why the
mean and the multiply stay in PyTorch: they read the value where chain1 ends (read by both)."""
import torch
import torch.nn as nn


class TDNNBlock(nn.Module):
    def __init__(self, cin, cout, k, dilation=1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, dilation=dilation, padding=dilation * (k - 1) // 2)
        self.activation = nn.ReLU()
        self.norm = nn.BatchNorm1d(cout)

    def forward(self, x):
        return self.norm(self.activation(self.conv(x)))


class SEBlock(nn.Module):
    def __init__(self, c, se_c):
        super().__init__()
        self.conv1 = nn.Conv1d(c, se_c, 1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv1d(se_c, c, 1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        s = x.mean(dim=2, keepdim=True)
        s = self.relu(self.conv1(s))
        s = self.sigmoid(self.conv2(s))
        return s * x


class Model(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.tdnn1 = TDNNBlock(c, c, 1)
        self.tdnn2 = TDNNBlock(c, c, 3, dilation=2)
        self.se = SEBlock(c, 4)

    def forward(self, x):
        residual = x
        x = self.tdnn2(self.tdnn1(x))
        return self.se(x) + residual


def get_inputs():
    return [torch.randn(2, 8, 15)]


def get_init_inputs():
    return []
