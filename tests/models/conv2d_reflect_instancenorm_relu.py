"""A style-transfer / CycleGAN block: a 3x3 convolution whose padding mirrors the input (padding_mode='reflect'),
then InstanceNorm2d(affine=True) and ReLU; and a strided one that repeats the edge (replicate) before a tanh."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, padding_mode="reflect")
        self.norm = nn.InstanceNorm2d(16, affine=True)
        self.down = nn.Conv2d(16, 8, 3, stride=2, padding=1, padding_mode="replicate", bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.conv(x)))
        return torch.tanh(self.down(x))


def get_inputs():
    return [torch.randn(2, 3, 19, 23)]


def get_init_inputs():
    return []
