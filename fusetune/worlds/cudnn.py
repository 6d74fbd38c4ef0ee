"""cudnn: cuDNN computes the convolution, then the stages run the chain on its output."""
from __future__ import annotations

from fusetune.dtypes import DTYPES
from fusetune.worlds.base import World
from fusetune.worlds.facts import stages_of


class Cudnn(World):
    name = "cudnn"
    doc = ("cuDNN computes the convolution (contiguous or channels-last, native or forward form); the "
           "statistics pass, finalize and the main kernel read its output")
    computes_conv_inside = False
    dtypes = tuple(DTYPES)  # cuDNN convolves at the dtype; the stages load it, compute in float
    launch = "cudnn"

    def why_not(self, plan):
        return None  # cuDNN takes every producer

    def stages(self, plan):
        return stages_of(plan, "stats", plan.family)
