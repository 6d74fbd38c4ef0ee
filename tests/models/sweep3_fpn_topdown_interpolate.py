"""torchvision's FeaturePyramidNetwork: lateral 1x1 convolutions, the top-down path
``F.interpolate(last, size=lateral.shape[-2:], mode="nearest")`` added to each lateral, 3x3 output convolutions, P6 by
max_pool2d(kernel_size=1, stride=2). The upsampled value is computed after the lateral convolution, from earlier ones,
and reads only the lateral's shape: the lateral's chain takes the add (its input), and the interpolate reads that size
at the traced shape (other shapes run the model's own forward)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels=(3, 4, 5), out_channels=4):
        super().__init__()
        self.inner = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in in_channels)
        self.layer = nn.ModuleList(nn.Conv2d(out_channels, out_channels, 3, padding=1) for _ in in_channels)

    def forward(self, c3, c4, c5):
        feats = [c3, c4, c5]
        last = self.inner[-1](feats[-1])
        results = [self.layer[-1](last)]
        for idx in range(len(feats) - 2, -1, -1):
            lateral = self.inner[idx](feats[idx])
            top_down = F.interpolate(last, size=lateral.shape[-2:], mode="nearest")
            last = lateral + top_down
            results.insert(0, self.layer[idx](last))
        results.append(F.max_pool2d(results[-1], kernel_size=1, stride=2, padding=0))
        return tuple(results)


def get_inputs():
    return [torch.randn(2, 3, 8, 8), torch.randn(2, 4, 4, 4), torch.randn(2, 5, 2, 2)]


def get_init_inputs():
    return []
