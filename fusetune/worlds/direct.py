"""direct: the convolution inside the fused kernels on CUDA cores, its weights in constant memory."""
from __future__ import annotations

from fusetune.tiles import direct_row_cells
from fusetune.worlds.base import World
from fusetune.worlds.facts import direct_refusal, pool_at_extremes, pool_increasing, stages_of


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
        largest and the smallest, the chain monotone per channel; "": every value through the chain)."""
        offered = self.refusal(plan) is None
        cells = direct_row_cells(plan.spec.producer.geometry(), *plan.pool_window) if offered else 1
        extremes = "max" if pool_increasing(plan) else "both" if pool_at_extremes(plan) else ""
        return {"direct": int(offered), "direct_cells": cells, "pool_extremes": extremes}
