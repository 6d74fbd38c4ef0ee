"""gemm_wide_recompute: wide_stats for the norm's statistics, then wide_main computes the convolution
again and applies the chain, its output never written."""
from __future__ import annotations

from fusetune.worlds.base import World
from fusetune.worlds.facts import GEMM_NATIVE_MMA, WIDE_DTYPES, stages_of, wide_main_refusal, wide_stats_refusal


class GemmWideRecompute(World):
    name = "gemm_wide_recompute"
    doc = ("the K-tiled convolution twice (as gemm_wide multiplies it): wide_stats for the norm's statistics, "
           "then wide_main computes it "
           "again and applies the chain, its output never written")
    computes_conv_inside = True
    tf32 = True
    dtypes = WIDE_DTYPES
    native_mma = GEMM_NATIVE_MMA
    min_sm = 80

    def why_not(self, plan):
        """Offered where a norm needs statistics and wide_main takes the chain (gemm_wide's facts)."""
        return wide_stats_refusal(plan) or wide_main_refusal(plan)

    def stages(self, plan):
        return stages_of(plan, "wide_stats", "wide_main")
