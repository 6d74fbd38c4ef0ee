"""Spectral normalization by hand (BigGAN's SNConv2d): one power iteration per call, the buffer u written in place
(self.u.copy_(u)) before the convolution whose weight (weight / sigma) is computed from it. sn1 writes u at every
call: no chain (a fused call would compute the weight from the written u); sn2 writes it in training mode only,
so in eval mode its weight is a derivation of the model's tensors; conv is a plain convolution."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SNConv2d(nn.Conv2d):
    def __init__(self, *args, always=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.always = always
        self.register_buffer("u", F.normalize(torch.randn(self.out_channels), dim=0))

    def forward(self, x):
        w_mat = self.weight.view(self.weight.size(0), -1)
        with torch.no_grad():
            v = F.normalize(torch.mv(w_mat.t(), self.u), dim=0)
            u = F.normalize(torch.mv(w_mat, v), dim=0)
            if self.always or self.training:
                self.u.copy_(u)
        sigma = torch.dot(u, torch.mv(w_mat, v))
        return F.conv2d(x, self.weight / sigma, self.bias, self.stride, self.padding)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.sn1 = SNConv2d(3, 6, 3, padding=1, always=True)
        self.sn2 = SNConv2d(6, 6, 3, padding=1)
        self.conv = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        x = F.leaky_relu(self.sn1(x), 0.1)
        x = F.leaky_relu(self.sn2(x), 0.1)
        return torch.tanh(self.conv(x))


def get_inputs():
    return [torch.randn(2, 3, 7, 9)]


def get_init_inputs():
    return []
