"""KernelBench ConvTranspose2d_Min_Sum_GELU_Add: torch.min over channels (keepdim)[0], a sum over the height
(keepdim), GELU, then + a (C, 1, 1) bias: the 1-channel value broadcast back to C channels."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape):
        super(Model, self).__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding, output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.min(x, dim=1, keepdim=True)[0]
        x = torch.sum(x, dim=2, keepdim=True)
        x = torch.nn.functional.gelu(x)
        x = x + self.bias
        return x


batch_size = 2
in_channels, out_channels = 3, 5
height, width = 5, 6
kernel_size, stride, padding, output_padding = 3, 2, 1, 1
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape]
