"""A forward with a number argument and a keyword default (forward(x, y, scale, mask=None)), a siamese convolution
called on two inputs, identities (.contiguous(), .clone(), .detach(), x * 1.0, F.dropout(training=False)), a squared relu
(relu(x) ** 2), and a dict output. mask, left at its default by the example, is traced as None (to torch.fx a tensor
otherwise: ``if mask is not None`` would take the branch, and the trace would not run on the example)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict({"conv": nn.Conv2d(3, 4, 3, padding=1), "act": nn.SiLU()})
        self.head = nn.Conv2d(4, 2, 1, bias=False)

    def forward(self, x, y, scale, mask=None):
        a = self.encoder["act"](self.encoder["conv"](x)).contiguous()
        b = self.encoder["act"](self.encoder["conv"](y)).clone()
        a = F.dropout(a * 1.0, p=0.5, training=False)
        h = F.relu(self.head(a - b)) ** 2
        h = h.detach() * scale
        if mask is not None:
            h = h * mask
        return {"h": h, "a": a.mean(dim=(2, 3))}


def get_inputs():
    return [torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8), 0.5]


def get_init_inputs():
    return []
