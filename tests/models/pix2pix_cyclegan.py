"""pytorch-CycleGAN-and-pix2pix as written there: the UnetSkipConnectionBlock (downrelu = LeakyReLU(0.2, True) in place
on the block's input, which the block's ``torch.cat([x, self.model(x)], 1)`` also reads; ConvTranspose2d(4, 2, 1), BN,
Dropout(0.5); the innermost and outermost forms), and the ResnetBlock (ReflectionPad2d, conv with bias, InstanceNorm2d
without affine, ReLU(True), ``x + self.conv_block(x)``), ending in Tanh. Eval mode (served)."""
import functools

import torch
import torch.nn as nn


class UnetSkipConnectionBlock(nn.Module):
    def __init__(self, outer_nc, inner_nc, input_nc=None, submodule=None, outermost=False, innermost=False,
                 norm_layer=nn.BatchNorm2d, use_dropout=False):
        super().__init__()
        self.outermost = outermost
        use_bias = norm_layer == nn.InstanceNorm2d
        if input_nc is None:
            input_nc = outer_nc
        downconv = nn.Conv2d(input_nc, inner_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
        downrelu = nn.LeakyReLU(0.2, True)
        downnorm = norm_layer(inner_nc)
        uprelu = nn.ReLU(True)
        upnorm = norm_layer(outer_nc)
        if outermost:
            upconv = nn.ConvTranspose2d(inner_nc * 2, outer_nc, kernel_size=4, stride=2, padding=1)
            model = [downconv] + [submodule] + [uprelu, upconv, nn.Tanh()]
        elif innermost:
            upconv = nn.ConvTranspose2d(inner_nc, outer_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
            model = [downrelu, downconv] + [uprelu, upconv, upnorm]
        else:
            upconv = nn.ConvTranspose2d(inner_nc * 2, outer_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
            model = [downrelu, downconv, downnorm] + [submodule] + [uprelu, upconv, upnorm]
            if use_dropout:
                model = model + [nn.Dropout(0.5)]
        self.model = nn.Sequential(*model)

    def forward(self, x):
        if self.outermost:
            return self.model(x)
        return torch.cat([x, self.model(x)], 1)


class ResnetBlock(nn.Module):
    def __init__(self, dim, norm_layer, use_dropout, use_bias):
        super().__init__()
        conv_block = [nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, kernel_size=3, padding=0, bias=use_bias),
                      norm_layer(dim), nn.ReLU(True)]
        if use_dropout:
            conv_block += [nn.Dropout(0.5)]
        conv_block += [nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, kernel_size=3, padding=0, bias=use_bias),
                       norm_layer(dim)]
        self.conv_block = nn.Sequential(*conv_block)

    def forward(self, x):
        out = x + self.conv_block(x)
        return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        inner = UnetSkipConnectionBlock(16, 16, innermost=True)
        mid = UnetSkipConnectionBlock(8, 16, submodule=inner, use_dropout=True)
        self.unet = UnetSkipConnectionBlock(3, 8, input_nc=3, submodule=mid, outermost=True)
        norm = functools.partial(nn.InstanceNorm2d, affine=False, track_running_stats=False)
        self.res = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, 8, 7, padding=0, bias=True), norm(8), nn.ReLU(True),
                                 ResnetBlock(8, norm, True, True), ResnetBlock(8, norm, False, True),
                                 nn.ReflectionPad2d(3), nn.Conv2d(8, 3, 7, padding=0), nn.Tanh())
        self.eval()

    def forward(self, x):
        return self.res(self.unet(x))


def get_inputs():
    return [torch.randn(2, 3, 16, 24)]


def get_init_inputs():
    return []
