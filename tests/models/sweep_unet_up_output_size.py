"""U-Net's up step with ConvTranspose2d called with output_size=skip.size(): the output padding PyTorch chooses at
call time, 1 on the height (10 from 5) and 0 on the width (11 from 6) at the example's shape, is the config's; then
torch.cat with the skip and a conv-BN-ReLU."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1)
        self.skip = nn.Conv2d(3, 4, 3, padding=1)
        self.fuse = nn.Sequential(nn.Conv2d(8, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.eval()

    def forward(self, x):
        s = torch.relu(self.skip(x))
        d = torch.relu(self.down(x))
        u = torch.sigmoid(self.up(d, output_size=s.size()))
        return self.fuse(torch.cat([u, s], dim=1))


def get_inputs():
    return [torch.randn(2, 3, 10, 11)]


def get_init_inputs():
    return []
