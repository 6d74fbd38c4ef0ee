"""Normalisations: each needs statistics over a scope before it can apply.

Every scope is a combination of per-(sample, channel) sums, which is what lets one
statistics kernel serve all of them: batch norm combines over samples, group norm over
the channels of a group, instance norm takes them as they are.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_bool, take_int, take_number


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
    def element_affine(self) -> str:
        """How the main kernel indexes a per-element weight and bias after the plane's map: "" (none, the
        per-channel norms), "channels" (one per element of (C, *spatial): ``c * S + s``), "spatial" (one
        per spatial position, shared by the channels: ``s``). A layer norm's (LayerNorm)."""
        return ""


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
        # Eval-mode semantics whatever mode the module is in: running statistics only.
        m = f"self.{attr}"
        return (f"F.batch_norm({x}, {m}.running_mean, {m}.running_var, {m}.weight, {m}.bias, "
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
            raise ctx.error(key, f"expected a divisor of the {channels} channels, got {groups}")
        return cls(groups=groups, eps=float(take_number(raw, "eps", ctx, default=1e-5, positive=True)),
                   affine=take_bool(raw, "affine", ctx, default=True))

    def check_shape(self, shape: Shape, error) -> None:
        if shape[1] % self.groups:
            error("groups", f"{self.groups} groups do not divide {shape[1]} channels")

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
    (``element_affine``). Over fewer trailing dims (scope "layer") no kernel computes it: it runs in
    PyTorch."""

    kind: ClassVar[str] = "layer_norm"
    normalized_shape: tuple[int, ...] = ()
    #: The rank of its input (N, C, *spatial): which dims normalized_shape names, so which scope it is.
    in_rank: int = 0

    @property
    def scope(self) -> str:  # type: ignore[override]
        over = len(self.normalized_shape)
        if self.in_rank >= 3 and over == self.in_rank - 1:
            return "group"
        if self.in_rank >= 3 and over == self.in_rank - 2:
            return "instance"
        return "layer"

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

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["normalized_shape", "eps", "elementwise_affine"], ctx)
        value = raw.get("normalized_shape")
        sizes = [value] if isinstance(value, int) and not isinstance(value, bool) else value
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
        return f"nn.LayerNorm({list(self.normalized_shape)}, eps={self.eps!r}, elementwise_affine={self.affine})"

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"self.{attr}({x})"
