"""Gated activations after convolutions, in the forms models write them: F.glu, nn.GLU, chunk and split into
halves with a * sigmoid(b) and WaveNet's tanh(a) * sigmoid(b), and slices x[:, :C // 2] * sigmoid(x[:, C // 2:]);
after one, a (C/2, 1) parameter and a BatchNorm1d(C/2) of the halved channels."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin=5, hidden=14):
        super().__init__()
        self.a = nn.Conv1d(cin, hidden, 3, padding=1)
        self.b = nn.Conv1d(cin, hidden, 5, padding=2)
        self.c = nn.Conv2d(cin, hidden, 3)
        self.d = nn.Conv2d(cin, 2 * hidden, 1)
        self.e = nn.Conv1d(cin, hidden, 3)
        self.glu = nn.GLU(dim=1)
        self.f = nn.Conv1d(cin, hidden, 1)
        self.gain = nn.Parameter(torch.randn(hidden // 2, 1))
        self.bn = nn.BatchNorm1d(hidden // 2)

    def forward(self, x, y):
        u = self.a(x)
        first, second = u.chunk(2, dim=1)
        u = torch.relu(first * torch.sigmoid(second))
        v = self.b(x)
        v1, v2 = torch.split(v, v.shape[1] // 2, dim=1)
        v = torch.tanh(v1) * torch.sigmoid(v2)
        w = self.c(y)
        half = w.shape[1] // 2
        w = (w[:, :half] * torch.sigmoid(w[:, half:])).mean(dim=(2, 3))
        z = torch.softmax(self.glu(self.d(y)), dim=1)
        t = F.glu(self.e(x), dim=1) * 0.5
        s = self.bn(F.glu(self.f(x), dim=1) * self.gain)
        return u, v, w, z, t, s


def get_inputs():
    return [torch.randn(3, 5, 23), torch.randn(2, 5, 9, 11)]


def get_init_inputs():
    return [5, 14]
