"""A video R(2+1)D block (Tran et al. 2018, torchvision's Conv2Plus1D): a spatial Conv3d (1, 3, 3), BatchNorm3d,
ReLU, then a temporal Conv3d (3, 1, 1), BatchNorm3d, ReLU."""
import torch
import torch.nn as nn

batch_size = 2
in_planes = 3
mid_planes = 10
out_planes = 8
frames, height, width = 5, 13, 11


class Model(nn.Module):
    def __init__(self, in_planes, out_planes, mid_planes, stride=1):
        super().__init__()
        self.spatial = nn.Conv3d(in_planes, mid_planes, kernel_size=(1, 3, 3), stride=(1, stride, stride),
                                 padding=(0, 1, 1), bias=False)
        self.bn1 = nn.BatchNorm3d(mid_planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.temporal = nn.Conv3d(mid_planes, out_planes, kernel_size=(3, 1, 1), stride=(stride, 1, 1),
                                  padding=(1, 0, 0), bias=False)
        self.bn2 = nn.BatchNorm3d(out_planes)
        self.relu2 = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.relu1(self.bn1(self.spatial(x)))
        return self.relu2(self.bn2(self.temporal(x)))


def get_inputs():
    return [torch.randn(batch_size, in_planes, frames, height, width)]


def get_init_inputs():
    return [in_planes, out_planes, mid_planes]
