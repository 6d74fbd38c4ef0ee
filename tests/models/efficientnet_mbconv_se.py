"""EfficientNet's MBConv with squeeze-excitation, as the reference implementations write it: torchvision's
``SqueezeExcitation`` (adaptive_avg_pool2d -> fc1 conv1x1 -> SiLU -> fc2 conv1x1 -> sigmoid, ``scale * input``), and
an EfficientNet-PyTorch style ``x * torch.sigmoid(self._se_expand(swish(self._se_reduce(F.adaptive_avg_pool2d(x, 1)))))``;
the stochastic depth of a training run is off in eval. Eval mode."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels, squeeze_channels, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _scale(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input):
        scale = self._scale(input)
        return scale * input


class MBConv(nn.Module):
    """torchvision's MBConv: expand (conv-BN-SiLU), depthwise (conv-BN-SiLU), SE, project (conv-BN), residual."""

    def __init__(self, cin, cout, expand, stride):
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU(inplace=True)),
            nn.Sequential(nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                          nn.SiLU(inplace=True)),
            SqueezeExcitation(hidden, max(1, cin // 4), activation=nn.SiLU),
            nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)),
        )

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result = result + input
        return result


def swish(x):
    return x * torch.sigmoid(x)


class LukeMBConv(nn.Module):
    """EfficientNet-PyTorch's MBConvBlock (no expansion), its SE written inline in the forward."""

    def __init__(self, c):
        super().__init__()
        self._depthwise_conv = nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
        self._bn1 = nn.BatchNorm2d(c, momentum=0.01, eps=1e-3)
        self._se_reduce = nn.Conv2d(c, max(1, c // 4), 1)
        self._se_expand = nn.Conv2d(max(1, c // 4), c, 1)
        self._project_conv = nn.Conv2d(c, c, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(c, momentum=0.01, eps=1e-3)

    def forward(self, inputs):
        x = self._depthwise_conv(inputs)
        x = self._bn1(x)
        x = swish(x)
        x_squeezed = F.adaptive_avg_pool2d(x, 1)
        x_squeezed = self._se_reduce(x_squeezed)
        x_squeezed = swish(x_squeezed)
        x_squeezed = self._se_expand(x_squeezed)
        x = torch.sigmoid(x_squeezed) * x
        x = self._bn2(self._project_conv(x))
        x = x + inputs
        return x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(inplace=True))
        self.b1 = MBConv(8, 8, 4, 1)
        self.b2 = MBConv(8, 12, 4, 2)
        self.b3 = LukeMBConv(12)
        self.eval()

    def forward(self, x):
        return self.b3(self.b2(self.b1(self.stem(x))))


def get_inputs():
    return [torch.randn(2, 3, 17, 15)]


def get_init_inputs():
    return []
