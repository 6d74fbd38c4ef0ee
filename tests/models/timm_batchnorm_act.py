"""timm's BatchNormAct2d as it is written: a BatchNorm2d subclass whose forward calls F.batch_norm on its own running
statistics, then its dropout and activation modules (torch.fx traces through it: not a torch.nn leaf); in eval mode,
after a convolution and a depthwise one (EfficientNet's stem and block). Two chains."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class BatchNormAct2d(nn.BatchNorm2d):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, act_layer=nn.SiLU, drop_layer=None):
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        self.act = act_layer(inplace=True)

    def forward(self, x):
        exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                exponential_average_factor = 1.0 / float(self.num_batches_tracked)
        bn_training = True if self.training else (self.running_mean is None) and (self.running_var is None)
        x = F.batch_norm(
            x,
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight, self.bias, bn_training, exponential_average_factor, self.eps)
        x = self.drop(x)
        return self.act(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_stem = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = BatchNormAct2d(8, eps=1e-3)
        self.conv_dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn2 = BatchNormAct2d(8, act_layer=nn.ReLU6)
        self.eval()

    def forward(self, x):
        return self.bn2(self.conv_dw(self.bn1(self.conv_stem(x))))


def get_inputs():
    return [torch.randn(2, 3, 19, 17)]


def get_init_inputs():
    return []
