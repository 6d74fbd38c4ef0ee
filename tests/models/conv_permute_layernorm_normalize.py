"""A layer norm over the channels written as a permute to channels last around one over the last dim:
nn.LayerNorm(C) in 2-D, then F.normalize over the channels; F.layer_norm(x, (C,), w, b, eps) in 3-D, then ReLU;
and a 1-D one without its affine (elementwise_affine=False)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv2 = nn.Conv2d(3, 12, 3, padding=1)
        self.ln = nn.LayerNorm(12, eps=1e-6)
        self.conv3 = nn.Conv3d(2, 6, 3)
        self.w = nn.Parameter(torch.randn(6))
        self.b = nn.Parameter(torch.randn(6))
        self.conv1 = nn.Conv1d(4, 5, 3)
        self.ln1 = nn.LayerNorm(5, elementwise_affine=False)

    def forward(self, x, v, t):
        y = self.ln(self.conv2(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = F.normalize(y, p=2.0, dim=1)
        z = self.conv3(v).permute(0, 2, 3, 4, 1)
        z = F.layer_norm(z, (6,), self.w, self.b, 1e-5).permute(0, 4, 1, 2, 3)
        s = self.ln1(self.conv1(t).permute(0, 2, 1)).permute(0, 2, 1)
        return y, F.relu(z), s


def get_inputs():
    return [torch.randn(2, 3, 11, 13), torch.randn(2, 2, 5, 6, 7), torch.randn(3, 4, 19)]


def get_init_inputs():
    return []
