"""F.threshold / nn.Threshold (older code's ReLU): x where x > t, else v. F.threshold(x, 0.0, 0.0) is relu,
nn.Threshold(0.5, 0.5) is clamp(min=0.5), torch.threshold(x, -1.0, -1.0) clamp(min=-1); nn.Threshold(0.1, 0.0)
jumps at 0.1: the op threshold."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)
        self.b = nn.Conv2d(3, 4, 1)
        self.thr = nn.Threshold(0.5, 0.5)
        self.jump = nn.Threshold(0.1, 0.0)

    def forward(self, x):
        y = F.threshold(self.a(x), 0.0, 0.0)
        y = torch.threshold(self.thr(y) * 2.0 - 2.5, -1.0, -1.0)
        return y, self.jump(self.b(x))


def get_inputs():
    return [torch.randn(2, 3, 6, 7)]


def get_init_inputs():
    return []
