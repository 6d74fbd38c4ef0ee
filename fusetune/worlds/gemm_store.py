"""gemm_store: the convolution once on the tensor cores, written out by the statistics pass for the
cuDNN world's main kernel."""
from __future__ import annotations

from fusetune.worlds.base import World
from fusetune.worlds.facts import GEMM_DTYPES, GEMM_NATIVE_MMA, gemm_elem, gemm_refusal, stages_of


class GemmStore(World):
    name = "gemm_store"
    doc = ("the statistics pass on the tensor cores also writes the convolution output (float, or half "
           "less each plane's pivot), which the cuDNN world's main kernel reads: computed once, not twice")
    computes_conv_inside = True
    tf32 = True
    dtypes = GEMM_DTYPES
    native_mma = GEMM_NATIVE_MMA
    min_sm = 80

    def why_not(self, plan):
        """It trades computing the convolution again for writing and reading its output: offered
        wherever the gemm world needs both passes."""
        refusal = gemm_refusal(plan)
        if refusal is not None:
            return f"the tensor-core kernels do not take it: {refusal}"
        if not plan.needs_stats:
            return "no norm needs a statistics pass before a main kernel"
        if plan.family is None:
            return "no main kernel follows the statistics (finalize computes the output)"
        return None

    def stages(self, plan):
        return stages_of(plan, "gemm_stats", plan.family)

    def store(self, plan):
        return "choice"

    def facts(self, plan):
        """``gemm_store``: offered; ``half_store``: it may write its output in half precision, less each
        plane's pivot (producer.store): the pre chain is affine, so the statistics pass's MMAs start
        from -pivot and hold y - pivot, a value of the plane's spread rather than its offset; and the
        main kernel is channel_reduce, the one family that reads it so. At float32 under precision tf32
        only: at the half dtypes the output is written in the dtype, as cuDNN's would be, and under ieee
        half precision's rounding of the spread would exceed float32's."""
        offered = self.refusal(plan) is None
        half = (offered and gemm_elem(plan) == 4 and plan.spec.precision != "ieee"
                and plan.pre_scale is not None and plan.family == "channel_reduce")
        return {"gemm_store": int(offered), "half_store": int(half)}
