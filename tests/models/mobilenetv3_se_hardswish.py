"""torchvision's MobileNetV3 InvertedResidual as written there: Conv2dNormActivation with nn.Hardswish or nn.ReLU, the
SqueezeExcitation with scale_activation=nn.Hardsigmoid (``F.adaptive_avg_pool2d(input, 1)`` in _scale), and the
classifier head (AdaptiveAvgPool2d(1), torch.flatten, Linear-Hardswish-Dropout-Linear). Eval mode."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _make_divisible(v, divisor=8, min_value=None):
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, in_planes, out_planes, kernel_size=3, stride=1, groups=1, activation_layer=nn.ReLU):
        padding = (kernel_size - 1) // 2
        layers = [nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
                  nn.BatchNorm2d(out_planes, eps=0.001, momentum=0.01)]
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels, squeeze_channels):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, input):
        scale = F.adaptive_avg_pool2d(input, 1)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        scale = self.scale_activation(scale)
        return scale * input


class InvertedResidual(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, use_se, use_hs, stride):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act = nn.Hardswish if use_hs else nn.ReLU
        layers = []
        if expanded != cin:
            layers.append(Conv2dNormActivation(cin, expanded, 1, activation_layer=act))
        layers.append(Conv2dNormActivation(expanded, expanded, kernel, stride, groups=expanded, activation_layer=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4, 8)))
        layers.append(Conv2dNormActivation(expanded, cout, 1, activation_layer=None))
        self.block = nn.Sequential(*layers)

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result += input
        return result


class Model(nn.Module):
    def __init__(self, num_classes=7):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(3, 8, 3, 2, activation_layer=nn.Hardswish),
            InvertedResidual(8, 3, 8, 8, True, False, 2),
            InvertedResidual(8, 5, 24, 8, True, True, 1),
            Conv2dNormActivation(8, 24, 1, activation_layer=nn.Hardswish),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(24, 32), nn.Hardswish(inplace=True), nn.Dropout(p=0.2, inplace=True),
                                        nn.Linear(32, num_classes))
        self.eval()

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def get_inputs():
    return [torch.randn(2, 3, 23, 21)]


def get_init_inputs():
    return [7]
