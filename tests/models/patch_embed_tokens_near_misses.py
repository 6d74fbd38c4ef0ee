"""Near misses of a patch embedding's layer norm over the tokens' channels, which must not become a layer norm over
the channels (each convolution's output [2, 8, 2, 4]: its 8 tokens as many as its channels): a LayerNorm(8) over
the tokens' last dim without the transpose (over space), ``flatten(2).transpose(0, 1)`` (over space), the flattened
value read again beside the transpose, a LayerNorm over (tokens, channels), and Swin's permute with H and W
swapped (``permute(0, 3, 2, 1)``: taken only with the spatial dims in their order)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, stride=2)
        self.b = nn.Conv2d(3, 8, 3, stride=2)
        self.c = nn.Conv2d(3, 8, 3, stride=2)
        self.d = nn.Conv2d(3, 8, 3, stride=2)
        self.e = nn.Conv2d(3, 8, 3, stride=2)
        self.ln_a = nn.LayerNorm(8)
        self.ln_b = nn.LayerNorm(8)
        self.ln_c = nn.LayerNorm(8)
        self.ln_d = nn.LayerNorm((8, 8))
        self.ln_e = nn.LayerNorm(8)

    def forward(self, x):
        a = self.ln_a(self.a(x).flatten(2))
        b = self.ln_b(self.b(x).flatten(2).transpose(0, 1))
        f = self.c(x).flatten(2)
        c = self.ln_c(f.transpose(1, 2)) + f.mean(1, keepdim=True).transpose(1, 2)
        d = self.ln_d(self.d(x).flatten(2).transpose(1, 2))
        e = self.ln_e(self.e(x).permute(0, 3, 2, 1))
        return a, b, c, d, e


def get_inputs():
    return [torch.randn(2, 3, 5, 9)]


def get_init_inputs():
    return []
