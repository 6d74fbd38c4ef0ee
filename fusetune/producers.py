"""Producers: the convolution at the head of every chain, with PyTorch's names and shape rules."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, NamedTuple

from fusetune.ops.base import OpContext, Shape, reject_unknown, take_bool, take_int, take_window


class Kind(NamedTuple):
    """A producer op: its spatial dims, torch.nn's module and whether it is transposed. The op name
    is also torch.nn.functional's function (F.conv1d ... F.conv_transpose3d)."""

    spatial_dims: int
    module: str
    transposed: bool


#: producer op name -> (spatial dims, torch module name, transposed)
KINDS: dict[str, Kind] = {
    "conv1d": Kind(1, "Conv1d", False),
    "conv2d": Kind(2, "Conv2d", False),
    "conv3d": Kind(3, "Conv3d", False),
    "conv_transpose1d": Kind(1, "ConvTranspose1d", True),
    "conv_transpose2d": Kind(2, "ConvTranspose2d", True),
    "conv_transpose3d": Kind(3, "ConvTranspose3d", True),
}

#: The producer of a later region (fusetune/pipeline.py): no convolution, the tensor an earlier region
#: wrote, of 1, 2 or 3 spatial dims. Never written in a config (Producer.parse takes KINDS only), so
#: the importer, which maps torch modules through KINDS, never takes an nn.Identity for a producer.
TENSOR_KINDS: dict[str, Kind] = {f"tensor{n}d": Kind(n, "Identity", False) for n in (1, 2, 3)}

#: PyTorch's padding modes of a plain convolution (nn.Conv*d's padding_mode; F.pad's mode where it is not
#: zeros) -> the largest padding it takes beside an input size s (reflect mirrors within the input, circular
#: wraps once around it, replicate repeats its edge as far as asked).
PADDING_MODES: dict[str, Any] = {"zeros": None, "reflect": lambda s: s - 1, "replicate": None,
                                 "circular": lambda s: s}

#: spatial dims -> the names of the input's spatial sizes, as the config's shapes list them.
SPATIAL_NAMES: dict[int, tuple[str, ...]] = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def geometry_refusal(conv: Mapping[str, Any]) -> str | None:
    """Why the kernels that compute the convolution inside (direct, gemm, gemm_wide, spectral) do not
    take a geometry (``Producer.geometry``), None where nothing of it stands in their way: they compute
    dilation 1, one group, and the same padding on both sides of every axis."""
    dims = conv.get("spatial_dims", 3)

    def written(values) -> str:  # as the config writes it: the producer's own dims, one int where all agree
        values = tuple(values)[3 - dims:]
        return str(values[0]) if len(set(values)) == 1 else str(list(values))

    mode = conv.get("padding_mode", "zeros")
    if mode != "zeros":
        return f"padding_mode {mode!r} (the kernels pad with zeros; cuDNN's world pads the input first)"
    dilation = tuple(conv.get("dilation", (1, 1, 1)))
    if any(d != 1 for d in dilation):
        return f"dilation {written(dilation)} (the kernels compute dilation 1 only)"
    if conv.get("groups", 1) != 1:
        return f"groups {conv['groups']} (the kernels compute one group only)"
    padding = tuple(conv.get("padding", (0, 0, 0)))
    end = tuple(conv.get("padding_end", padding))
    if padding != end:
        return (f"padding 'same' of {written(padding)} before and {written(end)} after (the kernels pad both "
                "sides alike)")
    return None


@dataclasses.dataclass(frozen=True)
class Producer:
    kind: str
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]  # before each axis (and after it, but for 'same' with an odd total: see padding_end)
    output_padding: tuple[int, ...]
    bias: bool
    dilation: tuple[int, ...] = ()  # () for ones
    groups: int = 1
    same: bool = False  # padding 'same' (plain convolutions, stride 1): the output as large as the input
    #: A later region's tensor whose channel count is a run-time size: the dim 1 of a view (fusetune/views.py),
    #: which the input's size sets; such a region reads nothing per channel (in_channels: the first shape's).
    any_channels: bool = False
    #: How the padding is filled (PADDING_MODES): zeros, or the input padded first (F.pad) and the
    #: convolution then unpadded, as nn.Conv*d computes a reflect, replicate or circular padding.
    padding_mode: str = "zeros"

    def __post_init__(self) -> None:
        if not self.dilation:
            object.__setattr__(self, "dilation", (1,) * self.spatial_dims)

    @classmethod
    def tensor(cls, channels: int, spatial_dims: int, any_channels: bool = False) -> "Producer":
        """A later region's producer: the (N, channels, spatial...) tensor an earlier region wrote, as is
        (a 1x1 window, no bias), so that everything that reads a producer's shape rules reads it alike;
        ``any_channels`` where its channel count is a run-time size (a view's)."""
        ones, zeros = (1,) * spatial_dims, (0,) * spatial_dims
        return cls(kind=f"tensor{spatial_dims}d", in_channels=channels, out_channels=channels, kernel_size=ones,
                   stride=ones, padding=zeros, output_padding=zeros, bias=False, any_channels=any_channels)

    @property
    def _kind(self) -> Kind:
        return KINDS.get(self.kind) or TENSOR_KINDS[self.kind]

    @property
    def convolves(self) -> bool:
        """Whether this producer is a convolution (False for a later region's tensor: TENSOR_KINDS)."""
        return self.kind in KINDS

    @property
    def spatial_dims(self) -> int:
        return self._kind.spatial_dims

    @property
    def transposed(self) -> bool:
        return self._kind.transposed

    @property
    def padding_end(self) -> tuple[int, ...]:
        """The padding after each axis: ``padding`` but for 'same', where PyTorch pads a total of
        d * (k - 1), the extra one of an odd total after."""
        if not self.same:
            return self.padding
        return tuple(d * (k - 1) - p for d, k, p in zip(self.dilation, self.kernel_size, self.padding))

    @property
    def asymmetric(self) -> bool:
        return self.padding_end != self.padding

    @property
    def shape_names(self) -> str:
        """The input's shape as the config lists it: [N, C, L], [N, C, H, W] or [N, C, D, H, W]."""
        return f"[N, C, {', '.join(SPATIAL_NAMES[self.spatial_dims])}]"

    @property
    def has_forward_form(self) -> bool:
        """Whether this transposed convolution is also a plain one over the same input: with stride 1
        it is the convolution with the weights flipped in space and in/out swapped, and padding
        d(k - 1) - p (p <= d(k - 1)). cuDNN's forward kernels can be much faster than its transposed ones
        at the same shape, so the search may try both. One group
        only (grouped weights would need regrouping, not one transpose)."""
        return (self.transposed and self.groups == 1 and all(s == 1 for s in self.stride)
                and not any(self.output_padding)
                and all(p <= d * (k - 1) for p, k, d in zip(self.padding, self.kernel_size, self.dilation)))

    @property
    def is_full_transposed(self) -> bool:
        """Whether this transposed convolution is the full linear convolution of its input with its
        weights (stride 1, no padding or output padding): every product lands in the output, none
        cropped, so zero-padded to the output's size its spectrum is the product of theirs (the
        spectral world, fusetune/worlds/spectral.py)."""
        return (self.transposed and all(s == 1 for s in self.stride) and not any(self.padding)
                and not any(self.output_padding))

    @classmethod
    def parse(cls, raw: Mapping[str, Any], path: str) -> "Producer":
        from fusetune.errors import ConfigError, did_you_mean

        if not isinstance(raw, Mapping):
            raise ConfigError(path, "producer", f"expected a mapping with an 'op' key, got {raw!r}")
        kind = raw.get("op")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ConfigError(path, "producer.op", f"expected one of {', '.join(KINDS)}, got {kind!r}"
                                                   f"{did_you_mean(kind, KINDS)}")
        dims, transposed = KINDS[kind].spatial_dims, KINDS[kind].transposed
        ctx = OpContext(path=path, key="producer", in_shape=(), spatial_dims=dims, parameters={})
        allowed = ["in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"]
        allowed.append("output_padding" if transposed else "padding_mode")
        reject_unknown(raw, allowed, ctx)
        padding_mode = raw.get("padding_mode", "zeros")
        if padding_mode not in PADDING_MODES:
            raise ctx.error("padding_mode", f"expected one of {', '.join(PADDING_MODES)} (nn.{KINDS[kind].module}'s), "
                                            f"got {padding_mode!r}")
        in_channels = take_int(raw, "in_channels", ctx, minimum=1)
        out_channels = take_int(raw, "out_channels", ctx, minimum=1)
        kernel = take_window(raw, "kernel_size", ctx)
        stride = take_window(raw, "stride", ctx, default=1)
        dilation = take_window(raw, "dilation", ctx, default=1)
        groups = take_int(raw, "groups", ctx, default=1, minimum=1)
        if in_channels % groups or out_channels % groups:
            raise ctx.error("groups", f"{groups} groups do not divide in_channels {in_channels} and out_channels "
                                      f"{out_channels} (PyTorch needs both divisible)")
        same = False
        padding_raw = raw.get("padding", 0)
        if isinstance(padding_raw, str):
            if transposed:
                raise ctx.error("padding", f"expected an integer or a list of {dims} integers, got {padding_raw!r} "
                                           f"(a string padding is for plain convolutions; {kind} takes integers)")
            if padding_raw not in ("same", "valid"):
                raise ctx.error("padding", f"expected 'same', 'valid', an integer or a list of {dims} integers, "
                                           f"got {padding_raw!r}")
            if padding_raw == "same" and any(s != 1 for s in stride):
                raise ctx.error("padding", f"'same' needs stride 1 (PyTorch refuses it for strided convolutions), "
                                           f"got stride {list(stride)}")
            same = padding_raw == "same"
            # 'same': a total of d(k - 1) per axis, the odd one after (PyTorch's); 'valid': none.
            padding = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel)) if same else (0,) * dims
        else:
            padding = take_window(raw, "padding", ctx, default=0, minimum=0)
        output_padding = take_window(raw, "output_padding", ctx, default=0, minimum=0)
        for op_, st, d in zip(output_padding, stride, dilation):
            if op_ >= st and op_ >= d:
                raise ctx.error("output_padding", f"must be smaller than stride {list(stride)} or dilation "
                                                  f"{list(dilation)} (PyTorch's rule), got {list(output_padding)}")
        return cls(kind=kind, in_channels=in_channels, out_channels=out_channels, kernel_size=kernel,
                   stride=stride, padding=padding, output_padding=output_padding,
                   bias=take_bool(raw, "bias", ctx, default=True), dilation=dilation, groups=groups, same=same,
                   padding_mode=padding_mode)

    def input_refusal(self, shape: Shape) -> str | None:
        """Why PyTorch refuses input ``shape`` for this producer's padding mode (a reflect padding as large as
        the input, a circular one larger), None where it takes it."""
        largest = PADDING_MODES.get(self.padding_mode)
        for axis, size in enumerate(shape[2:]):
            most = max(self.padding[axis], self.padding_end[axis])
            if largest is not None and most > largest(size):
                return (f"padding_mode {self.padding_mode!r} pads {most} beside an input size of {size} (PyTorch "
                        f"takes at most {largest(size)})")
        return None

    def out_shape(self, shape: Shape) -> Shape:
        """PyTorch's output shape; a non-positive size means the input is too small."""
        spatial = []
        for i, size in enumerate(shape[2:]):
            k, s, d = self.kernel_size[i], self.stride[i], self.dilation[i]
            before, after = self.padding[i], self.padding_end[i]
            if self.transposed:
                spatial.append((size - 1) * s - before - after + d * (k - 1) + self.output_padding[i] + 1)
            else:
                spatial.append((size + before + after - d * (k - 1) - 1) // s + 1)
        return (shape[0], shape[1] if self.any_channels else self.out_channels, *spatial)

    def geometry(self) -> dict[str, Any]:
        """The convolution as the kernels that compute it take it: every window 3-D (a 2-D one
        padded with a leading 1, a 1-D one with two), its weight count, and what those kernels do not
        compute (dilation, groups, a padding after an axis unlike the one before: geometry_refusal)."""
        pad = 3 - self.spatial_dims
        ones, zeros = (1,) * pad, (0,) * pad
        return {"cin": self.in_channels, "cout": self.out_channels, "transposed": self.transposed,
                "spatial_dims": self.spatial_dims,
                "kernel": ones + tuple(self.kernel_size), "stride": ones + tuple(self.stride),
                "padding": zeros + tuple(self.padding), "padding_end": zeros + tuple(self.padding_end),
                "output_padding": zeros + tuple(self.output_padding),
                "dilation": ones + tuple(self.dilation), "groups": self.groups,
                "weights": self.in_channels // self.groups * self.out_channels * math.prod(self.kernel_size),
                **({"padding_mode": self.padding_mode} if self.padding_mode != "zeros" else {})}

    def inside_refusal(self) -> str | None:
        """Why the kernels that compute the convolution inside do not take this producer for what it
        is (dilation, groups, asymmetric padding: geometry_refusal); None where that does not stand in
        their way (each world has its own further conditions)."""
        return geometry_refusal(self.geometry())

    def _arguments(self, padding_same: bool, padded: bool = False) -> str:
        """The keyword arguments after kernel_size (module) or the weights and bias (functional), as
        PyTorch names them: those left at their defaults (dilation 1, one group) are left out; ``padded``:
        the input is padded already (F.pad, a padding mode's), so none."""
        padding = str((0,) * self.spatial_dims) if padded else "'same'" if padding_same else str(self.padding)
        extra = f", output_padding={self.output_padding}" if self.transposed else ""
        if any(d != 1 for d in self.dilation):
            extra += f", dilation={self.dilation}"
        if self.groups != 1:
            extra += f", groups={self.groups}"
        return f"stride={self.stride}, padding={padding}{extra}"

    def module_code(self) -> str:
        if not self.convolves:
            return "nn.Identity()"
        mode = f", padding_mode={self.padding_mode!r}" if self.padding_mode != "zeros" else ""
        return (f"nn.{KINDS[self.kind].module}({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}, {self._arguments(self.same)}, bias={self.bias}{mode})")

    def functional_code(self, x: str, module: str, bias: str, forward_form: bool = False) -> str:
        """Python calling the convolution with ``bias`` (an expression, or None); a transposed one in
        its forward form (``has_forward_form``) if asked. Padding 'same' as the string where it is
        asymmetric (PyTorch pads the odd one after), as its integers where they are symmetric."""
        if not self.convolves:
            return x
        if forward_form:
            assert self.has_forward_form, "only a stride-1 transposed convolution has a forward form"
            flip = tuple(range(2, 2 + self.spatial_dims))
            padding = tuple(d * (k - 1) - p for k, p, d in zip(self.kernel_size, self.padding, self.dilation))
            dilation = f", dilation={self.dilation}" if any(d != 1 for d in self.dilation) else ""
            return (f"F.conv{self.spatial_dims}d({x}, {module}.weight.flip({flip}).transpose(0, 1), {bias}, "
                    f"padding={padding}{dilation})")
        if self.padding_mode != "zeros":  # as nn.Conv*d: the input padded by F.pad, then no padding
            pads = tuple(p for before, after in zip(reversed(self.padding), reversed(self.padding_end))
                         for p in (before, after))
            return (f"F.{self.kind}(F.pad({x}, {pads}, mode={self.padding_mode!r}), {module}.weight, {bias}, "
                    f"{self._arguments(False, padded=True)})")
        return f"F.{self.kind}({x}, {module}.weight, {bias}, {self._arguments(self.asymmetric)})"

    def canonical(self) -> dict[str, Any]:
        """Everything that changes the result, for cache keys: the fields added later only where they
        differ from what every earlier config had, so those keys stay as they were."""
        out = dataclasses.asdict(self)
        if all(d == 1 for d in self.dilation):
            del out["dilation"]
        if self.groups == 1:
            del out["groups"]
        if not self.asymmetric:  # a symmetric 'same' is its integers: the same result, the same key
            del out["same"]
        if not self.any_channels:
            del out["any_channels"]
        if self.padding_mode == "zeros":
            del out["padding_mode"]
        return out
