"""F.conv2d on a submodule's weights (named w, b) -> the submodule's BatchNorm2d (eval) -> relu -> + a registered
per-channel buffer of the model; the state lives at several depths, under names unlike the generated model's."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cout, cin, 3, 3) * 0.3)
        self.b = nn.Parameter(torch.randn(cout) * 0.1)
        self.bn = nn.BatchNorm2d(cout)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)


class Model(nn.Module):
    def __init__(self, cin=3, cout=6):
        super().__init__()
        self.block = Block(cin, cout)
        self.register_buffer("shift", torch.randn(cout, 1, 1))
        self.eval()

    def forward(self, x):
        x = F.conv2d(x, self.block.w, self.block.b, padding=1)
        return torch.relu(self.block.bn(x)) + self.shift


def get_inputs():
    return [torch.randn(2, 3, 9, 7)]


def get_init_inputs():
    return [3, 6]
