"""KernelBench ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp_Max: a channel logsumexp (keepdim), its
"hardswish" written x * sigmoid(x + 3) / 6, a (C, 1, 1, 1) bias subtracted from the 1-channel value (broadcast
back to C channels), clamp, a channel max (keepdim)[0]."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias_shape):
        super(Model, self).__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = x * torch.sigmoid(x + 3) / 6
        x = x - self.bias
        x = torch.clamp(x, min=-1, max=1)
        x = torch.max(x, dim=1, keepdim=True)[0]
        return x


batch_size = 2
in_channels, out_channels = 3, 4
depth, height, width = 3, 4, 5
kernel_size, stride, padding = 3, 2, 1
bias_shape = (out_channels, 1, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, bias_shape]
