"""How the kernels compute each reduction mode: one row of data per mode, which the templates render.

A reduction folds values into an accumulator: ``identity`` is its start, ``step`` takes one value,
``merge`` combines two partial accumulators (a warp's shuffles, the lanes of a channels-last position),
``end`` finishes it in place (mean's division by the count; "" for none) and ``value`` reads the float
result from it. Every field is a CUDA fragment with ``{acc}``, ``{x}``, ``{a}``, ``{b}`` and ``{count}``
placeholders, and the mode's own ``arguments`` (var's and std's ``{correction}``, which the op binds: Reduce.kernel);
the helpers they call are in templates/elementwise.cuh (ft_max_nan, ft_min_nan) or in
``header`` (included only where a kernel reduces by that mode, so that the other modes' sources and
cache keys stay as they were). tests/test_reductions.py compiles every row on the host with g++ and
checks it against PyTorch in float64, NaN and infinities included.

Which kernel families take which modes is fusetune/worlds/facts.py's STAGE_REDUCE_MODES.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class KernelReduction:
    """One reduction mode as CUDA fragments (see the module's docstring for the placeholders)."""

    mode: str
    acc: str  # the accumulator's CUDA type
    words: int  # 32-bit words in the accumulator (what a shuffle moves)
    identity: str
    step: str  # {acc}, {x} -> the accumulator with x taken
    merge: str  # {a}, {b} -> the two partial accumulators combined (associative and commutative)
    shuffle: str  # {acc}, {lane} -> the accumulator of the lane {lane} xor this one (__shfl_xor_sync)
    end: str  # {acc}, {count}: a statement that finishes the accumulator in place, "" for none
    value: str  # {acc} -> the float result of a finished accumulator
    header: str = ""  # the template file (under templates/) that defines its helpers, "" for none
    #: The op's arguments the fragments read, by placeholder name, with their values (PyTorch's defaults in
    #: the table; an op's own where it binds them).
    arguments: tuple[tuple[str, float], ...] = ()

    def bind(self, **values: float) -> "KernelReduction":
        """The row with the op's values of its arguments (those not given keep theirs)."""
        unknown = set(values) - {name for name, _ in self.arguments}
        if unknown:
            raise ValueError(f"{self.mode} takes no argument {sorted(unknown)}")
        return dataclasses.replace(self, arguments=tuple((name, values.get(name, value))
                                                         for name, value in self.arguments))

    def _format(self, fragment: str, **names: str) -> str:
        return fragment.format(**names, **{name: f"{float(value)!r}f" for name, value in self.arguments})

    def fold_step(self, acc: str, x: str) -> str:
        return self._format(self.step, acc=acc, x=x)

    def fold_merge(self, a: str, b: str) -> str:
        return self._format(self.merge, a=a, b=b)

    def shuffled(self, acc: str, lane: str) -> str:
        return self._format(self.shuffle, acc=acc, lane=lane)

    def finish(self, acc: str, count: str) -> str:
        return self._format(self.end, acc=acc, count=count)

    def result(self, acc: str) -> str:
        return self._format(self.value, acc=acc)


_SHUFFLE = "__shfl_xor_sync(0xffffffffu, {acc}, {lane})"

#: torch.var's and torch.std's default ``correction`` (Bessel's): the _SPREAD rows' and the Spread op's default.
SPREAD_CORRECTION = 1

#: var's and std's accumulator: the count (an int) and the sums of deviations from a pivot (the first value) and
#: of their squares (templates/variance.cuh), with torch's default correction.
_SPREAD: dict[str, Any] = dict(acc="FtSpread", words=4, identity="ft_spread_identity()",
                               step="ft_spread_step({acc}, {x})", merge="ft_spread_merge({a}, {b})",
                               shuffle="ft_spread_shfl_xor({acc}, {lane})", end="", header="variance.cuh",
                               arguments=(("correction", float(SPREAD_CORRECTION)),))

#: mode -> its kernel form. max and min keep NaN (torch.amax/amin do); logsumexp keeps a running max m
#: and the sum s of exp(x - m) (templates/reduce.cuh: NaN, +inf and all -inf as torch.logsumexp gives);
#: var and std the sums of deviations from a pivot and of their squares (templates/variance.cuh), their squared
#: deviations from the mean divided by max(0, n - correction) as torch.var does.
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
    KernelReduction(mode="var", value="ft_var_value({acc}, {correction})", **_SPREAD),
    KernelReduction(mode="std", value="ft_std_value({acc}, {correction})", **_SPREAD),
)}
