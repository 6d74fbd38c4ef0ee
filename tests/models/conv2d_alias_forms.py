"""PyTorch's other names for ops of the vocabulary, as code bases write them: torch.clip / x.clip / x.clip_ (clamp),
torch.absolute / x.absolute (abs), torch.negative / x.negative (neg), torch.special.expit (sigmoid). Eval mode."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 6, 3, padding=1)
        self.b = nn.Conv2d(3, 6, 3, stride=2)
        self.c = nn.Conv2d(3, 5, 1)
        self.eval()

    def forward(self, x):
        a = torch.clip(self.a(x), min=-1.0, max=6.0).absolute()
        a = torch.special.expit(torch.negative(a)).clip(0.2)
        b = self.b(x).clip_(max=0.5)
        b = torch.absolute(b.negative())
        c = self.c(x).clip(-0.5, 0.5).sum(dim=(-2, -1))
        return a.mean(dim=(2, 3)) + b.amax(dim=(2, 3)) + c[:, :1]


def get_inputs():
    return [torch.randn(2, 3, 11, 9)]


def get_init_inputs():
    return []
