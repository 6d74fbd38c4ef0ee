"""Exact rewrites of a config's chain, before the planner splits it into regions.

The planner (fusetune/plan.py) fuses the longest prefix of the chain that the kernels take, as one
region of the form ``pre* [norm] mid* [pool] post* [reduce] final*``, and runs the rest in PyTorch
inside the generated ModelNew. Before that, these rules bring the chain into the forms the kernels
know wherever that is exact, so that what a user writes the PyTorch way (``x.mean(dim=[2, 3],
keepdim=True)``, ``torch.amax(x, 1, keepdim=True)``, two 2x2 max pools, ``nn.Dropout`` in eval mode)
lands in the kernels rather than in PyTorch:

  * dropout that is the identity (eval mode, or p = 0) is dropped;
  * reductions of one mode in a row, over disjoint dims, merge into one over all of them;
  * a reduction over every spatial dim (and a global adaptive pool) is the kernels' spatial
    reduction, which keeps the dims with size 1; a view drops them where ``keepdim`` is false;
  * a reduction over the channel dim with ``keepdim`` is the kernels' channel reduction and a view
    that puts the dim back; ``amax``/``amin`` are ``max``/``min`` (the same values);
  * a view before an op that maps each value alone moves after it (the values are the same);
  * non-overlapping pools of one mode in a row compose into one pool of the product window
    (floor mode: floor(floor(s / a) / b) = floor(s / ab) windows, each the same inputs);
  * a norm cancels a mean centring (x - x.mean(dims, keepdim=True)) before it whose sets hold its own:
    the centring is dropped;
  * instance norm (and a layer norm over every spatial dim, whose statistics are instance norm's) cancels
    a per-channel constant added before it (the producer's bias, through a chain of per-channel
    mul/div/add): the norm's step is marked, and the convolution runs without bias;
  * a spatial mean (or sum) right after a batch, group or instance norm is the norm's affine map applied
    to the plane's mean, which the statistics pass already has: the reduction's step is marked, and
    finalize computes the output (no main pass at all).

The rules are data (``RULES``: a name, a doc, and the function that applies it), run in order, and
the plan records which of them changed or marked the chain (``fusetune plan`` lists them).

Each rewritten op remembers the reference model's attribute it reads (a norm's module), so that the
part that runs in PyTorch uses the very modules of the reference.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from fusetune.config import ProblemSpec
from fusetune.ops import (Add, AdaptivePool, DimReduce, Div, Flatten, LayerNorm, MeanCentre, Mul, Norm, Op, Pool,
                          Reduce, SpatialReduce, Sub, Unsqueeze)
from fusetune.ops.reduce import KERNEL_MODES, Squeeze, kernel_mode
from fusetune.ops.reductions import REDUCTIONS
from fusetune.ops.slicing import Slice


@dataclasses.dataclass(frozen=True)
class Step:
    """One op of the rewritten chain: the op, the reference model's attribute it applies (None where
    it needs no module), and the config entries it stands for (for messages)."""

    op: Op
    attr: str | None
    entries: tuple[int, ...]
    #: What rules found of this step in its chain (CANCELS_BIAS, FROM_STATISTICS), for the planner.
    marks: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """The config entries this step stands for, as a user finds them: ``epilogue[3] (max_pool)``."""
        return " + ".join(f"epilogue[{i}]" for i in self.entries) + f" ({self.op.kind})"


def reference_attr(spec: ProblemSpec, i: int) -> str | None:
    """The attribute of the reference model that holds epilogue op ``i``'s module, None if it has none."""
    op = spec.epilogue[i]
    return f"{op.kind}_{i}" if op.module_code(spec.channels_at(i), spec.producer.spatial_dims) else None


#: A norm step marked so cancels the producer's bias: the convolution runs without it.
CANCELS_BIAS = "cancels_bias"
#: A reduction step marked so is computed by finalize from the norm's statistics: no main pass.
FROM_STATISTICS = "from_statistics"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One exact rewrite of a chain: ``apply`` returns the chain after it (the same steps where it does
    not apply); it may replace steps or mark them for the planner. A rule ``at_shapes`` would hold at the
    config's shapes only: where it fired, the generated model runs PyTorch's own forward at any other input
    shape (EXACT_AT). None does: an adaptive pool, whose windows depend on its input's size, is the kernels'
    own pool at any shape (ops/pool.py's ADAPTIVE_BOUNDS)."""

    name: str
    doc: str
    apply: Callable[[list[Step], ProblemSpec], list[Step]]
    at_shapes: bool = False


@dataclasses.dataclass(frozen=True)
class Rewritten:
    """A config's chain after the rules, and the names of those that changed or marked it."""

    steps: tuple[Step, ...]
    fired: tuple[str, ...]

    @property
    def at_shapes(self) -> bool:
        """Whether a rule that holds at the config's shapes only fired (Rule.at_shapes)."""
        return any(rule.at_shapes for rule in RULES if rule.name in self.fired)


def rewrite(spec: ProblemSpec) -> Rewritten:
    """The config's chain after every rule, in order (each rule runs over the whole chain once)."""
    steps = [Step(op, reference_attr(spec, i), (i,)) for i, op in enumerate(spec.epilogue)]
    fired: list[str] = []
    for rule in RULES:
        after = rule.apply(steps, spec)
        if after != steps:
            fired.append(rule.name)
        steps = after
    return Rewritten(tuple(steps), tuple(fired))


def affine(ops: Sequence[Op]) -> bool:
    """Whether a chain of elementwise ops is an affine map per channel (mul, div and add by numbers or
    per-channel parameters; not by the convolution's own output or an extra input)."""
    return all(isinstance(op, (Mul, Div, Add)) and not op.uses_producer() and op.reads_input() is None
               for op in ops)


def _ranked(rule: Callable[[list[Step], int], list[Step]]) -> Callable[[list[Step], ProblemSpec], list[Step]]:
    """A rule over the chain and its input's rank (the convolution output's)."""
    return lambda steps, spec: rule(steps, 2 + spec.producer.spatial_dims)


def _mark(step: Step, mark: str) -> Step:
    return dataclasses.replace(step, marks=step.marks + (mark,))


def _norm_cancels_bias(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """Instance norm (scope "instance": a layer norm over every spatial dim too) subtracts each (sample,
    channel) plane's mean, so a per-channel constant added before it (the producer's bias, through
    mul/div/add by numbers or per-channel parameters, which keep it a per-channel constant) cancels
    exactly: the first norm, where it is an instance norm after an affine chain, is marked; so is a mean
    centring over each channel's batch and spatial dims (a batch norm's own running statistics would see the
    bias). Not where an op reads the convolution's output (by: producer): that output has the bias."""
    if not spec.producer.bias or any(step.op.uses_producer() for step in steps):
        return steps
    first = next((i for i, step in enumerate(steps) if isinstance(step.op, Norm)), None)
    norm = steps[first].op if first is not None else None
    per_channel = norm is not None and (norm.scope == "instance" or (norm.scope == "batch" and norm.centres))
    if not per_channel or not affine([s.op for s in steps[:first]]):
        return steps
    return steps[:first] + [_mark(steps[first], CANCELS_BIAS)] + steps[first + 1:]


def _norm_cancels_centring(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """x - x.mean(dims) subtracts a constant that varies only along the dims it does not average; a norm after
    it whose statistics average over dims among those (the same sets or smaller ones: a plane inside its sample
    or inside its channel over the batch, a group inside its sample) subtracts its own sets' mean, which that
    constant shifts by itself: the norm's output is the same without the centring, which is dropped. Maps by
    numbers between them (mul, div, add, sub) keep the constant one per set; a norm that keeps running
    statistics (batch norm in training mode) would see it, and does not cancel it."""
    out: list[Step] = []
    for i, step in enumerate(steps):
        if isinstance(step.op, MeanCentre) and _cancelled(step.op, steps[i + 1:]):
            continue
        out.append(step)
    return out


def _cancelled(centre: MeanCentre, rest: Sequence[Step]) -> bool:
    for step in rest:
        op = step.op
        if isinstance(op, Norm):
            dims = _averaged_dims(op, centre.in_rank)
            return dims is not None and dims <= set(centre.dims)
        if not (isinstance(op, (Mul, Div, Add, Sub)) and getattr(op, "scalar", None) is not None):
            return False
    return False


def _averaged_dims(norm: Norm, rank: int) -> frozenset[int] | None:
    """The dims of a rank-``rank`` input a norm's mean is over (a group norm's: some of dim 1, and the spatial
    ones); None for batch norm (training: its running statistics would see a centring before it; eval: it
    subtracts no mean of its input)."""
    spatial = frozenset(range(2, rank))
    if isinstance(norm, MeanCentre):
        return frozenset(norm.dims)
    if isinstance(norm, LayerNorm):
        return frozenset(range(rank - len(norm.normalized_shape), rank))
    return {"instance": spatial, "group": spatial | {1}}.get(norm.scope)


#: The norms whose statistics pass gives each plane's mean (not eval-mode batch norm's running ones).
_STATISTICS_SCOPES = ("batch", "group", "instance")


def _mean_of_norm(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """A spatial mean (or sum) right after a batch, group or instance norm: the norm is an affine map per
    (sample, channel) plane, so the mean of its output is that map of the plane's mean, which the
    statistics pass already has; finalize applies it and no main pass runs. The reduction is marked.
    Not after a layer norm's per-element affine (Norm.element_affine): that map differs across the plane."""
    out = list(steps)
    for i in range(1, len(out)):
        norm, op = out[i - 1].op, out[i].op
        if (isinstance(norm, Norm) and norm.scope in _STATISTICS_SCOPES and not norm.element_affine
                and isinstance(op, Reduce) and op.over == "spatial" and op.mode in ("mean", "sum")):
            out[i] = _mark(out[i], FROM_STATISTICS)
    return out


def _drop_identity(steps: list[Step], rank: int) -> list[Step]:
    return [s for s in steps if s.op.role != "identity"]


def _pairwise(steps: list[Step], merge: Callable[[Step, Step, int], list[Step] | None], rank: int) -> list[Step]:
    """Apply ``merge`` to neighbours until it merges nothing more; ``rank`` is the first's input rank."""
    out: list[Step] = []
    ranks = [rank]
    for step in steps:
        if out:
            merged = merge(out[-1], step, ranks[-2])
            if merged is not None:
                out.pop()
                ranks.pop()
                for m in merged:
                    out.append(m)
                    ranks.append(_rank_after(m.op, ranks[-1]))
                continue
        out.append(step)
        ranks.append(_rank_after(step.op, ranks[-1]))
    return out


def _rank_after(op: Op, rank: int) -> int:
    return len(op.out_shape((2,) * rank))


def _merge_reductions(steps: list[Step], rank: int) -> list[Step]:
    """torch.sum(torch.sum(x, 2), 2) is torch.sum(x, (2, 3)): reductions of one mode (not logsumexp)
    with the same keepdim, in a row, over disjoint dims of the input."""
    def merge(a: Step, b: Step, in_rank: int) -> list[Step] | None:
        if not (isinstance(a.op, DimReduce) and isinstance(b.op, DimReduce)):
            return None
        mode_a, mode_b = (kernel_mode(s.op.mode) for s in (a, b))
        if mode_a != mode_b or mode_a == "logsumexp" or a.op.keepdim != b.op.keepdim:
            return None
        kept = list(range(in_rank)) if a.op.keepdim else [d for d in range(in_rank) if d not in a.op.dims]
        dims = tuple(sorted(set(a.op.dims) | {kept[d] for d in b.op.dims}))
        if _kernel_form(a.op.dims, in_rank) and not _kernel_form(dims, in_rank):
            return None  # the first alone is what the kernels reduce: merged, neither would be fused
        op = DimReduce(mode=mode_a, over="dim", dim=dims[0], dims=dims, keepdim=a.op.keepdim)
        return [Step(op, None, a.entries + b.entries)]
    return _pairwise(steps, merge, rank)


#: Reductions over all dims but the batch's that are one over the spatial dims, then one over the channels
#: (each plane holds as many values, so a mean of plane means is the mean; max, min, sum and logsumexp fold).
_SPLITTABLE = ("sum", "mean", "max", "min", "amax", "amin", "logsumexp")


def _split_full_reductions(steps: list[Step], rank: int) -> list[Step]:
    """torch.sum(x, (1, 2, 3)) is the sum over the channels of each plane's sum: the kernels' spatial
    reduction in the first region, their channel reduction in a later one (fusetune/pipeline.py). Only on
    the convolution's rank, where the first region may take the spatial part: on a tensor of another rank
    (after a reduction that dropped a dim) the whole reduction is one later region, on a view of its input
    (fusetune/views.py), where split it took two."""
    out: list[Step] = []
    current = rank
    for step in steps:
        op = step.op
        if (isinstance(op, DimReduce) and op.mode in _SPLITTABLE and current > 2 and current == rank
                and op.dims == tuple(range(1, current))):
            mode = kernel_mode(op.mode)
            spatial = tuple(range(2, current))
            out.append(Step(DimReduce(mode=mode, over="dim", dim=2, dims=spatial, keepdim=True), None, step.entries))
            out.append(Step(DimReduce(mode=mode, over="dim", dim=1, dims=(1,), keepdim=True), None, step.entries))
            if not op.keepdim:
                out.append(Step(Squeeze(dims=tuple(range(1, current))), None, step.entries))
        else:
            out.append(step)
        current = _rank_after(op, current)
    return out


def _kernel_form(dims: tuple[int, ...], rank: int) -> bool:
    """Whether a reduction over ``dims`` of a rank-``rank`` input is one the kernels compute: over the
    channel dim, or over every spatial dim."""
    return dims == (1,) or dims == tuple(range(2, rank))


def _kernel_reductions(steps: list[Step], rank: int) -> list[Step]:
    """Reductions into the two forms the kernels compute, each with the view that restores the
    shape PyTorch gives."""
    out: list[Step] = []
    current = rank
    for step in steps:
        op = step.op
        if isinstance(op, AdaptivePool) and op.global_ and current == rank:
            out.append(Step(op.as_reduce(), None, step.entries))
        elif isinstance(op, DimReduce) and kernel_mode(op.mode) in REDUCTIONS and current == rank:
            mode = kernel_mode(op.mode)  # logsumexp: over the channel dim only (channel_reduce)
            if _kernel_form(op.dims, rank) and op.dims != (1,) and mode in KERNEL_MODES:
                out.append(Step(SpatialReduce(mode=mode), None, step.entries))
                if not op.keepdim:
                    out.append(Step(Flatten(start_dim=1, end_dim=-1), None, step.entries))
            elif op.dims == (1,):
                out.append(Step(DimReduce(mode=mode, over="dim", dim=1, dims=(1,)), None, step.entries))
                if op.keepdim:
                    out.append(Step(Unsqueeze(dim=1), None, step.entries))
            else:
                out.append(step)
        else:
            out.append(step)
        current = _rank_after(step.op, current)
    return out


def _sink_views(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """A view, then an op that maps each value alone (no per-channel parameter, a scalar one being the same
    value everywhere, unless the view keeps every channel where it was: a slice of a spatial dim; not the
    convolution's output, not an extra input, which has the chain's shape before the view): the same values
    either way round, and with the op first the kernels may take it."""
    scalars = {p.name for p in spec.parameters if p.scalar}
    out = list(steps)
    moved = True
    while moved:
        moved = False
        for i in range(len(out) - 1):
            view, op = out[i].op, out[i + 1].op
            keeps_channels = isinstance(view, Slice) and view.dim >= 2
            if (view.role == "view" and op.role == "elementwise" and (keeps_channels or not set(op.params()) - scalars)
                    and not op.uses_producer() and op.reads_input() is None):
                out[i], out[i + 1] = out[i + 1], out[i]
                moved = True
    return out


def _compose_pools(steps: list[Step], rank: int) -> list[Step]:
    """Two pools of one mode whose windows neither overlap nor skip (stride = window) nor pad compose
    into one pool of the product window."""
    def plain(op: Op) -> bool:
        return (isinstance(op, Pool) and op.padding is None and tuple(op.stride) == tuple(op.kernel_size)
                and op.exact_in_kernels)

    def merge(a: Step, b: Step, in_rank: int) -> list[Step] | None:
        if not (plain(a.op) and plain(b.op) and a.op.mode == b.op.mode):
            return None
        window = tuple(x * y for x, y in zip(a.op.kernel_size, b.op.kernel_size))
        return [Step(type(a.op)(kernel_size=window, stride=window), None, a.entries + b.entries)]
    return _pairwise(steps, merge, rank)


#: Every rule, in the order it runs: the later ones read the forms the earlier ones leave.
RULES: tuple[Rule, ...] = (
    Rule("drop_identity", "dropout that is the identity (eval mode, or p = 0) is dropped", _ranked(_drop_identity)),
    Rule("merge_reductions", "reductions of one mode in a row, over disjoint dims, merge into one",
         _ranked(_merge_reductions)),
    Rule("split_full_reductions", "a reduction over the channels and every spatial dim is one over the spatial "
         "dims, then one over the channels", _ranked(_split_full_reductions)),
    Rule("kernel_reductions", "a reduction over every spatial dim or over the channels is the kernels' own, "
         "with a view that restores PyTorch's shape", _ranked(_kernel_reductions)),
    Rule("sink_views", "a view before an op that maps each value alone moves after it", _sink_views),
    Rule("compose_pools", "non-overlapping pools of one mode in a row compose into one of the product window",
         _ranked(_compose_pools)),
    Rule("norm_cancels_centring", "a norm cancels a mean centring before it whose averaged dims hold its own: the "
         "centring is dropped", _norm_cancels_centring),
    Rule("norm_cancels_bias", "instance norm cancels the producer's bias added through an affine chain before "
         "it: the convolution runs without bias", _norm_cancels_bias),
    Rule("mean_of_norm", "a spatial mean or sum right after a batch, group or instance norm is finalize's map of "
         "the plane means: no main pass", _mean_of_norm),
)
