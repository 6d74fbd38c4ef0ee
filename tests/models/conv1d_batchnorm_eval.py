"""Conv1d -> BatchNorm1d (eval mode) -> ReLU -> Dropout (eval: identity) -> AdaptiveAvgPool1d(1) -> flatten."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 5, stride=2, padding=2, bias=False)
        self.bn = nn.BatchNorm1d(8, eps=1e-3, momentum=0.05)
        self.drop = nn.Dropout(0.3)
        self.gap = nn.AdaptiveAvgPool1d(1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
        self.eval()

    def forward(self, x):
        x = self.drop(torch.relu(self.bn(self.conv(x))))
        return torch.flatten(self.gap(x), 1)


def get_inputs():
    return [torch.randn(2, 4, 33)]


def get_init_inputs():
    return []
