"""Window pooling: stride defaults to the kernel size, padding to none, floor mode (PyTorch's defaults).

``ceil_mode: true`` (PyTorch's: one more window where a partial one starts inside the input or its left
padding) and an average's ``count_include_pad: false`` (the divisor counts the input's elements alone) are
PyTorch's pools exactly; no kernel pools partial windows or such divisors, so the planner runs such a pool
after the fused region, in PyTorch inside ModelNew (plan._kernel_refusal), but where ceil mode adds no window at
any of the config's shapes: there it is the floor-mode pool (regions.py's ceil_adds_no_window, exact at those
shapes only).

A max pool's ``dilation`` (PyTorch's: window element k at input offset k * dilation, an effective window of
dilation * (kernel_size - 1) + 1) and an average's ``divisor_override`` (PyTorch's: the divisor of every window,
padding or ceil mode's partial windows whatever they count; a nonzero integer, negative ones too) are pooled
by the kernels that pool windows of the convolution's output (window_map, plane_reduce); the kernels that
build boxes of whole undilated windows refuse a dilated pool (facts.fixed_window_refusal), and pool a
divisor_override as the divisor it is (pool.j2's reciprocal). An average with a divisor_override pools the
same values whatever count_include_pad says, so it is the kernels' pool with padding too.

A padded pool is pooled by the cuDNN world's main kernels only (fusetune/worlds/facts.py). An adaptive
pool (fusetune/ops/reduce.py's AdaptivePool) has a window per output index whose size varies with it and
with the input's size: ``ADAPTIVE_BOUNDS`` is how the kernels compute it, at any shape."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_bool, take_window


#: PyTorch's adaptive windows (aten's adaptive pooling start_index / end_index): output ``i`` of ``out`` over
#: an input of ``size`` spans [start, end), start = floor(i * size / out), end = ceil((i + 1) * size / out), so
#: that neighbouring windows may share an input and their sizes differ where ``out`` does not divide ``size``
#: (an average divides by its own window's count). C expressions over non-negative int64 operands, which
#: templates/common.cuh.j2 emits as they are (tests/test_adaptive.py evaluates these very strings, ``/`` as
#: Python's ``//``, against torch's adaptive pools).
ADAPTIVE_BOUNDS = {"start": "({i} * {size}) / {out}", "end": "(({i} + 1) * {size} + {out} - 1) / {out}"}


@dataclasses.dataclass(frozen=True)
class Pool(Op):
    role: ClassVar[str] = "pool"
    mode: ClassVar[str]  # "max" | "avg"
    torch_name: ClassVar[str]
    kernel_size: tuple[int, ...] = (1,)
    stride: tuple[int, ...] = (1,)
    padding: tuple[int, ...] | None = None  # None: no padding (kept out of the cache key, as before)
    ceil_mode: bool = False  # (out of the cache key where false, as before)
    count_include_pad: bool = True  # an average's divisor counts the padding (out of the cache key where true)
    dilation: tuple[int, ...] | None = None  # a max pool's; None: 1 along every dim (out of the cache key)
    divisor_override: int | None = None  # an average's divisor for every window; None: PyTorch's count (out of key)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["kernel_size", "stride", "padding", "ceil_mode"]
                       + (["count_include_pad", "divisor_override"] if cls.mode == "avg" else ["dilation"]), ctx)
        kernel = take_window(raw, "kernel_size", ctx)
        stride = take_window(raw, "stride", ctx, default=list(kernel))
        padding = take_window(raw, "padding", ctx, default=0, minimum=0)
        dilation = take_window(raw, "dilation", ctx, default=1)  # (max pools only: reject_unknown)
        divisor = raw.get("divisor_override")
        if divisor is not None and (isinstance(divisor, bool) or not isinstance(divisor, int) or divisor == 0):
            raise ctx.error("divisor_override", f"expected a nonzero integer (PyTorch's divisor for every window), "
                                                f"got {divisor!r}")
        for p, k in zip(padding, kernel):
            if 2 * p > k:
                raise ctx.error("padding", f"expected at most half the kernel size (kernel_size {list(kernel)}: "
                                           f"padding at most {[k // 2 for k in kernel]}, as PyTorch), got "
                                           f"{list(padding)}")
        ceil_mode = take_bool(raw, "ceil_mode", ctx, default=False)
        count_include_pad = take_bool(raw, "count_include_pad", ctx, default=True) or not any(padding)
        return cls(kernel_size=kernel, stride=stride, padding=padding if any(padding) else None, ceil_mode=ceil_mode,
                   count_include_pad=count_include_pad, dilation=dilation if any(d > 1 for d in dilation) else None,
                   divisor_override=divisor)

    @property
    def exact_in_kernels(self) -> bool:
        """Whether the kernels' pool (floor mode; a divisor of the whole window, or divisor_override) is this one
        at every shape."""
        return not self.ceil_mode and (self.count_include_pad or self.divisor_override is not None)

    @property
    def pads(self) -> tuple[int, ...]:
        return self.padding or (0,) * len(self.kernel_size)

    @property
    def dilations(self) -> tuple[int, ...]:
        return self.dilation or (1,) * len(self.kernel_size)

    @property
    def extents(self) -> tuple[int, ...]:
        """The window's extent along each dim, in inputs: dilation * (kernel_size - 1) + 1."""
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilations))

    def check_shape(self, shape: Shape, error) -> None:
        for size, k, p in zip(shape[2:], self.extents, self.pads):
            if size + 2 * p < k:
                dilated = f" (dilation {list(self.dilation)}: extent {list(self.extents)})" if self.dilation else ""
                error("kernel_size", f"window {list(self.kernel_size)}{dilated} is larger than the input's spatial "
                                     f"size {list(shape[2:])}")

    def out_shape(self, shape: Shape) -> Shape:
        return shape[:2] + tuple(self._size(s, k, st, p)
                                 for s, k, st, p in zip(shape[2:], self.extents, self.stride, self.pads))

    def _size(self, size: int, kernel: int, stride: int, pad: int) -> int:
        """PyTorch's output size (pooling_output_shape) for a window of ``kernel`` inputs (its extent, dilated):
        in ceil mode one more window where a partial one starts inside the input or its left padding."""
        if not self.ceil_mode:
            return (size + 2 * pad - kernel) // stride + 1
        out = -(-(size + 2 * pad - kernel) // stride) + 1
        return out - 1 if (out - 1) * stride >= size + pad else out

    @property
    def _modes(self) -> str:
        """PyTorch's arguments for dilation, ceil_mode, count_include_pad and divisor_override, where they are not
        the defaults."""
        return ((f", dilation={self.dilation}" if self.dilation else "") + (", ceil_mode=True" if self.ceil_mode else "")
                + ("" if self.count_include_pad else ", count_include_pad=False")
                + (f", divisor_override={self.divisor_override}" if self.divisor_override is not None else ""))

    @property
    def _as_2d(self) -> bool:
        """A 1-D average with a divisor_override, which nn.AvgPool1d and F.avg_pool1d lack: PyTorch's 2-D pool
        of the input viewed with a height of 1 (a window of height 1, no padding there) is that pool."""
        return len(self.kernel_size) == 1 and self.divisor_override is not None

    def module_code(self, channels: int, spatial_dims: int) -> str:
        if self._as_2d:
            return ""  # (forward_code's functional form)
        padding = f", padding={self.padding}" if self.padding else ""
        return (f"nn.{self.torch_name}{spatial_dims}d(kernel_size={self.kernel_size}, stride={self.stride}{padding}"
                f"{self._modes})")

    def functional_code(self, x: str) -> str:
        """The pool without a module, for windows the planner composed (fusetune/regions.py), and a 1-D average
        with a divisor_override (_as_2d)."""
        if self._as_2d:
            return (f"F.avg_pool2d({x}.unsqueeze(-2), kernel_size={(1, *self.kernel_size)}, "
                    f"stride={(1, *self.stride)}, padding={(0, *self.pads)}{self._modes}).squeeze(-2)")
        return (f"F.{self.mode}_pool{len(self.kernel_size)}d({x}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.pads}{self._modes})")

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"self.{attr}({x})" if attr else self.functional_code(x)

    def canonical(self) -> dict[str, Any]:
        out = super().canonical()
        if self.padding is None:
            del out["padding"]
        for key, default in (("ceil_mode", False), ("count_include_pad", True), ("dilation", None),
                             ("divisor_override", None)):
            if out[key] == default:
                del out[key]
        return out


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
