"""A WaveNet residual block (van den Oord et al. 2016), as the common PyTorch ports write it: a dilated causal
Conv1d (left padding by F.pad) to twice the residual channels, the gated activation tanh(a) * sigmoid(b) of its
two halves, then 1x1 residual and skip convolutions."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
length = 53
residual_channels = 12
skip_channels = 18
dilation = 4
kernel_size = 2


class Model(nn.Module):
    def __init__(self, residual_channels, skip_channels, kernel_size, dilation):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.dilated = nn.Conv1d(residual_channels, 2 * residual_channels, kernel_size, dilation=dilation)
        self.res = nn.Conv1d(residual_channels, residual_channels, 1)
        self.skip = nn.Conv1d(residual_channels, skip_channels, 1)

    def forward(self, x):
        h = self.dilated(F.pad(x, (self.pad, 0)))
        filt, gate = torch.chunk(h, 2, dim=1)
        h = torch.tanh(filt) * torch.sigmoid(gate)
        skip = self.skip(h)
        out = (self.res(h) + x) * 0.7071067811865476
        return out, skip


def get_inputs():
    return [torch.randn(batch_size, residual_channels, length)]


def get_init_inputs():
    return [residual_channels, skip_channels, kernel_size, dilation]
