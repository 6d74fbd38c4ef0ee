"""direct: the convolution inside the fused kernels on CUDA cores, its weights in constant memory."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fusetune.tiles import direct_footprint, direct_row_cells
from fusetune.worlds.base import World
from fusetune.worlds.facts import direct_refusal, pool_at_extremes, pool_increasing, stages_of

if TYPE_CHECKING:
    from fusetune.plan import Plan


class Direct(World):
    name = "direct"
    doc = ("the convolution inside the fused kernels on CUDA cores (direct_stats, direct_main), its output "
           "never in memory; where the weights fit in constant memory")
    computes_conv_inside = True
    #: At half precision the input and output are in the dtype (paired loads), the weights widened to
    #: float in constant memory, the products, the chain and the statistics in float.
    dtypes = ("float32", "float16", "bfloat16")

    def why_not(self, plan):
        return direct_refusal(plan)

    def stages(self, plan):
        return stages_of(plan, "direct_stats", "direct_main")

    def facts(self, plan):
        """``direct``: offered; ``direct_cells``: the most pooling windows in a row a direct_main thread
        takes (tiles.direct_row_cells); ``pool_extremes``: which raw values of a max pool's window
        direct_main pools before the chain ("max": the largest, the chain non-decreasing; "both": the
        largest and the smallest, the chain monotone per channel; "": every value through the chain);
        ``direct_element_values``: element_values."""
        offered = self.refusal(plan) is None
        cells = direct_row_cells(plan.spec.producer.geometry(), *plan.pool_window) if offered else 1
        extremes = "max" if pool_increasing(plan) else "both" if pool_at_extremes(plan) else ""
        return {"direct": int(offered), "direct_cells": cells, "pool_extremes": extremes,
                "direct_element_values": element_values(plan)}


def element_values(plan: Plan) -> int:
    """The registers a direct_main thread's layer norm affine per element of (C, *spatial) (Norm.element_affine
    "channels") costs it per channel of a cell, where the cell's inputs are in its registers (tiles.direct_footprint):
    a weight and a bias per output of the pooling window, counted twice at float32, where ptxas issued those loads
    ahead of the convolution and held them with the inputs (CUDA 13.0); 0 otherwise (a norm's per-channel affine,
    or per position alone, shared by the channels; or each output reading its own inputs). direct_main.yaml bounds
    ct * cells times it: past 64 the kernel spilled registers (float16 at ct 16 before a 2 x 2 pool, float32 at
    ct 8)."""
    if plan.norm is None or plan.norm.element_affine != "channels":
        return 0
    if not direct_footprint(plan.spec.producer.geometry(), *plan.pool_window, 1):
        return 0
    per_output = 2 * (2 if plan.spec.dtype == "float32" else 1)
    return per_output * math.prod(plan.pool_window[0])
