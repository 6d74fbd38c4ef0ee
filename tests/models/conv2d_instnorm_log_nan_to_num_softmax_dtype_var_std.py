"""Conv2d -> InstanceNorm2d(affine) -> log (NaN below 0, -inf at 0) -> x.nan_to_num(nan=0.0, neginf=-10.0) ->
torch.softmax(x, dim=1, dtype=torch.float32) -> x.var over the channels (unbiased=False, keepdim) -> torch.std over
(H, W) (correction 0): the vocabulary of issue 22 in one chain, each op in PyTorch's spelling."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.norm = nn.InstanceNorm2d(out_channels, affine=True)

    def forward(self, x):
        x = self.norm(self.conv(x))
        x = torch.log(x).nan_to_num(nan=0.0, neginf=-10.0)
        x = torch.softmax(x, dim=1, dtype=torch.float32)
        x = x.var(dim=1, keepdim=True, unbiased=False)
        return torch.std(x, dim=[2, 3], correction=0)


batch_size = 2
in_channels, out_channels = 3, 10
height, width = 13, 11
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
