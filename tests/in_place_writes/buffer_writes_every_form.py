"""A forward writing its buffers in place in every form the importer must see (fusetune/derived.py's
written_in_place): a method ending in ``_`` through a torch function's view, ``out=``, ``inplace=True`` of a call
and of a module, a method through an index. Each buffer named ``written_*`` is written; each ``read_*`` is only
read, one of them as the input of a call whose ``out=`` is another tensor (the written one is ``out``, not the first
operand). (Not ``self.u[0] = 0``: torch.fx cannot trace an item assignment on a buffer.)"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        for name in ("written_method_view", "written_out", "written_inplace", "written_module", "written_index",
                     "read_plain", "read_beside_out"):
            self.register_buffer(name, torch.ones(4))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        torch.flatten(self.written_method_view).mul_(2.0)
        torch.mul(self.read_beside_out, 2.0, out=self.written_out)
        F.relu(self.written_inplace, inplace=True)
        self.act(self.written_module)
        self.written_index[:2].zero_()
        return x + self.read_plain + self.written_method_view + self.written_out + self.written_index


def get_inputs():
    return [torch.randn(2, 4)]


def get_init_inputs():
    return []
