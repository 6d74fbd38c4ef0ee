"""PyTorch's pointwise math by every name it has: modules (nn.Hardshrink, nn.Softshrink, nn.Threshold with a jump,
nn.LogSigmoid, nn.Softsign, nn.Tanhshrink), functionals (F.hardshrink, F.softshrink, F.threshold, F.logsigmoid,
F.softsign, F.tanhshrink), torch functions, torch.special's names (erf, erfc, log1p, expm1, exp2, round) and
tensor methods (x.sin(), x.erf(), x.fix(), x.sgn(), an in-place x.floor_()); x.square(), x.rsqrt() and
torch.reciprocal are pow; softsign and tanhshrink written out (d / (1 + d.abs()), d - torch.tanh(d)). Four chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(3, 8, 1)
        self.conv4 = nn.Conv2d(3, 4, 3)
        self.hard = nn.Hardshrink(0.3)
        self.soft = nn.Softshrink(0.1)
        self.jump = nn.Threshold(0.05, -1.0)
        self.logsig = nn.LogSigmoid()
        self.softsign = nn.Softsign()
        self.tanhshrink = nn.Tanhshrink()

    def forward(self, x):
        a = self.tanhshrink(self.softsign(self.logsig(self.jump(self.soft(self.hard(self.conv1(x)))))))
        b = F.softshrink(F.hardshrink(self.conv2(x), 0.2), lambd=0.1)
        b = F.tanhshrink(F.softsign(F.logsigmoid(F.threshold(b, 0.1, 0.5))))
        b = torch.special.expm1(torch.special.log1p(torch.erfc(torch.special.erf(b))))
        b = torch.log10(torch.log2(torch.special.exp2(b)) + 0.5)
        c = self.conv3(x).sin().cos().erf().erfc().log1p().expm1().exp2().log2().log10()
        c = torch.sin(torch.cos(c)).square().add(1.0).rsqrt()
        c = torch.reciprocal(torch.special.round(c * 8.0).floor_().ceil().fix().trunc().sgn().sign().add(2.0))
        c = torch.round(torch.floor(torch.ceil(torch.trunc(torch.sign(c * 3.0 - 1.5)))) + 1.0)
        d = self.conv4(x)
        d = d / (1.0 + d.abs())
        d = d - torch.tanh(d)
        return a.sum() + b.mean() + c.sum() + d.amax()


def get_inputs():
    return [torch.randn(2, 3, 10, 9)]


def get_init_inputs():
    return []
