"""gemm_wide: the convolution as a K-tiled implicit GEMM on the tensor cores, for convolutions the
whole-weights kernels do not take (many channels, large weights, transposed ones by output parity)."""
from __future__ import annotations

import functools

from fusetune.tiles import wide_depths, wide_pool_fits, wide_rows_fit
from fusetune.worlds.base import World
from fusetune.worlds.facts import (GEMM_NATIVE_MMA, WIDE_DTYPES, gemm_elem, gemm_terms, stages_of, wide_main_refusal,
                                   wide_stats_refusal)


class GemmWide(World):
    name = "gemm_wide"
    doc = ("the convolution as a K-tiled implicit GEMM on the tensor cores (TF32, split TF32 under precision ieee, "
           "FP16/BF16 at those dtypes): the norm's statistics pass "
           "(wide_stats, writing the output once where a main kernel follows), or without one the whole "
           "chain in one kernel (wide_main)")
    computes_conv_inside = True
    tf32 = True
    dtypes = WIDE_DTYPES
    native_mma = GEMM_NATIVE_MMA
    min_sm = 80

    def why_not(self, plan):
        if wide_stats_refusal(plan) is None:
            return None
        return wide_main_refusal(plan)

    def stages(self, plan):
        """Where a norm needs statistics, wide_stats (storing the convolution for the cuDNN world's main
        kernel where the chain goes on); else wide_main (after finalize for eval-mode batch norm)."""
        if wide_stats_refusal(plan) is None:
            return stages_of(plan, "wide_stats", plan.family)
        return stages_of(plan, "wide_stats", "wide_main")

    def store(self, plan):
        return "float" if wide_stats_refusal(plan) is None and plan.family is not None else ""

    def facts(self, plan):
        """The K-tiled kernels' facts: whether its statistics pass (``wide``) and its main kernel
        (``wide_main``) are offered, the pipeline depth of each (bm, bn, blocks, staging) (0: not within
        the shared memory), and ``wide_rows_fit(bm, H, W, staging)``: whether the input rows that bm
        outputs read fit a staged channel at output height H and width W (tiles.wide_rows_fit, the
        launcher's check), and ``wide_main_rows_fit``, the same for wide_main's boxes (where the chain
        pools, whole windows); ``wide_pool_fits(bm, bn, wm, blocks, staging)``: whether wide_main can
        pool such a box (tiles.wide_pool_fits; true without a pool). gemm_wide_recompute reads them too."""
        allowed = self.numerics_refusal(plan) is None  # the dtype and precision
        wide, main = allowed and wide_stats_refusal(plan) is None, allowed and wide_main_refusal(plan) is None
        offered = {"wide": int(wide), "wide_main": int(main)}
        if not (wide or main):
            return {**offered, "wide_depth": {}, "wide_pool_fits": lambda *variant: False,
                    "wide_rows_fit": lambda *shape: False, "wide_main_rows_fit": lambda *shape: False}
        conv = plan.spec.producer.geometry()
        window = plan.pool_window if plan.pool is not None else None
        elem, terms = gemm_elem(plan), gemm_terms(plan)  # the tiles' bytes: values and weight terms
        pools = (functools.partial(wide_pool_fits, conv, elem=elem, terms=terms) if plan.pool is not None
                 else lambda *variant: True)
        # Memoized: every candidate of a space asks them again with one of a few dozen arguments.
        return {**offered, "wide_depth": wide_depths(conv, elem, terms), "wide_pool_fits": functools.cache(pools),
                "wide_rows_fit": functools.cache(functools.partial(wide_rows_fit, conv)),
                "wide_main_rows_fit": functools.cache(functools.partial(wide_rows_fit, conv, window=window))}
