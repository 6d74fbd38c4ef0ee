"""A small ResNet in eval mode: a stem (conv, batch norm, relu, max pool) and two stages of basic blocks,
the second strided with a 1x1 downsampling shortcut, the first twice (its second copy's chains are the same
problems at the same shapes as its first's). Eight chains, six distinct: what optimize's budget tests share."""
import torch.nn as nn
import torch


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + identity)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1 = Block(8, 8, 1)
        self.layer1b = Block(8, 8, 1)
        self.layer2 = Block(8, 16, 2)

    def forward(self, x):
        return self.layer2(self.layer1b(self.layer1(self.stem(x))))


def get_inputs():
    return [torch.randn(2, 3, 18, 18)]


def get_init_inputs():
    return []
