"""Not a KernelBench model: no class Model."""
import torch


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]
