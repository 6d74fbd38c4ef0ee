"""A model with a bug of its own: the second convolution expects 8 channels, the first gives 6. The import fails
cleanly (exit 2, nothing written), naming the node that failed and PyTorch's own error, without torch's traceback."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


def get_inputs():
    return [torch.randn(2, 3, 9, 7)]


def get_init_inputs():
    return []
