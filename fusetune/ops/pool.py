"""Window pooling: stride defaults to the kernel size, no padding, floor mode (PyTorch's defaults)."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_window


@dataclasses.dataclass(frozen=True)
class Pool(Op):
    role: ClassVar[str] = "pool"
    mode: ClassVar[str]  # "max" | "avg"
    torch_name: ClassVar[str]
    kernel_size: tuple[int, ...] = (1,)
    stride: tuple[int, ...] = (1,)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["kernel_size", "stride"], ctx)
        kernel = take_window(raw, "kernel_size", ctx)
        stride = take_window(raw, "stride", ctx, default=list(kernel))
        return cls(kernel_size=kernel, stride=stride)

    def check_shape(self, shape: Shape, error) -> None:
        for size, k in zip(shape[2:], self.kernel_size):
            if size < k:
                error("kernel_size", f"window {list(self.kernel_size)} is larger than the input's spatial size {list(shape[2:])}")

    def out_shape(self, shape: Shape) -> Shape:
        spatial = tuple((s - k) // st + 1 for s, k, st in zip(shape[2:], self.kernel_size, self.stride))
        return shape[:2] + spatial

    def module_code(self, channels: int, spatial_dims: int) -> str:
        return f"nn.{self.torch_name}{spatial_dims}d(kernel_size={self.kernel_size}, stride={self.stride})"

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"self.{attr}({x})"


@dataclasses.dataclass(frozen=True)
class MaxPool(Pool):
    kind: ClassVar[str] = "max_pool"
    mode: ClassVar[str] = "max"
    torch_name: ClassVar[str] = "MaxPool"


@dataclasses.dataclass(frozen=True)
class AvgPool(Pool):
    kind: ClassVar[str] = "avg_pool"
    mode: ClassVar[str] = "avg"
    torch_name: ClassVar[str] = "AvgPool"
