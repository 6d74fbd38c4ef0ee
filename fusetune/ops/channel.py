"""Norms over the channels of each position: ``F.normalize(x, p=2, dim=1)`` and a layer norm over dim 1.

Real models write them right after a convolution (ConvNeXt's LayerNorm2d, timm's and torchvision's
``LayerNorm2d``, a permute to channels last around ``nn.LayerNorm(C)``, L2-normalised embeddings). Like a
softmax over the channels they need every channel of a position before any value is written, so they take
the same slot (the reduce slot: a map over the channels ends the region's reductions) and the same kernel
family, ``channel_softmax``: one fold of a position's channels into an accumulator, then each value mapped
from it. What differs per op is data, ``CHANNEL_MAPS``: the accumulator (a ``KernelReduction`` row, as the
reduction modes are) and the CUDA map of a value from it. ``tests/test_channel_norms.py`` compiles every row
on the host and compares it with PyTorch in float64.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, reject_unknown, take_int, take_number
from fusetune.ops.reductions import REDUCTIONS, KernelReduction

#: ``load(name, c)`` returns the CUDA expression of per-channel parameter ``name`` at channel expression ``c``.
ChannelLoader = Callable[[str, str], str]


@dataclasses.dataclass(frozen=True)
class ChannelMap:
    """One op of the channel family as the kernels compute it: ``fold`` folds a position's channels (step,
    merge, shuffle: the channels-last lanes), ``finish`` (an expression, "" for none) finishes the accumulator
    ``{acc}`` once a position (what its values' maps share: a reciprocal norm, a reciprocal deviation), and
    ``value`` maps a value ``{x}`` from it. ``{eps}`` is the op's epsilon as a float literal. Helpers are in
    ``fold.header``."""

    name: str
    fold: KernelReduction
    value: str
    finish: str = ""


_SHUFFLE = "__shfl_xor_sync(0xffffffffu, {acc}, {lane})"

#: Sum of squares (in double: templates/channel.cuh says why): the L2 norm is its square root.
SUMSQ = KernelReduction(mode="sumsq", acc="double", words=2, identity="0.0",
                        step="fma((double){x}, (double){x}, {acc})", merge="{a} + {b}", shuffle=_SHUFFLE, end="",
                        value="sqrt({acc})", header="channel.cuh")
#: Welford's count, mean and sum of squared deviations (in double; Chan's merge): the biased variance without
#: the cancellation of E[x^2] - E[x]^2.
MOMENTS = KernelReduction(mode="moments", acc="FtMoments", words=6, identity="ft_moments_identity()",
                          step="ft_moments_step({acc}, {x})", merge="ft_moments_merge({a}, {b})",
                          shuffle="ft_moments_shfl_xor({acc}, {lane})", end="", value="{acc}.mean",
                          header="channel.cuh")

#: op kind -> how channel_softmax computes it.
CHANNEL_MAPS: dict[str, ChannelMap] = {m.name: m for m in (
    ChannelMap("softmax", REDUCTIONS["logsumexp"], "ft_softmax_of({x}, {acc})", "ft_softmax_end({acc})"),
    ChannelMap("log_softmax", REDUCTIONS["logsumexp"], "ft_log_softmax_of({x}, {acc})"),
    ChannelMap("normalize", SUMSQ, "ft_l2_normalize_of({x}, {acc})", "ft_l2_normalize_end({acc}, {eps})"),
    ChannelMap("channel_layer_norm", MOMENTS, "ft_layer_norm_of({x}, {acc})", "ft_moments_end({acc}, {eps})"),
)}


def _float_literal(value: float) -> str:
    return f"{float(value)!r}f"


def channel_finish(op: Op, acc: str) -> str:
    """The statement that finishes a position's accumulator ``acc`` once its channels are folded ("" for an op
    whose values read the fold as it is: softmax's)."""
    row = CHANNEL_MAPS[op.kind]
    if not row.finish:
        return ""
    return f"{acc} = {row.finish.format(acc=acc, eps=_float_literal(getattr(op, 'eps', 0.0)))};"


def channel_value(op: Op, x: str, acc: str, c: str, load: ChannelLoader) -> str:
    """The CUDA expression of value ``x`` (at channel ``c``) after ``op`` over its position's channels, given
    the position's finished accumulator ``acc`` (channel_finish): the row's map, then a layer norm's weight and
    bias."""
    expr = CHANNEL_MAPS[op.kind].value.format(x=x, acc=acc)
    weight, bias = getattr(op, "weight", None), getattr(op, "bias", None)
    if weight is not None and bias is not None:
        return f"fmaf({expr}, {load(weight, c)}, {load(bias, c)})"
    if weight is not None:
        return f"({expr}) * {load(weight, c)}"
    if bias is not None:
        return f"({expr}) + {load(bias, c)}"
    return expr


def _take_dim(raw: Mapping[str, Any], ctx: OpContext, default: Any = ...) -> int:
    rank = len(ctx.in_shape)
    dim = take_int(raw, "dim", ctx, default=default)
    if not -rank <= dim < rank:
        raise ctx.error("dim", f"expected a dim in [{-rank}, {rank - 1}] for an input of rank {rank}, got {dim}")
    return dim % rank


@dataclasses.dataclass(frozen=True)
class ChannelNorm(Op):
    """A norm over one dim of each position, every value of which is needed before any is written. The
    kernels take it over the channels (dim 1) alone (``kernel_refusal``); elsewhere it runs in PyTorch."""

    role: ClassVar[str] = "channel_norm"
    dim: int = 1
    eps: float = 1e-5

    def params(self) -> tuple[str, ...]:
        return ()

    def kernel_refusal(self) -> str | None:
        """Why no kernel computes it wherever it stands, None where channel_softmax may."""
        if self.dim != 1:
            return (f"a {self.kind} over dim {self.dim} (the kernels normalise over the channels, dim 1, only); "
                    "it runs in PyTorch")
        return None


@dataclasses.dataclass(frozen=True)
class Normalize(ChannelNorm):
    """``F.normalize(x, p, dim, eps)``: x / max(||x||_p, eps) over ``dim``. The kernels take p = 2 only."""

    kind: ClassVar[str] = "normalize"
    p: float = 2.0
    eps: float = 1e-12

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["p", "dim", "eps"], ctx)
        return cls(p=float(take_number(raw, "p", ctx, default=2.0, positive=True)), dim=_take_dim(raw, ctx, 1),
                   eps=float(take_number(raw, "eps", ctx, default=1e-12, positive=True)))

    def kernel_refusal(self) -> str | None:
        if self.p != 2.0:
            return f"a normalize with p={self.p!r} (the kernels take the L2 norm, p=2, only); it runs in PyTorch"
        return super().kernel_refusal()

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"F.normalize({x}, p={self.p!r}, dim={self.dim}, eps={self.eps!r})"


@dataclasses.dataclass(frozen=True)
class ChannelLayerNorm(ChannelNorm):
    """A layer norm over the channels of each position (dim 1): ``F.layer_norm`` of the channels-last view,
    (x - mean) / sqrt(var + eps) * weight + bias with the biased variance, as nn.LayerNorm(C) between two
    permutes, timm's and torchvision's LayerNorm2d and ConvNeXt's by hand compute it. ``weight`` and
    ``bias`` name declared per-channel parameters (``parameters:``), each optional (F.layer_norm's names).
    Over the chain's channels alone (the convolution's, or half of them after a glu over the channels; config.py
    refuses it where another op before changed them): its parameters hold one value per channel there."""

    kind: ClassVar[str] = "channel_layer_norm"
    weight: str | None = None
    bias: str | None = None
    eps: float = 1e-5

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["weight", "bias", "eps"], ctx)
        names: dict[str, str | None] = {}
        for key in ("weight", "bias"):
            name = raw.get(key)
            if name is not None:
                decl = ctx.parameters.get(name) if isinstance(name, str) else None
                if decl is None:
                    declared = ", ".join(sorted(ctx.parameters)) or "none declared"
                    raise ctx.error(key, f"expected the name of a declared parameter, got {name!r}; declared "
                                         f"parameters: {declared}")
                if decl.scalar:
                    raise ctx.error(key, f"parameter '{name}' is a scalar; a layer norm's {key} holds one value "
                                         "per channel (shape: per_channel)")
            names[key] = name
        return cls(weight=names["weight"], bias=names["bias"],
                   eps=float(take_number(raw, "eps", ctx, default=1e-5, positive=True)))

    def params(self) -> tuple[str, ...]:
        return tuple(name for name in (self.weight, self.bias) if name is not None)

    def forward_code(self, x: str, attr: str | None) -> str:
        weight = f"self.{self.weight}.reshape(-1)" if self.weight else "None"
        bias = f"self.{self.bias}.reshape(-1)" if self.bias else "None"
        return (f"F.layer_norm({x}.movedim({self.dim}, -1), ({x}.shape[{self.dim}],), {weight}, {bias}, "
                f"eps={self.eps!r}).movedim(-1, {self.dim})")
