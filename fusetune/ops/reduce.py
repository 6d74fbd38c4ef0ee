"""Reductions that drop dimensions: global average pooling and max/min/sum/mean over a dim."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_int


@dataclasses.dataclass(frozen=True)
class Reduce(Op):
    """``over`` is "spatial" (all spatial dims, keeping size-1 dims) or "dim" (one dim, dropped)."""

    role: ClassVar[str] = "reduce"
    mode: str = "mean"  # max | min | sum | mean
    over: str = "dim"
    dim: int = 1


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool(Reduce):
    kind: ClassVar[str] = "adaptive_avg_pool"
    mode: str = "mean"
    over: str = "spatial"
    dim: int = -1

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["output_size"], ctx)
        size = raw.get("output_size", 1)
        if isinstance(size, bool) or (size != 1 and size != [1] * ctx.spatial_dims):
            raise ctx.error("output_size", f"only output_size 1 is supported, got {size!r}")
        return cls()

    def out_shape(self, shape: Shape) -> Shape:
        return shape[:2] + (1,) * (len(shape) - 2)

    def module_code(self, channels: int, spatial_dims: int) -> str:
        return f"nn.AdaptiveAvgPool{spatial_dims}d(1)"

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"self.{attr}({x})"


@dataclasses.dataclass(frozen=True)
class DimReduce(Reduce):
    """torch.max/min(x, dim)[0], torch.sum/mean(x, dim): values only, the dim dropped."""

    kind: ClassVar[str] = "reduce"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim"], ctx)
        rank = len(ctx.in_shape)
        dim = take_int(raw, "dim", ctx, default=1)
        if not -rank <= dim < rank:
            raise ctx.error("dim", f"expected a dim in [{-rank}, {rank - 1}] for an input of rank {rank}, got {dim}")
        if dim % rank == 0:
            raise ctx.error("dim", "reducing over the batch dim (0) is not supported")
        return cls(mode=str(raw["op"]), over="dim", dim=dim % rank)

    def out_shape(self, shape: Shape) -> Shape:
        return shape[: self.dim] + shape[self.dim + 1:]

    def forward_code(self, x: str, attr: str | None) -> str:
        if self.mode in ("max", "min"):
            return f"torch.{self.mode}({x}, dim={self.dim})[0]"
        return f"torch.{self.mode}({x}, dim={self.dim})"

    def canonical(self) -> dict[str, Any]:
        return {"kind": self.mode, "dim": self.dim}
