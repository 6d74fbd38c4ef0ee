"""The DCGAN of the PyTorch examples (dcgan/main.py), scaled down: the Generator's ConvTranspose2d-BN-ReLU stack from a
latent (N, nz, 1, 1) ending in ConvTranspose2d-Tanh, the Discriminator's Conv2d-LeakyReLU(0.2) then
Conv2d-BN-LeakyReLU stacks ending in Conv2d-Sigmoid and ``output.view(-1, 1).squeeze(1)``. Eval mode."""
import torch
import torch.nn as nn

nz, ngf, ndf, nc = 16, 8, 8, 3


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.netG = Generator()
        self.netD = Discriminator()
        self.eval()

    def forward(self, noise):
        return self.netD(self.netG(noise))  # netD(netG(noise)), as the training loop's generator step calls them


def get_inputs():
    return [torch.randn(3, nz, 1, 1)]


def get_init_inputs():
    return []
