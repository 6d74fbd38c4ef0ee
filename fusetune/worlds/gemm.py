"""gemm: the convolution inside the fused kernels as implicit GEMMs on the tensor cores (TF32 for float32,
FP16/BF16 for the half types, accumulating in float)."""
from __future__ import annotations

from fusetune.tiles import GEMM_TAPS, gemm_keeps_b, gemm_max_height, gemm_taps
from fusetune.worlds.base import World
from fusetune.worlds.facts import (GEMM_DTYPES, GEMM_NATIVE_MMA, gemm_elem, gemm_refusal, gemm_terms,
                                   gemm_windows, stages_of)


class Gemm(World):
    name = "gemm"
    doc = ("the convolution inside the fused kernels as implicit GEMMs on the tensor cores in TF32 (split TF32, "
           "three MMAs a product, under precision ieee), or FP16/BF16 at those dtypes (gemm_stats, gemm_main), "
           "computed in each pass; convolutions (not transposed) whose channels come in tiles of 8 up to 64")
    computes_conv_inside = True
    tf32 = True
    min_sm = 80
    dtypes = GEMM_DTYPES
    native_mma = GEMM_NATIVE_MMA

    def why_not(self, plan):
        return gemm_refusal(plan)

    def stages(self, plan):
        return stages_of(plan, "gemm_stats", "gemm_main")

    def facts(self, plan):
        """``gemm``: the whole-weights tensor-core kernels take the convolution; ``gemm_th``: the tallest
        box of theirs within the shared memory (tiles.gemm_max_height), 0 where they do not;
        ``tf32_terms``: the TF32 terms of each operand of their products (2: split TF32, precision ieee;
        facts.gemm_terms), whose variants' compile_if leaves out those that spill registers then;
        ``gemm_stride``: the convolution's largest stride, which that rule reads too (gemm_stats.yaml);
        ``gemm_elem``: the bytes of an element they stage (facts.gemm_elem: 2 on FP16/BF16 MMAs), which
        gemm_main.yaml's rule reads; ``gemm_taps``: the most taps of the input channels gemm_stats, gemm_main
        and gemm_cluster may pack into each half of a k step (tiles.gemm_taps: 2 on FP16/BF16 MMAs for at most
        4 input channels; their taps matter only where it is 2); ``gemm_b_kept``: taps (tiles.GEMM_TAPS) ->
        whether a warp keeps the B fragments in registers at that packing (tiles.gemm_keeps_b; gemm_stats'
        bregs 0 is the same kernel where it does not)."""
        offered = self.refusal(plan) is None
        terms = gemm_terms(plan)
        conv = plan.spec.producer.geometry()
        th = gemm_max_height(conv, gemm_windows(plan), gemm_elem(plan), terms) if offered else 0
        return {"gemm": int(offered), "gemm_th": th, "tf32_terms": terms, "gemm_stride": max(conv["stride"]),
                "gemm_elem": gemm_elem(plan), "gemm_taps": gemm_taps(conv["cin"], gemm_elem(plan)),
                "gemm_b_kept": {taps: int(offered and taps <= gemm_taps(conv["cin"], gemm_elem(plan))
                                          and gemm_keeps_b(conv, gemm_elem(plan), terms, taps)) for taps in GEMM_TAPS}}
