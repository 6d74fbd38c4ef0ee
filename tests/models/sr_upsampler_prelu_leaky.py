"""Super-resolution upsamplers: SRResNet's conv -> F.pixel_shuffle(2) -> nn.PReLU(C / 4) (a learnt slope per channel
of the shuffled tensor), and Real-ESRGAN's conv -> torch.pixel_shuffle(2) -> leaky_relu(0.2), then a BatchNorm2d of
the shuffled channels (eval mode). The activations and the batch norm move before the shuffles (shuffle_commutes: the
PReLU's weight and the norm's tensors repeated 4 times): each convolution's kernels take its whole chain."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.up1 = nn.Conv2d(3, c * 4, 3, padding=1)
        self.act1 = nn.PReLU(c)
        self.up2 = nn.Conv2d(c, c * 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        h = self.act1(F.pixel_shuffle(self.up1(x), 2))
        return self.bn(F.leaky_relu(torch.pixel_shuffle(self.up2(h), 2), 0.2))


def get_inputs():
    return [torch.randn(2, 3, 5, 7)]


def get_init_inputs():
    return [6]
