"""How the kernels compute each reduction mode: one row of data per mode, which the templates render.

A reduction folds values into an accumulator: ``identity`` is its start, ``step`` takes one value,
``merge`` combines two partial accumulators (a warp's shuffles, the lanes of a channels-last position),
``end`` finishes it in place (mean's division by the count; "" for none) and ``value`` reads the float
result from it. Every field is a CUDA fragment with ``{acc}``, ``{x}``, ``{a}``, ``{b}`` and ``{count}``
placeholders; the helpers they call are in templates/elementwise.cuh (ft_max_nan, ft_min_nan) or in
``header`` (included only where a kernel reduces by that mode, so that the other modes' sources and
cache keys stay as they were). tests/test_reductions.py compiles every row on the host with g++ and
checks it against PyTorch in float64, NaN and infinities included.

Which kernel families take which modes is fusetune/worlds/facts.py's STAGE_REDUCE_MODES.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class KernelReduction:
    """One reduction mode as CUDA fragments (see the module's docstring for the placeholders)."""

    mode: str
    acc: str  # the accumulator's CUDA type
    words: int  # floats in the accumulator (what a shuffle moves)
    identity: str
    step: str  # {acc}, {x} -> the accumulator with x taken
    merge: str  # {a}, {b} -> the two partial accumulators combined (associative and commutative)
    shuffle: str  # {acc}, {lane} -> the accumulator of the lane {lane} xor this one (__shfl_xor_sync)
    end: str  # {acc}, {count}: a statement that finishes the accumulator in place, "" for none
    value: str  # {acc} -> the float result of a finished accumulator
    header: str = ""  # the template file (under templates/) that defines its helpers, "" for none

    def fold_step(self, acc: str, x: str) -> str:
        return self.step.format(acc=acc, x=x)

    def fold_merge(self, a: str, b: str) -> str:
        return self.merge.format(a=a, b=b)

    def shuffled(self, acc: str, lane: str) -> str:
        return self.shuffle.format(acc=acc, lane=lane)

    def finish(self, acc: str, count: str) -> str:
        return self.end.format(acc=acc, count=count)

    def result(self, acc: str) -> str:
        return self.value.format(acc=acc)


_SHUFFLE = "__shfl_xor_sync(0xffffffffu, {acc}, {lane})"

#: mode -> its kernel form. max and min keep NaN (torch.amax/amin do); logsumexp keeps a running max m
#: and the sum s of exp(x - m) (templates/reduce.cuh: NaN, +inf and all -inf as torch.logsumexp gives).
REDUCTIONS: dict[str, KernelReduction] = {r.mode: r for r in (
    KernelReduction(mode="max", acc="float", words=1, identity="-INFINITY", step="ft_max_nan({acc}, {x})",
                    merge="ft_max_nan({a}, {b})", shuffle=_SHUFFLE, end="", value="{acc}"),
    KernelReduction(mode="min", acc="float", words=1, identity="INFINITY", step="ft_min_nan({acc}, {x})",
                    merge="ft_min_nan({a}, {b})", shuffle=_SHUFFLE, end="", value="{acc}"),
    KernelReduction(mode="sum", acc="float", words=1, identity="0.f", step="{acc} + {x}", merge="{a} + {b}",
                    shuffle=_SHUFFLE, end="", value="{acc}"),
    KernelReduction(mode="mean", acc="float", words=1, identity="0.f", step="{acc} + {x}", merge="{a} + {b}",
                    shuffle=_SHUFFLE, end="{acc} /= (float){count};", value="{acc}"),
    KernelReduction(mode="logsumexp", acc="FtLse", words=2, identity="ft_lse_identity()",
                    step="ft_lse_step({acc}, {x})", merge="ft_lse_merge({a}, {b})",
                    shuffle="ft_lse_shfl_xor({acc}, {lane})", end="", value="ft_lse_value({acc})",
                    header="reduce.cuh"),
)}
