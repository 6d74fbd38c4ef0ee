"""gemm_extrema: the convolution once on the tensor cores; its statistics pass also writes each pooling
window's extremes, and extrema_map applies the chain to those."""
from __future__ import annotations

from fusetune.worlds.base import World
from fusetune.worlds.facts import (GEMM_DTYPES, GEMM_NATIVE_MMA, gemm_refusal, pool_at_extremes, stages_of,
                                   windows_in_boxes)


class GemmExtrema(World):
    name = "gemm_extrema"
    doc = ("the convolution once on the tensor cores: the statistics pass also writes each max pool "
           "window's largest and smallest value, extrema_map applies the per-channel monotone chain to them")
    computes_conv_inside = True
    tf32 = True
    dtypes = GEMM_DTYPES
    native_mma = GEMM_NATIVE_MMA
    min_sm = 80

    def why_not(self, plan):
        """Exact where the chain up to a max pool is monotone per channel (the chain's max over a
        window is at the window's largest or smallest input, whatever the signs) and the windows lie
        whole in the statistics pass's boxes: one output deep, not overlapping."""
        refusal = gemm_refusal(plan)
        if refusal is not None:
            return f"the tensor-core kernels do not take it: {refusal}"
        if not plan.needs_stats:
            return "no norm needs a statistics pass (the convolution runs once already)"
        if plan.family != "window_map" or not pool_at_extremes(plan):
            return "the chain does not end in a max pool of a per-channel monotone chain"
        if not windows_in_boxes(plan):
            return "the pooling windows overlap, span depth, or their stride does not divide the boxes"
        return None

    def stages(self, plan):
        return stages_of(plan, "gemm_stats", "extrema_map")

    def facts(self, plan):
        return {"extrema": int(self.refusal(plan) is None)}
