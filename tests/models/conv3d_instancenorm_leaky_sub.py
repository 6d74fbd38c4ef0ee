"""Conv3d -> InstanceNorm3d(affine) -> LeakyReLU(0.2) -> 1.5 - x -> x / 4 -> logsumexp over channels."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 6, 3, padding=1)
        self.norm = nn.InstanceNorm3d(6, affine=True)
        self.act = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x):
        x = self.act(self.norm(self.conv(x)))
        x = 1.5 - x
        x = x / 4
        return torch.logsumexp(x, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(2, 2, 4, 5, 6)]


def get_init_inputs():
    return []
