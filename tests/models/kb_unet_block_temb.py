"""KernelBench level-2 style, a diffusion UNet block's conditioning: ``forward(self, x, temb, scale, gain)`` adds
the time embedding per sample and channel after the convolution (``temb[:, :, None, None]``), applies SiLU, times a
per-sample scale of shape (N, 1, 1, 1) (a forward argument), plus a per-channel tensor passed to forward viewed as
(1, C, 1, 1). The importer makes each an extra input of its broadcast kind (inputs: shape:)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)

    def forward(self, x, temb, scale, gain):
        h = self.conv(x)
        h = h + temb[:, :, None, None]
        h = F.silu(h)
        h = h * scale
        return h + gain.view(1, -1, 1, 1)


batch_size = 3
in_channels = 5
out_channels = 12
height, width = 13, 17
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width), torch.randn(batch_size, out_channels),
            torch.randn(batch_size, 1, 1, 1), torch.randn(out_channels)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
