"""torch.export's trace (a loop over a size: torch.fx cannot trace it): nn.PReLU and nn.Dropout2d lifted as modules,
a cast to the same dtype (aten.to.dtype, and the metadata check export puts before it), square, rsqrt and 2 / y
(export's reciprocal and mul) lifted to their torch functions. One chain."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.act = nn.PReLU(6)
        self.drop = nn.Dropout2d(0.1)
        self.eval()

    def forward(self, x):
        for _ in range(x.shape[0]):
            x = x * 1.0
        y = self.act(self.conv(x))
        y = self.drop(y).to(x.dtype)
        y = torch.rsqrt(y.square() + 1.0)
        return 2.0 / y


def get_inputs():
    return [torch.randn(2, 3, 9, 8)]


def get_init_inputs():
    return []
