"""Producers: the convolution at the head of every chain, with PyTorch's shape rules."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from fusetune.ops.base import OpContext, Shape, reject_unknown, take_bool, take_int, take_window

#: producer op name -> (spatial dims, torch module name, transposed)
KINDS: dict[str, tuple[int, str, bool]] = {
    "conv2d": (2, "Conv2d", False),
    "conv3d": (3, "Conv3d", False),
    "conv_transpose3d": (3, "ConvTranspose3d", True),
}


@dataclasses.dataclass(frozen=True)
class Producer:
    kind: str
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    output_padding: tuple[int, ...]
    bias: bool

    @property
    def spatial_dims(self) -> int:
        return KINDS[self.kind][0]

    @property
    def transposed(self) -> bool:
        return KINDS[self.kind][2]

    @property
    def has_forward_form(self) -> bool:
        """Whether this transposed convolution is also a plain one over the same input: with stride 1
        it is the convolution with the weights flipped in space and in/out swapped, and padding
        k - 1 - p (p <= k - 1). cuDNN's forward kernels can be much faster than its transposed ones
        (3.51 against 4.69 ms for the 64->128 seed on an H100), so the search may try both."""
        return (self.transposed and all(s == 1 for s in self.stride) and not any(self.output_padding)
                and all(p <= k - 1 for p, k in zip(self.padding, self.kernel_size)))

    @property
    def is_full_transposed(self) -> bool:
        """Whether this transposed convolution is the full linear convolution of its input with its
        weights (stride 1, no padding or output padding): every product lands in the output, none
        cropped, so zero-padded to the output's size its spectrum is the product of theirs (the
        spectral world, plan.spectral)."""
        return (self.transposed and all(s == 1 for s in self.stride) and not any(self.padding)
                and not any(self.output_padding))

    @classmethod
    def parse(cls, raw: Mapping[str, Any], path: str) -> "Producer":
        from fusetune.errors import ConfigError

        if not isinstance(raw, Mapping):
            raise ConfigError(path, "producer", f"expected a mapping with an 'op' key, got {raw!r}")
        kind = raw.get("op")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ConfigError(path, "producer.op", f"expected one of {', '.join(KINDS)}, got {kind!r}")
        dims = KINDS[kind][0]
        ctx = OpContext(path=path, key="producer", in_shape=(), spatial_dims=dims, parameters={})
        allowed = ["in_channels", "out_channels", "kernel_size", "stride", "padding", "bias"]
        if KINDS[kind][2]:
            allowed.append("output_padding")
        reject_unknown(raw, allowed, ctx)
        padding = take_window(raw, "padding", ctx, default=0, minimum=0)
        output_padding = take_window(raw, "output_padding", ctx, default=0, minimum=0)
        producer = cls(kind=kind,
                       in_channels=take_int(raw, "in_channels", ctx, minimum=1),
                       out_channels=take_int(raw, "out_channels", ctx, minimum=1),
                       kernel_size=take_window(raw, "kernel_size", ctx),
                       stride=take_window(raw, "stride", ctx, default=1),
                       padding=padding, output_padding=output_padding,
                       bias=take_bool(raw, "bias", ctx, default=True))
        for op_, st in zip(producer.output_padding, producer.stride):
            if op_ >= st:
                raise ctx.error("output_padding", f"must be smaller than stride {list(producer.stride)}")
        return producer

    def out_shape(self, shape: Shape) -> Shape:
        """PyTorch's output shape; a non-positive size means the input is too small."""
        spatial = []
        for i, size in enumerate(shape[2:]):
            k, s, p = self.kernel_size[i], self.stride[i], self.padding[i]
            if self.transposed:
                spatial.append((size - 1) * s - 2 * p + k + self.output_padding[i])
            else:
                spatial.append((size + 2 * p - k) // s + 1)
        return (shape[0], self.out_channels, *spatial)

    def geometry(self) -> dict[str, Any]:
        """The convolution as the kernels that compute it take it: every window 3-D (a 2-D one
        padded with a leading 1), and its weight count."""
        pad = 3 - self.spatial_dims
        return {"cin": self.in_channels, "cout": self.out_channels, "transposed": self.transposed,
                "kernel": (1,) * pad + tuple(self.kernel_size), "stride": (1,) * pad + tuple(self.stride),
                "padding": (0,) * pad + tuple(self.padding),
                "output_padding": (0,) * pad + tuple(self.output_padding),
                "weights": self.in_channels * self.out_channels * math.prod(self.kernel_size)}

    def module_code(self) -> str:
        name = KINDS[self.kind][1]
        extra = f", output_padding={self.output_padding}" if self.transposed else ""
        return (f"nn.{name}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}{extra}, bias={self.bias})")

    def functional_code(self, x: str, module: str, bias: str, forward_form: bool = False) -> str:
        """Python calling the convolution with ``bias`` (an expression, or None); a transposed one in
        its forward form (``has_forward_form``) if asked."""
        if forward_form:
            assert self.has_forward_form, "only a stride-1 transposed convolution has a forward form"
            flip = tuple(range(2, 2 + self.spatial_dims))
            padding = tuple(k - 1 - p for k, p in zip(self.kernel_size, self.padding))
            return (f"F.conv{self.spatial_dims}d({x}, {module}.weight.flip({flip}).transpose(0, 1), {bias}, "
                    f"padding={padding})")
        fn = "conv_transpose3d" if self.transposed else f"conv{self.spatial_dims}d"
        extra = f", output_padding={self.output_padding}" if self.transposed else ""
        return f"F.{fn}({x}, {module}.weight, {bias}, stride={self.stride}, padding={self.padding}{extra})"

    def canonical(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

