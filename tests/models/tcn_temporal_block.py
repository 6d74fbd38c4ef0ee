"""A TCN temporal block (Bai et al. 2018, locuslab/TCN): weight-normed dilated Conv1d padded on both sides,
Chomp1d dropping the right padding (x[:, :, :-chomp].contiguous()), ReLU, dropout, twice, then a 1x1 downsample of
the input as the residual, added, and a ReLU."""
import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import weight_norm

batch_size = 3
length = 41
n_inputs = 6
n_outputs = 10
kernel_size = 3
dilation = 2


class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, :-self.chomp_size].contiguous()


class Model(nn.Module):
    def __init__(self, n_inputs, n_outputs, kernel_size, dilation, dropout=0.2):
        super().__init__()
        padding = (kernel_size - 1) * dilation
        self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, padding=padding, dilation=dilation))
        self.chomp1 = Chomp1d(padding)
        self.relu1 = nn.ReLU()
        self.dropout1 = nn.Dropout(dropout)
        self.conv2 = weight_norm(nn.Conv1d(n_outputs, n_outputs, kernel_size, padding=padding, dilation=dilation))
        self.chomp2 = Chomp1d(padding)
        self.relu2 = nn.ReLU()
        self.dropout2 = nn.Dropout(dropout)
        self.net = nn.Sequential(self.conv1, self.chomp1, self.relu1, self.dropout1,
                                 self.conv2, self.chomp2, self.relu2, self.dropout2)
        self.downsample = nn.Conv1d(n_inputs, n_outputs, 1)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.net(x)
        return self.relu(out + self.downsample(x))


def get_inputs():
    return [torch.randn(batch_size, n_inputs, length)]


def get_init_inputs():
    return [n_inputs, n_outputs, kernel_size, dilation]
