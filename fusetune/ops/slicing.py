"""Slicing one dim: ``x[:, :, start:end:step]``, PyTorch's ``aten.slice(x, dim, start, end, step)`` (the op
indexing by a slice calls, named as its arguments are). Models write it after a convolution to crop its output:
a TCN's Chomp1d (``x[:, :, :-chomp]``, a causal convolution from a padded one), a UNet's crop to its skip's size.

It is a view in PyTorch (no copy), and keeps every other dim: the planner ends a region before it as before any
view (plan._ROLE_REFUSALS), an elementwise op after it moves before it (regions' sink_views: the values it keeps
are the same either way) and what follows runs in a later region. ``start`` and ``end`` are Python's (negative
from the end, ``end`` none for the dim's size, clipped to it), so that one config holds at several shapes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_int
from fusetune.ops.reduce import View


@dataclasses.dataclass(frozen=True)
class Slice(View):
    """``x[..., start:end:step]`` over ``dim`` (stored non-negative; not the batch dim, whose size the kernels
    never fix)."""

    kind: ClassVar[str] = "slice"
    dim: int = 2
    start: int = 0
    end: int | None = None
    step: int = 1

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim", "start", "end", "step"], ctx)
        rank = len(ctx.in_shape)
        dim = take_int(raw, "dim", ctx)
        if not -rank <= dim < rank or dim % rank == 0:
            raise ctx.error("dim", f"expected a dim in [1, {rank - 1}] (or negative, not the batch's) for an input of "
                                   f"rank {rank}, got {dim}")
        end = raw.get("end")
        if end is not None:
            end = take_int(raw, "end", ctx)
        return cls(dim=dim % rank, start=take_int(raw, "start", ctx, default=0), end=end,
                   step=take_int(raw, "step", ctx, default=1, minimum=1))

    def check_shape(self, shape: Shape, ctx_error) -> None:
        if self.out_shape(shape)[self.dim] < 1:
            ctx_error("end", f"the slice {self.start}:{self.end} of dim {self.dim} of {list(shape)} is empty")

    def out_shape(self, shape: Shape) -> Shape:
        size = len(range(shape[self.dim])[slice(self.start, self.end, self.step)])
        return tuple(size if i == self.dim else s for i, s in enumerate(shape))

    def forward_code(self, x: str, attr: str | None) -> str:
        end = "" if self.end is None else str(self.end)
        step = "" if self.step == 1 else f":{self.step}"
        return f"{x}[{':, ' * self.dim}{self.start or ''}:{end}{step}]"
