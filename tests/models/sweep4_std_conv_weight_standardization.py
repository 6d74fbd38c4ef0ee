"""Weight standardization as timm's StdConv2d writes it (F.batch_norm on the weight reshaped to (1, C_out, -1),
training=True) and by hand ((w - mean) / sqrt(var + eps)), each weight computed in the forward; BiT's
GroupNorm + ReLU after it."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class StdConv2d(nn.Conv2d):
    def __init__(self, *args, eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0,
                              eps=self.eps).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class WSConv2d(nn.Conv2d):
    def forward(self, x):
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
        w = (w - mean) / torch.sqrt(var + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


class Model(nn.Module):
    def __init__(self, cin, c):
        super().__init__()
        self.conv1 = StdConv2d(cin, c, 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(2, c)
        self.conv2 = WSConv2d(c, c, 3, stride=2)
        self.gn2 = nn.GroupNorm(3, c)

    def forward(self, x):
        x = F.relu(self.gn1(self.conv1(x)))
        return F.relu(self.gn2(self.conv2(x)))


def get_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_init_inputs():
    return [3, 6]
