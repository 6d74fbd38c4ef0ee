"""ConvTranspose3d -> BatchNorm3d in training mode -> Softplus -> AvgPool3d(padded) -> AdaptiveMaxPool3d(1) -> squeeze."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(3, 4, 2, stride=2)
        self.bn = nn.BatchNorm3d(4)
        self.softplus = nn.Softplus(beta=2.0, threshold=10.0)
        self.avg = nn.AvgPool3d(3, stride=2, padding=1)
        self.gmp = nn.AdaptiveMaxPool3d(1)

    def forward(self, x):
        x = self.gmp(self.avg(self.softplus(self.bn(self.up(x)))))
        return x.squeeze(-1).squeeze(-1)


def get_inputs():
    return [torch.randn(2, 3, 3, 4, 5)]


def get_init_inputs():
    return []
