"""Conv3d -> nn.LayerNorm((H, W), elementwise_affine=False) (the last two dims) -> F.normalize(dim=1) ->
torch.logsumexp over every spatial dim (2, 3, 4); a second Conv3d -> GroupNorm(1, C) -> F.layer_norm(x, x.shape[1:])
(its normalized_shape read off the chain's value: the sizes at the traced shape) -> mish."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3)
        self.ln = nn.LayerNorm((4, 5), elementwise_affine=False)
        self.conv2 = nn.Conv3d(2, 3, 3)
        self.gn = nn.GroupNorm(1, 3)

    def forward(self, x):
        a = F.normalize(self.ln(self.conv(x)), dim=1)
        a = torch.logsumexp(a, dim=(2, 3, 4))
        b = self.gn(self.conv2(x))
        b = F.mish(F.layer_norm(b, b.shape[1:]))
        return a.sum() + b.sum()


def get_inputs():
    return [torch.randn(2, 2, 5, 6, 7)]


def get_init_inputs():
    return []
