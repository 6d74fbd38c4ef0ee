"""A detection backbone's stem: a convolution without bias, a FrozenBatchNorm2d (buffers only, folded into
x * scale + bias in its forward, as torchvision's and detectron2's are), ReLU. The class below stands in for
torchvision.ops.misc.FrozenBatchNorm2d (torchvision need not be installed): it says it is that class, as the
importer matches other packages' modules by module and class name without importing them."""
import torch
import torch.nn as nn


class FrozenBatchNorm2d(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


FrozenBatchNorm2d.__module__ = "torchvision.ops.misc"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = FrozenBatchNorm2d(16)
        with torch.no_grad():  # trained-looking statistics
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(2, 3, 19, 23)]


def get_init_inputs():
    return []
