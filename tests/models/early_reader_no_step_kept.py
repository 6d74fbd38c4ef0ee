"""A convolution's output read outside its chain before even the chain's first value: torch.max(w, 1)'s values taken
(``r[0]``) after the other read, and tanh's value renamed (``.contiguous()``) after it. No prefix of the chain ends
before that read, so each convolution stays in PyTorch, said (the fused chain returns the convolution's output at its
end). The third convolution's output is read after its first op's value: that chain is cut to conv -> relu."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv2d(3, 6, 3)
        self.conv_b = nn.Conv2d(3, 6, 3)
        self.conv_c = nn.Conv2d(3, 6, 3)

    def forward(self, x):
        w = self.conv_a(x)
        r = torch.max(w, 1, keepdim=True)
        m = w * 3
        a = torch.sigmoid(r[0])
        v = self.conv_b(x)
        u = torch.tanh(v)
        n = v - 1
        u = torch.sigmoid(u.contiguous())
        c = self.conv_c(x)
        k = torch.relu(c)
        q = c.abs()
        k = torch.exp(k)
        return a, m, u, n, k, q


def get_inputs():
    return [torch.randn(2, 3, 9, 8)]


def get_init_inputs():
    return []
