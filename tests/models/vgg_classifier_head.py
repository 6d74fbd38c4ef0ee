"""torchvision's VGG as written there (``make_layers``: conv3x3-BN-ReLU(inplace) and MaxPool2d(2, 2) from a cfg list,
``self.avgpool = nn.AdaptiveAvgPool2d((7, 7))`` scaled to (3, 3), ``torch.flatten(x, 1)``, the classifier
Linear-ReLU-Dropout stack), and a ResNet-style head (AdaptiveAvgPool2d((1, 1)), flatten, fc) on a second branch. Eval."""
import torch
import torch.nn as nn

cfg = [8, "M", 16, 16, "M", 16, "M"]


def make_layers(cfg, batch_norm=True):
    layers = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
        else:
            conv2d = nn.Conv2d(in_channels, v, kernel_size=3, padding=1)
            if batch_norm:
                layers += [conv2d, nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            else:
                layers += [conv2d, nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


class Model(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = make_layers(cfg)
        self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
        self.classifier = nn.Sequential(
            nn.Linear(16 * 3 * 3, 32), nn.ReLU(True), nn.Dropout(p=0.5),
            nn.Linear(32, 32), nn.ReLU(True), nn.Dropout(p=0.5),
            nn.Linear(32, num_classes),
        )
        self.head_conv = nn.Conv2d(3, 12, 3, 2, 1, bias=False)
        self.head_bn = nn.BatchNorm2d(12)
        self.head_pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(12, num_classes)
        self.eval()

    def forward(self, x):
        y = self.features(x)
        y = self.avgpool(y)
        y = torch.flatten(y, 1)
        y = self.classifier(y)
        z = self.head_pool(torch.relu(self.head_bn(self.head_conv(x))))
        z = z.view(z.size(0), -1)
        return y + self.fc(z)


def get_inputs():
    return [torch.randn(2, 3, 29, 27)]


def get_init_inputs():
    return [10]
