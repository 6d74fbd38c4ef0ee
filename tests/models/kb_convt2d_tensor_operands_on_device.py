"""One-value tensors made in the forward on the value's device (``torch.tensor(c, device=x.device)``), as
KernelBench writes a bound for torch.min/torch.max: numbers, their nodes in the chain; a dtype rounds the number
(float16's 0.1); a one-element list is one value; a trace constant moved with ``.to(x.device)`` is one too, on
either side of a subtraction."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, floor, ceiling):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride)
        self.floor = floor
        self.ceiling = ceiling

    def forward(self, x):
        y = self.deconv(x)
        y = torch.max(y, torch.tensor([self.floor], device=y.device))
        y = y + torch.tensor(0.1, dtype=torch.float16, device=y.device)
        y = torch.tensor(2.0).to(y.device) - y
        y = torch.minimum(y, torch.as_tensor(self.ceiling, device=y.device, dtype=y.dtype))
        return torch.tanh(y)


batch_size = 2
in_channels = 3
out_channels = 5
height, width = 5, 7
kernel_size = 3
stride = 2
floor = -0.25
ceiling = 1.75


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, floor, ceiling]
