"""timm-style optional layers left as nn.Identity() around a norm; a positional embedding of shape (1, C, H, W)
added after a convolution (no op of the vocabulary: the convolution's reason names it, through the Identity);
CLIP's QuickGELU x * sigmoid(1.702 * x) and a swish with beta x * sigmoid(x * 0.5) on the convolution's output."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, c, h, w):
        super().__init__()
        self.conv = nn.Conv2d(cin, c, 3, bias=False)
        self.norm = nn.BatchNorm2d(c)
        self.drop = nn.Identity()
        self.act = nn.ReLU()
        self.embed = nn.Conv2d(cin, c, 3, groups=cin)
        self.pre = nn.Identity()
        self.pos = nn.Parameter(torch.randn(1, c, h - 2, w - 2))
        self.quick = nn.Conv2d(cin, c, 1)
        self.beta = nn.Conv2d(cin, c, 3, padding=1)

    def forward(self, x):
        a = self.act(self.drop(self.norm(self.drop(self.conv(x)))))
        e = torch.relu(self.pre(self.embed(x)) + self.pos)
        q = self.quick(x)
        q = q * torch.sigmoid(1.702 * q)
        s = self.beta(x)
        return a, e, q, s * torch.sigmoid(s * 0.5)


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return [3, 6, 7, 9]
