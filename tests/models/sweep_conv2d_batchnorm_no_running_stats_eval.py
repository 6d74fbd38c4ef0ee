"""BatchNorm2d(track_running_stats=False) and BatchNorm2d(affine=False) in eval mode: the first normalizes by the
batch's statistics even in eval (not in the vocabulary), then relu; the second by its running statistics, then
F.relu6. The first convolution has no chain: the map says so at its batch norm too."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)
        self.conv2 = nn.Conv2d(4, 6, 3)
        self.bn2 = nn.BatchNorm2d(6, affine=False)
        with torch.no_grad():
            self.bn2.running_mean.normal_()
            self.bn2.running_var.uniform_(0.5, 2.0)
        self.eval()

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return F.relu6(self.bn2(self.conv2(x)))


def get_inputs():
    return [torch.randn(3, 3, 9, 8)]


def get_init_inputs():
    return []
