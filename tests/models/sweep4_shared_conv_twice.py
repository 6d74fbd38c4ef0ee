"""One convolution module called twice (weight sharing, a siamese encoder): each call's chain binds the same
weights; a ModuleList of nn.Sequential blocks run in a loop; a chain's value through .contiguous() and
.view(N, -1)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, c):
        super().__init__()
        self.shared = nn.Conv2d(cin, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                                   nn.ReLU(inplace=True)) for _ in range(2)])

    def forward(self, a, b):
        x = torch.relu(self.shared(a))
        y = torch.sigmoid(self.shared(b))
        for block in self.blocks:
            x = block(x)
        z = self.bn(self.shared(a + b)).contiguous()
        return x.contiguous().view(x.size(0), -1), y, z.reshape(z.shape[0], -1)


def get_inputs():
    return [torch.randn(2, 3, 7, 9), torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return [3, 5]
