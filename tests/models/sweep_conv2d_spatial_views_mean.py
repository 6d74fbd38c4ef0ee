"""Global pooling by views: x.flatten(2).mean(-1) (a global average pool, [N, C]); x.view(N, C, -1).amax(dim=2);
x[:, :, ::2, ::2] (a strided slice of space) then relu; torch.sum(x, (2, 3), keepdim=True) / (H * W), the product of
two shape reads, which goes with the chain (fusetune.optimize binds it: nothing left reading a node cut out)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3)
        self.c2 = nn.Conv2d(3, 5, 3)
        self.c3 = nn.Conv2d(3, 6, 3)
        self.c4 = nn.Conv2d(3, 7, 3)

    def forward(self, x):
        a = torch.tanh(self.c1(x)).flatten(2).mean(-1)
        y = self.c2(x)
        b = y.view(y.size(0), y.size(1), -1).amax(dim=2)
        c = torch.relu(self.c3(x)[:, :, ::2, ::2])
        z = torch.sigmoid(self.c4(x))
        d = torch.sum(z, (2, 3), keepdim=True) / (z.shape[2] * z.shape[3])
        return a.sum() + b.sum() + c.sum() + d.sum()


def get_inputs():
    return [torch.randn(2, 3, 9, 10)]


def get_init_inputs():
    return []
