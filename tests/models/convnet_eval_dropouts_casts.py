"""Eval-mode blocks as real models write them: BatchNorm2d(momentum=None) (a cumulative average, which eval mode
never reads), nn.Dropout2d, casts that keep the dtype read off the chain's own values (``h.type(h.dtype)``,
``.type_as(h)``, ``norm(h).to(h.dtype)``: mixed-precision code around a norm), x.relu_(); F.dropout2d(training=
self.training), nn.AlphaDropout, nn.FeatureAlphaDropout; a cast that changes the dtype (``.half()``) and one that reads
the model input's dtype (``.to(x.dtype)``), each ending its chain; nn.SyncBatchNorm (eval: a batch norm), whose chain
takes the add; an InstanceNorm2d with running statistics (eval: they normalize, as an eval-mode batch norm's). Five
chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6, momentum=None)
        self.drop = nn.Dropout2d(0.2)
        self.conv2 = nn.Conv2d(6, 5, 3)
        self.alpha = nn.AlphaDropout(0.1)
        self.feature = nn.FeatureAlphaDropout(0.1)
        self.norm = nn.GroupNorm(5, 5)
        self.conv3 = nn.Conv2d(5, 4, 1)
        self.conv4 = nn.Conv2d(3, 4, 3)
        self.sync = nn.SyncBatchNorm(4)
        self.conv5 = nn.Conv2d(3, 4, 3)
        self.inorm = nn.InstanceNorm2d(4, affine=True, track_running_stats=True)
        with torch.no_grad():  # statistics as training leaves them, not the initial zeros and ones
            self.inorm.running_mean.uniform_(-0.5, 0.5)
            self.inorm.running_var.uniform_(0.5, 2.0)
            self.inorm.weight.uniform_(0.5, 1.5)
            self.inorm.bias.uniform_(-0.5, 0.5)
        self.eval()

    def forward(self, x):
        h = self.drop(self.bn(self.conv1(x)))
        h = h.type(h.dtype).relu_()
        h = F.dropout2d(self.conv2(h), 0.3, training=self.training)
        h = F.silu(self.feature(self.alpha(h)))
        h = self.norm(h.type_as(h)).to(h.dtype)
        h = torch.sigmoid(self.conv3(h)).half()
        h = h.to(x.dtype) * 2.0 + F.hardswish(self.sync(self.conv4(x)))
        return h + F.elu(self.inorm(self.conv5(x)).to(x.dtype))


def get_inputs():
    return [torch.randn(2, 3, 11, 9)]


def get_init_inputs():
    return []
