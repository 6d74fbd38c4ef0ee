"""Extra inputs that broadcast over the chain's positions (``inputs: [{name: temb, shape: per_sample_channel}]``).

A diffusion UNet's conditioning adds ``temb[:, :, None, None]`` (one value per sample and channel) to a
convolution's output; a per-sample scale is (N, 1, 1, 1); a per-channel tensor passed to forward is
(1, C, 1, 1). The kernels read such an input where they store each element (as a full-shape input, at the
stored index ``o``), at the element's (n, c) instead: c is the store site's channel argument, n the stored
index over the stored tensor's size a sample. The value depends on (n, c) alone, so the input is read as
PyTorch broadcasts it, whatever the stored tensor's memory layout.
"""

from __future__ import annotations

import dataclasses

from fusetune.errors import PlanError

Shape = tuple[int, ...]

#: The default kind: the chain's own shape where the input is read, read at the stored index.
FULL = "full"


@dataclasses.dataclass(frozen=True)
class InputKind:
    """How an input broadcasts against the chain's shape (N, C, spatial...) where an op reads it."""

    name: str
    per_sample: bool  # its dim 0 is N (else 1)
    per_channel: bool  # its dim 1 is C (else 1)
    what: str  # in words, for messages and the README

    def shape(self, chain: Shape) -> Shape:
        """The input's shape against the chain's at the reader: (N or 1, C or 1, 1, ...)."""
        return ((chain[0] if self.per_sample else 1), (chain[1] if self.per_channel else 1)) + (1,) * (len(chain) - 2)

    def index(self, at: str, channel: str, sample_size: str, channels: str) -> str:
        """The CUDA index of the element's value, from its stored index ``at``, its channel ``channel`` and the
        stored tensor's size a sample and channel count (CUDA expressions)."""
        n = f"{at} / ({sample_size})"
        if self.per_sample and self.per_channel:
            return f"{n} * ({channels}) + {channel}"
        return n if self.per_sample else channel


#: Every broadcast kind a config may declare (``shape:`` of an ``inputs:`` entry), by name.
KINDS: dict[str, InputKind] = {k.name: k for k in (
    InputKind("per_sample_channel", True, True, "one value per sample and channel, (N, C, 1, ...): a UNet's temb"),
    InputKind("per_sample", True, False, "one value per sample, (N, 1, 1, ...)"),
    InputKind("per_channel", False, True, "one value per channel, (1, C, 1, ...)"),
)}
#: The ``shape:`` values of an ``inputs:`` entry: the chain's own, or a kind of KINDS.
SHAPES = (FULL, *KINDS)


def kind_of(spec, name: str | None) -> InputKind | None:
    """The broadcast kind of input ``name`` of a spec (ProblemSpec.input_kinds), None for a full-shape one."""
    if name is None:
        return None
    return KINDS.get(dict(getattr(spec, "input_kinds", ())).get(name, FULL))


def kind_of_shape(shape: Shape, chain: Shape) -> str | None:
    """The kind whose shape against ``chain`` is ``shape`` (FULL where they are equal), None where none is:
    the importer's inference from an example tensor. Full wins where both hold (every dim already 1)."""
    if tuple(shape) == tuple(chain):
        return FULL
    if len(shape) != len(chain) or len(chain) < 3:
        return None
    for kind in KINDS.values():
        if tuple(shape) == kind.shape(tuple(chain)):
            return kind.name
    return None


#: What the stored tensor is, a sample, at a chain's store sites, as the kernels' arguments spell it: its
#: channels and its size a sample (FtArgs: C the producer's channels, OD/OH/OW its spatial sizes after the pool).
_POOLED = ("a.C", "a.C * a.OD * a.OH * a.OW")
#: By the family that ends the region, where the final chain stores: after a channel reduction one channel
#: at every position, after a reduction over space one value a channel (finalize's too: family None); a softmax
#: over the channels keeps them.
_FINAL_STORED = {"window_map": _POOLED, "channel_softmax": _POOLED, "channel_reduce": ("1", "a.OD * a.OH * a.OW"),
                 "plane_reduce": ("a.C", "a.C"), None: ("a.C", "a.C")}


def stored(plan, chain: str) -> tuple[str, str]:
    """The stored tensor's channels and size a sample at ``chain``'s ("post" or "final") store sites."""
    if chain == "post":
        return _POOLED
    if plan.family not in _FINAL_STORED:
        raise PlanError(f"{plan.spec.path}: the kernels store no element of a region ending in {plan.family} "
                        "where a broadcast input could be read")
    return _FINAL_STORED[plan.family]


def stored_shape(plan, chain: str, shape: Shape) -> Shape:
    """The stored tensor's shape at ``chain``'s store sites at input shape ``shape`` as the kernels take it
    (_FINAL_STORED's reading of FtArgs: N and C the producer's, the spatial sizes after the pool)."""
    produced = plan.spec.producer.out_shape(shape)
    pooled = plan.pool.out_shape(produced)[2:] if plan.pool is not None else produced[2:]
    channels, size = stored(plan, chain)
    if channels == "1":
        return (produced[0], 1, *pooled)
    return (produced[0], produced[1], *((1,) * len(pooled) if size == "a.C" else pooled))


def check_plan(plan) -> None:
    """A PlanError where a broadcast input is read at a store site whose stored tensor is not the chain's
    shape there (the kernels would take the wrong (n, c)): it then runs after the region, in PyTorch."""
    kind = kind_of(plan.spec, plan.extra)
    if kind is None:
        return
    for chain, ops in (("post", plan.post), ("final", plan.final)):
        if not any(op.reads_input() == plan.extra for op in ops):
            continue
        for shape in plan.spec.shapes:
            through = plan.spec.shapes_through(shape)
            at = next(i for i, op in enumerate(plan.spec.epilogue) if op.reads_input() == plan.extra)
            kept = stored_shape(plan, chain, shape)
            # a channel reduction that drops its dim stores (N, spatial...): one value a position, the sample's
            # index as it was; its channel is gone, so only a per-sample input reads it
            one_channel = stored(plan, chain)[0] == "1"
            dropped = kept[:1] + kept[2:] if one_channel and not kind.per_channel else None
            if tuple(through[at]) not in (kept, dropped):
                reader = f"epilogue[{at}] ({plan.spec.epilogue[at].config_name})"
                raise PlanError(f"{plan.spec.path}: {reader} reads input '{plan.extra}' ({kind.what}) at shape "
                                f"{list(through[at])}, where the kernels store {list(kept)}: they read a broadcast "
                                "input at the (n, c) of the element they store; it runs after this region")


def read_index(plan, chain: str) -> str | None:
    """The CUDA index at which ``chain``'s ft_post/ft_final reads the region's broadcast input, from the stored
    index ``ft_stored`` and the channel ``c`` (common.cuh.j2); None where it reads a full-shape input or none."""
    kind = kind_of(plan.spec, plan.extra)
    ops = plan.post if chain == "post" else plan.final
    if kind is None or not any(op.reads_input() for op in ops):
        return None
    channels, size = stored(plan, chain)
    return kind.index("ft_stored", "c", size, channels)
