"""An example input without its batch dim, and nothing after the convolution that needs one: the forward runs
(PyTorch's Conv2d takes an unbatched sample), the kernels take batched inputs only. The convolution stays in
PyTorch with the rank it expects as the reason."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv1(x))


def get_inputs():
    return [torch.randn(3, 8, 8)]


def get_init_inputs():
    return []
