"""Normalisations: each needs statistics over a scope before it can apply.

Every scope is a combination of per-(sample, channel) sums, which is what lets one
statistics kernel serve all of them: batch norm combines over samples, group norm over
the channels of a group, instance norm takes them as they are.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

from fusetune.errors import count
from fusetune.ops.base import Op, OpContext, Shape, is_int, reject_unknown, take_bool, take_int, take_number


@dataclasses.dataclass(frozen=True)
class Norm(Op):
    role: ClassVar[str] = "norm"
    #: "batch" (per channel over N and space), "group" (per sample and group),
    #: "instance" (per sample and channel), or "running" (eval-mode batch norm: no statistics pass).
    scope: ClassVar[str]
    eps: float = 1e-5
    affine: bool = True

    def groups_of(self, channels: int) -> int:
        """Channels per statistics group (1 except for group norm)."""
        return 1

    @property
    def channel_affine(self) -> bool:
        """Whether finalize folds a per-channel weight and bias (``norm_weight[c]``, ``norm_bias[c]``) into
        the plane's map A*v + B."""
        return self.affine

    @property
    def centres(self) -> bool:
        """Whether its map is ``v - mean`` alone (a mean centring, MeanCentre: finalize's A = 1, B = -mean),
        not a normalisation by the variance."""
        return False

    def outside_scopes(self) -> str:
        """Why its statistics are none of the kernels' scopes (plan._kernel_refusal), where they are not."""
        return f"a {self.kind} with statistics per {self.scope} runs after this region"

    @property
    def element_affine(self) -> str:
        """How the main kernel indexes a per-element weight and bias after the plane's map: "" (none, the
        per-channel norms), "channels" (one per element of (C, *spatial): ``c * S + s``), "spatial" (one
        per spatial position, shared by the channels: ``s``). A layer norm's (LayerNorm)."""
        return ""

    @property
    def element_plane(self) -> int:
        """S of ``c * S + s`` where element_affine is "channels": the positions of a channel's plane, fixed by the
        norm's shape, so a kernel may index with it as a constant (each channel's weight and bias at a constant
        offset from one address, not an address per channel); 0 otherwise."""
        return 0


@dataclasses.dataclass(frozen=True)
class BatchNorm(Norm):
    kind: ClassVar[str] = "batch_norm"
    momentum: float = 0.1
    training: bool = True

    @property
    def scope(self) -> str:  # type: ignore[override]
        return "batch" if self.training else "running"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["eps", "momentum", "affine", "training"], ctx)
        return cls(eps=float(take_number(raw, "eps", ctx, default=1e-5, positive=True)),
                   momentum=float(take_number(raw, "momentum", ctx, default=0.1, positive=True)),
                   affine=take_bool(raw, "affine", ctx, default=True),
                   training=take_bool(raw, "training", ctx, default=True))

    def check_shape(self, shape: Shape, error) -> None:
        if self.training and shape[0] * _spatial_size(shape) < 2:
            error("", f"batch norm in training mode needs more than one value per channel, got input {list(shape)}")

    def module_code(self, channels: int, spatial_dims: int) -> str:
        return (f"nn.BatchNorm{spatial_dims}d({channels}, eps={self.eps!r}, momentum={self.momentum!r}, "
                f"affine={self.affine})")

    def forward_code(self, x: str, attr: str | None) -> str:
        if self.training:
            return f"self.{attr}({x})"
        return self.eval_code(x, attr)

    def eval_code(self, x: str, attr: str | None, repeat: int = 1) -> str:
        """Eval-mode semantics whatever mode the module is in: running statistics only; each of the module's
        per-channel tensors read ``repeat`` times (torch.repeat_interleave) where the norm stands before a pixel
        shuffle (regions.shuffle_commutes)."""
        m = f"self.{attr}"
        again = f".repeat_interleave({repeat}, 0)" if repeat > 1 else ""
        weight, bias = (f"{m}.weight{again}", f"{m}.bias{again}") if self.affine or not again else ("None", "None")
        return (f"F.batch_norm({x}, {m}.running_mean{again}, {m}.running_var{again}, {weight}, {bias}, "
                f"training=False, eps={self.eps!r})")


@dataclasses.dataclass(frozen=True)
class GroupNorm(Norm):
    kind: ClassVar[str] = "group_norm"
    scope: ClassVar[str] = "group"
    groups: int = 1

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        """``num_groups`` as nn.GroupNorm names it; ``groups`` is kept as an alias."""
        reject_unknown(raw, ["num_groups", "groups", "eps", "affine"], ctx)
        if "num_groups" in raw and "groups" in raw:
            raise ctx.error("groups", "give num_groups or its alias groups, not both")
        key = "groups" if "groups" in raw else "num_groups"
        groups = take_int(raw, key, ctx, minimum=1)
        channels = ctx.in_shape[1]
        if channels % groups:
            raise ctx.error(key, f"expected a divisor of the {count(channels, 'channel')}, got {groups}")
        return cls(groups=groups, eps=float(take_number(raw, "eps", ctx, default=1e-5, positive=True)),
                   affine=take_bool(raw, "affine", ctx, default=True))

    def check_shape(self, shape: Shape, error) -> None:
        if shape[1] % self.groups:
            error("groups", f"{count(self.groups, 'group')} do not divide {count(shape[1], 'channel')}")
        elif shape[0] * self.groups_of(shape[1]) * _spatial_size(shape) < 2:
            # PyTorch's own check (F.group_norm counts N * C/groups * spatial values): a group of one value is taken
            # where the batch has more than one sample (its output is the bias), refused where it has one.
            error("", f"group norm needs more than one value per group (N * C/groups * spatial > 1, as PyTorch "
                      f"checks), got input {list(shape)} with {count(self.groups, 'group')}")

    def groups_of(self, channels: int) -> int:
        return channels // self.groups

    def module_code(self, channels: int, spatial_dims: int) -> str:
        return f"nn.GroupNorm({self.groups}, {channels}, eps={self.eps!r}, affine={self.affine})"

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"self.{attr}({x})"


@dataclasses.dataclass(frozen=True)
class InstanceNorm(Norm):
    kind: ClassVar[str] = "instance_norm"
    scope: ClassVar[str] = "instance"
    affine: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["eps", "affine"], ctx)
        return cls(eps=float(take_number(raw, "eps", ctx, default=1e-5, positive=True)),
                   affine=take_bool(raw, "affine", ctx, default=False))

    def check_shape(self, shape: Shape, error) -> None:
        if _spatial_size(shape) < 2:
            error("", f"instance norm needs more than one spatial value per channel, got input {list(shape)}")

    def module_code(self, channels: int, spatial_dims: int) -> str:
        return f"nn.InstanceNorm{spatial_dims}d({channels}, eps={self.eps!r}, affine={self.affine})"

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"self.{attr}({x})"


def _spatial_size(shape: Shape) -> int:
    size = 1
    for s in shape[2:]:
        size *= s
    return size


@dataclasses.dataclass(frozen=True)
class LayerNorm(Norm):
    """nn.LayerNorm over the trailing dims ``normalized_shape`` names (their sizes, as PyTorch takes
    them): statistics per sample over those dims, an affine map per element of them. Over (C, *spatial)
    its statistics are group norm's with one group (scope "group", every channel in it); over every spatial
    dim they are instance norm's (scope "instance"): the statistics pass and finalize serve it as they
    serve those, finalize's map without an affine, and the main kernels that index by position
    (worlds/facts.py ELEMENT_AFFINE_STAGES) apply the per-element weight and bias after the map
    (``element_affine``). Over its last k dims alone (scope "layer": fewer trailing dims than every spatial
    one) no region of the convolution's shape computes it; a later region does, on the plane view of its input
    (fusetune/views.py), where it is ``on_plane()``: an instance norm over the view's one spatial dim."""

    kind: ClassVar[str] = "layer_norm"
    normalized_shape: tuple[int, ...] = ()
    #: The rank of its input (N, C, *spatial): which dims normalized_shape names, so which scope it is.
    in_rank: int = 0
    #: On a plane view (``on_plane``) over more than one dim: the chain's normalized_shape, which its module
    #: (weight and bias of that shape, the chain's very tensors) keeps; () elsewhere.
    module_shape: tuple[int, ...] = ()

    def on_plane(self) -> "LayerNorm":
        """The same norm on the plane view (prod(S[:-k]), 1, prod(S[-k:])) of its input: over the view's one
        spatial dim, its weight and bias (of the chain's shape S[-k:], contiguous) read flat in that order."""
        size = 1
        for s in self.normalized_shape:
            size *= s
        module = self.module_shape or (self.normalized_shape if len(self.normalized_shape) > 1 else ())
        return dataclasses.replace(self, normalized_shape=(size,), in_rank=3, module_shape=module)

    def canonical(self) -> dict[str, Any]:
        # module_shape came after the first cache keys: left out where empty, they stay as they were.
        out = super().canonical()
        if not self.module_shape:
            del out["module_shape"]
        return out

    @property
    def scope(self) -> str:  # type: ignore[override]
        over = len(self.normalized_shape)
        if self.in_rank >= 3 and over == self.in_rank - 1:
            return "group"
        if self.in_rank >= 3 and over == self.in_rank - 2:
            return "instance"
        return "layer"

    def outside_scopes(self) -> str:
        return (f"a {self.kind} over {list(self.normalized_shape)}, fewer trailing dims than every spatial one, runs "
                "after this region (in a later one, on the plane view of its input that makes those dims its "
                "spatial dim)")

    def groups_of(self, channels: int) -> int:
        """Over (C, *spatial) one group holds every channel."""
        return channels if self.scope == "group" else 1

    @property
    def channel_affine(self) -> bool:
        return False  # its affine is per element, applied after finalize's map

    @property
    def element_affine(self) -> str:
        if not self.affine or self.scope == "layer":
            return ""
        return "channels" if self.scope == "group" else "spatial"

    @property
    def element_plane(self) -> int:
        return math.prod(self.normalized_shape[1:]) if self.element_affine == "channels" else 0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["normalized_shape", "eps", "elementwise_affine"], ctx)
        value = raw.get("normalized_shape")
        sizes = [value] if is_int(value) else value
        if (not isinstance(sizes, list) or not sizes or len(sizes) >= len(ctx.in_shape)
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
            raise ctx.error("normalized_shape", f"expected the sizes of the input's trailing dims (at most "
                                                f"{len(ctx.in_shape) - 1}), got {value!r}")
        return cls(normalized_shape=tuple(sizes), eps=float(take_number(raw, "eps", ctx, default=1e-5, positive=True)),
                   affine=take_bool(raw, "elementwise_affine", ctx, default=True), in_rank=len(ctx.in_shape))

    def check_shape(self, shape: Shape, error) -> None:
        trailing = tuple(shape[len(shape) - len(self.normalized_shape):])
        if trailing != self.normalized_shape:
            error("normalized_shape", f"{list(self.normalized_shape)} is not the trailing sizes of the input "
                                      f"{list(shape)}")

    def module_code(self, channels: int, spatial_dims: int) -> str:
        shape = list(self.module_shape or self.normalized_shape)
        return f"nn.LayerNorm({shape}, eps={self.eps!r}, elementwise_affine={self.affine})"

    def forward_code(self, x: str, attr: str | None) -> str:
        if not self.module_shape:
            return f"self.{attr}({x})"
        # on a plane view: the module's weight and bias (of the chain's shape) read flat, as the kernels do
        m = f"self.{attr}"
        return (f"F.layer_norm({x}, {tuple(self.normalized_shape)!r}, "
                f"{m}.weight.reshape(-1) if {m}.weight is not None else None, "
                f"{m}.bias.reshape(-1) if {m}.bias is not None else None, eps={self.eps!r})")


#: A mean centring's scopes, by the dims of an (N, C, *spatial) input it averages over: each is a union of
#: (sample, channel) planes, so the statistics pass's per-plane sums serve it as they serve the norms.
_CENTRE_SCOPES = {"instance": "every spatial dim: a plane", "group": "(C, *spatial): a sample",
                  "batch": "the batch and every spatial dim: a channel"}


@dataclasses.dataclass(frozen=True)
class MeanCentre(Norm):
    """``x - x.mean(dim, keepdim=True)``, as a config writes it: ``{op: sub, by: {op: mean, dim: [...],
    keepdim: true}}`` (Sub.parse hands such an entry here). A barrier like a norm that needs only the mean:
    over every spatial dim its statistics are instance norm's (scope "instance"), over (C, *spatial) group
    norm's with one group ("group"), over the batch and every spatial dim batch norm's ("batch", without
    running statistics); finalize's map is then ``v - mean`` (A = 1, B = -mean: ``centres``) and the main
    kernels apply it as any norm's. Over its input's last k dims alone (fewer than every spatial one) a later
    region takes it on the plane view of its input (``on_plane``); over other dims it runs in PyTorch."""

    kind: ClassVar[str] = "sub"
    affine: bool = False
    #: The dims the mean is over (sorted, non-negative), and the rank of the input they are dims of.
    dims: tuple[int, ...] = ()
    in_rank: int = 0

    @property
    def centres(self) -> bool:
        return True

    @property
    def scope(self) -> str:  # type: ignore[override]
        spatial = tuple(range(2, self.in_rank))
        if self.in_rank >= 3 and self.dims == spatial:
            return "instance"
        if self.in_rank >= 3 and self.dims == (1, *spatial):
            return "group"
        if self.in_rank >= 3 and self.dims == (0, *spatial):
            return "batch"
        return "dims"

    def groups_of(self, channels: int) -> int:
        return channels if self.scope == "group" else 1

    @property
    def trailing(self) -> bool:
        """Whether its dims are its input's last k, without the batch dim: a plane view makes them one."""
        return 0 not in self.dims and self.dims == tuple(range(self.in_rank - len(self.dims), self.in_rank))

    def on_plane(self) -> "MeanCentre":
        """The same centring on the plane view (prod(S[:-k]), 1, prod(S[-k:])) of its input: over its one
        spatial dim."""
        return dataclasses.replace(self, dims=(2,), in_rank=3)

    def outside_scopes(self) -> str:
        where = ("in a later one, on the plane view of its input" if self.trailing
                 else "in PyTorch: they are not its last dims, which a plane view would make its spatial dim")
        return (f"a mean centring over dims {list(self.dims)} of a rank-{self.in_rank} input averages over none of "
                f"their sets ({'; '.join(_CENTRE_SCOPES.values())}): it runs after this region ({where})")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["by"], ctx)
        by = raw["by"]
        sub = dataclasses.replace(ctx, key=f"{ctx.key}.by")
        spelled = "{op: mean, dim: [...], keepdim: true} (x - x.mean(dim, keepdim=True))"
        if by.get("op") != "mean":
            raise sub.error("op", f"expected {spelled}, got {dict(by)!r}")
        reject_unknown(by, ["dim", "keepdim"], sub)
        if by.get("keepdim") is not True:
            raise sub.error("keepdim", f"expected true: without it the mean's shape does not broadcast back over "
                                       f"the dims it averaged ({spelled}); got {by.get('keepdim')!r}")
        rank = len(ctx.in_shape)
        value = by.get("dim")
        values = [value] if is_int(value) else value
        if (not isinstance(values, list) or not values
                or any(isinstance(v, bool) or not isinstance(v, int) or not -rank <= v < rank for v in values)
                or len({v % rank for v in values}) != len(values)):
            raise sub.error("dim", f"expected a dim or a list of distinct dims of the rank-{rank} input "
                                   f"(in [{-rank}, {rank - 1}]), got {value!r}")
        return cls(dims=tuple(sorted(v % rank for v in values)), in_rank=rank)

    def canonical(self) -> dict[str, Any]:
        return {"kind": self.kind, "by": {"op": "mean", "dim": list(self.dims), "keepdim": True},
                "in_rank": self.in_rank}

    def forward_code(self, x: str, attr: str | None) -> str:
        dims = self.dims[0] if len(self.dims) == 1 else self.dims
        return f"({x} - {x}.mean(dim={dims}, keepdim=True))"
