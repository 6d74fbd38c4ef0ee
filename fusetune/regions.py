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
  * a pointwise op or an eval-mode batch norm after a pixel shuffle moves before it (a per-channel parameter, the
    norm's tensors, repeated r^2 times), so that the convolution's region takes it and PyTorch shuffles after it;
  * a view before an op that maps each value alone moves after it (the values are the same);
  * a pool in ceil mode that adds no partial window at any of the config's shapes is the floor-mode pool
    there (exact at those shapes only: the generated model runs PyTorch's forward at any other);
  * non-overlapping pools of one mode in a row compose into one pool of the product window
    (floor mode: floor(floor(s / a) / b) = floor(s / ab) windows, each the same inputs);
  * a norm cancels a mean centring (x - x.mean(dims, keepdim=True)) before it whose sets hold its own:
    the centring is dropped;
  * a norm cancels an extra input added before it that is one value over each of its statistics' sets
    (a diffusion block's temb, one per (sample, channel), before instance norm): the add is dropped, and
    the chain is not split where the kernels would read the input;
  * instance norm (a layer norm over every spatial dim, a group norm of one channel a group, whose
    statistics are instance norm's) cancels a per-channel constant added before it (the producer's bias,
    through mul/div by per-channel constants and add/sub): the norm's step is marked, and the convolution
    runs without bias;
  * a spatial mean (or sum) right after a batch, group or instance norm is the norm's affine map applied
    to the plane's mean, which the statistics pass already has: the reduction's step is marked, and
    finalize computes the output (no main pass at all).

The rules are data (``RULES``: a name, a doc, and the function that applies it), run in order, and
the plan records which of them changed or marked the chain (``fusetune plan`` lists them, and the entries
they dropped). A step keeps the config's ops it stands for (``Step.written``): messages name it by them.

Each rewritten op remembers the reference model's attribute it reads (a norm's module), so that the
part that runs in PyTorch uses the very modules of the reference.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from fusetune import broadcast
from fusetune.config import ProblemSpec
from fusetune.ops import (Add, AdaptivePool, BatchNorm, DimReduce, Div, Flatten, LayerNorm, MeanCentre, Mul, Norm, Op,
                          Pool, Reduce, Shape, SpatialReduce, Sub, Unsqueeze)
from fusetune.ops.reduce import KERNEL_MODES, Squeeze, kernel_mode
from fusetune.ops.shuffle import PixelShuffle
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
    #: The config's ops its entries are, as parsed: a user knows a step by the ops they wrote, not by the
    #: form a rule gave it (a ``sum`` over every spatial dim is the kernels' spatial_reduce and a view).
    written: tuple[Op, ...] = ()
    #: How many times each value of the per-channel parameters it reads (an eval batch norm's tensors) is repeated
    #: (torch.repeat_interleave over the channels): the product of r^2 over the pixel shuffles of factor r it moved
    #: before (shuffle_commutes), 1 otherwise.
    repeat: int = 1

    def repeated_params(self, scalars: frozenset[str]) -> tuple[str, ...]:
        """The per-channel parameters the step reads repeated (none where ``repeat`` is 1); ``scalars``: the
        config's single-value parameters, the same value for every channel."""
        if self.repeat == 1 or self.op.role != "elementwise":
            return ()
        return tuple(p for p in self.op.params() if p not in scalars)

    @property
    def repeated_norm(self) -> bool:
        """Whether the step is an eval-mode batch norm moved before a pixel shuffle: its module's per-channel
        tensors are read repeated."""
        return self.repeat > 1 and isinstance(self.op, BatchNorm)

    def forward_code(self, x: str, scalars: frozenset[str]) -> str:
        """The step's PyTorch line (where PyTorch runs it: after a region, or between regions): the op's own,
        reading each per-channel parameter (an eval batch norm's tensors) repeated where the step stands before a
        pixel shuffle."""
        if self.repeated_norm:
            return self.op.eval_code(x, self.attr, self.repeat)
        if not self.repeated_params(scalars):
            return self.op.forward_code(x, self.attr)
        repeated = dataclasses.replace(self.op, param=f"{self.op.param}.repeat_interleave({self.repeat}, 0)")
        return repeated.forward_code(x, self.attr)

    @property
    def where(self) -> str:
        """The config entries this step stands for, by the ops the config wrote there: ``epilogue[3]
        (max_pool)``; where a rule gave them another form, which part of them it is: ``epilogue[1] (amax over
        every spatial dim)``, ``epilogue[2] (sum with keepdim, its view putting dim 1 back)``."""
        return " + ".join(f"epilogue[{i}]" for i in self.entries) + f" ({_label(self.op, self.written)})"

    def becomes(self, op: Op) -> "Step":
        """The step as ``op``, a form a rule gave it: the same entries, as written; no module of the reference
        (the rewritten op's PyTorch line needs none)."""
        return Step(op, None, self.entries, written=self.written)


def _label(op: Op, written: tuple[Op, ...]) -> str:
    """What a step is called in messages: the config's op names of its entries, and where a rule rewrote them
    (``written`` is not the step's op alone), what the step is of them (_FORMS)."""
    named = " + ".join(w.config_name for w in written) or op.config_name
    if not written or written == (op,):
        return named
    form = next((describe for kinds, describe in _FORMS if isinstance(op, kinds)), None)
    return form(op, written, named) if form is not None else f"{named}, as {op.config_name}"


def _over(op: Reduce) -> str:
    if op.over == "spatial":
        return "every spatial dim"
    return "channels" if tuple(getattr(op, "dims", (op.dim,))) == (1,) else f"dims {list(op.dims)}"


def _reduction_form(op: Reduce, written: tuple[Op, ...], named: str) -> str:
    """A reduction as the kernels compute it: over the channels or every spatial dim; amax is max."""
    (one,) = written if len(written) == 1 else (None,)
    if isinstance(one, DimReduce) and isinstance(op, DimReduce) and (one.dims, one.keepdim) == (op.dims, op.keepdim):
        return named  # amax as max: the same values, by the user's name
    if isinstance(one, DimReduce):
        return f"{named} over {_over(op)}"
    if isinstance(one, AdaptivePool):
        return f"{named} to 1, a {op.mode} over {_over(op)}"
    return f"{named}, one {op.mode} over {_over(op)}"


def _keepdim(written: tuple[Op, ...]) -> str:
    """" with keepdim" where the user asked for the dim back (a channel reduction's view that restores it), else
    "" (the view of a reduction split in two, which puts back a dim the second part drops)."""
    return " with keepdim" if any(getattr(w, "keepdim", False) for w in written) else ""


#: How a step that a rule gave a form of its own is named after the ops it was written as (_label), by the
#: form's class. (No ": " inside: a message's parts are split at it.)
_FORMS: tuple[tuple[type | tuple[type, ...], Callable[[Op, tuple[Op, ...], str], str]], ...] = (
    (Reduce, _reduction_form),
    ((Flatten, Squeeze), lambda op, written, named: f"{named}, its view dropping the reduced dims"),
    (Unsqueeze, lambda op, written, named: f"{named}{_keepdim(written)}, its view putting dim {op.dim} back"),
    (Pool, lambda op, written, named: (
        f"{named}, one {op.config_name} of window {list(op.kernel_size)}" if len(written) > 1
        else f"{named}, whose ceil mode adds no window at the config's shapes")),
)


def reference_attr(spec: ProblemSpec, i: int) -> str | None:
    """The attribute of the reference model that holds epilogue op ``i``'s module, None if it has none."""
    op = spec.epilogue[i]
    return f"{op.kind}_{i}" if op.module_code(spec.channels_at(i), spec.producer.spatial_dims) else None


#: A norm step marked so cancels the producer's bias: the convolution runs without it.
CANCELS_BIAS = "cancels_bias"
#: A reduction step marked so is computed by finalize from the norm's statistics: no main pass.
FROM_STATISTICS = "from_statistics"
#: A step moved before a pixel shuffle (shuffle_commutes): ``fusetune plan`` names it.
MOVED = "moved_before_shuffle"
#: A step a rule that holds at the config's shapes only gave its form (Rule.at_shapes; rewrite marks it): the
#: kernels that compute that form are exact at those shapes only, PyTorch running it as written at any
#: (Plan.at_shapes: region 0's kernels take it; pipeline.region_spec: a later region's problem has it as written).
AT_SHAPES = "at_shapes"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One exact rewrite of a chain: ``apply`` returns the chain after it (the same steps where it does
    not apply); it may replace steps or mark them for the planner. A rule ``at_shapes`` holds at the config's
    shapes only (ceil_adds_no_window): where it fired, the generated model runs PyTorch's own forward at any
    other input shape (EXACT_AT), and the plan, which the cache keys by its rendered module, is the config's
    with all its shapes. An adaptive pool, whose windows depend on its input's size, needs no such rule: it is
    the kernels' own pool at any shape (ops/pool.py's ADAPTIVE_BOUNDS)."""

    name: str
    doc: str
    apply: Callable[[list[Step], ProblemSpec], list[Step]]
    at_shapes: bool = False


@dataclasses.dataclass(frozen=True)
class Rewritten:
    """A config's chain after the rules, and the names of those that changed or marked it."""

    steps: tuple[Step, ...]
    fired: tuple[str, ...]
    #: The config's entries no step stands for any more: an identity, an add or a centring a norm cancels.
    dropped: tuple[Step, ...] = ()


def rewrite(spec: ProblemSpec) -> Rewritten:
    """The config's chain after every rule, in order (each rule runs over the whole chain once)."""
    steps = [Step(op, reference_attr(spec, i), (i,), written=(op,)) for i, op in enumerate(spec.epilogue)]
    fired: list[str] = []
    for rule in RULES:
        after = rule.apply(steps, spec)
        if after != steps:
            fired.append(rule.name)
        if rule.at_shapes:
            after = [step if step in steps or AT_SHAPES in step.marks else _mark(step, AT_SHAPES) for step in after]
        steps = after
    kept = {i for step in steps for i in step.entries}
    dropped = tuple(Step(op, reference_attr(spec, i), (i,), written=(op,)) for i, op in enumerate(spec.epilogue)
                    if i not in kept)
    return Rewritten(tuple(steps), tuple(fired), dropped)


def affine(ops: Sequence[Op]) -> bool:
    """Whether a chain of elementwise ops is an affine map per channel (mul, div and add by numbers or
    per-channel parameters; not by the convolution's own output or an extra input)."""
    return all(isinstance(op, (Mul, Div, Add)) and not op.uses_producer() and op.reads_input() is None
               for op in ops)


def _ranked(rule: Callable[[list[Step], Shape], list[Step]]) -> Callable[[list[Step], ProblemSpec], list[Step]]:
    """A rule over the chain and its input's shape (the convolution output's at the first configured shape: each
    step's rank is the same at every shape, config.py made sure, but a squeeze's depends on the sizes)."""
    return lambda steps, spec: rule(steps, _first_shape(spec))


def _first_shape(spec: ProblemSpec) -> Shape:
    return spec.producer.out_shape(spec.shapes[0])


def _mark(step: Step, mark: str) -> Step:
    return dataclasses.replace(step, marks=step.marks + (mark,))


def _norm_cancels_bias(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """A norm subtracts the mean of each of its statistics' sets, so a value constant over each set added before
    it cancels exactly (_cancelling_norm): the producer's bias is one value per channel, which instance norm
    cancels (a layer norm over every spatial dim too, a group norm whose groups are one channel each, a mean
    centring over each plane or over each channel's batch and spatial dims), through maps that keep it constant
    there (mul and div by such operands, add and sub by anything). That norm is marked, where region 0 may take
    it: a norm of the statistics pass's scopes, no input read before it (the kernels read one only after their
    norm). Not batch norm in training mode: the running statistics it keeps would see the bias. Not where an op
    reads the convolution's output (by: producer): that output has the bias."""
    if not spec.producer.bias or any(step.op.uses_producer() for step in steps):
        return steps
    rank = 2 + spec.producer.spatial_dims
    norm = _cancelling_norm(steps, 0, frozenset({0, *range(2, rank)}), spec, rank)
    if (norm is None or steps[norm].op.scope not in _STATISTICS_SCOPES
            or any(step.op.reads_input() for step in steps[:norm])):
        return steps  # (such a norm runs after region 0, whose kernels add the bias anyway)
    return steps[:norm] + [_mark(steps[norm], CANCELS_BIAS)] + steps[norm + 1:]


def _norm_cancels_input(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """x + t, then a norm that subtracts the mean of sets over which t is one value: the norm's output is the
    same without t (its mean moves by t, its variance not at all), so the add (or sub) is dropped. t is a
    broadcast input (fusetune/broadcast.py): a diffusion block's temb, one value per (sample, channel), before
    an instance norm or a group norm of one channel a group; one per sample before a layer norm over
    (C, *spatial) or any group norm; one per channel before a mean centring over each channel's batch and
    spatial dims. Not batch norm in training mode (its running statistics would see t), nor in eval mode (it
    subtracts no mean of its input). The steps between must keep t one value a set (_cancelling_norm). Exact
    for finite t: a NaN or an infinity in t reaches PyTorch's output, not the kernels'.

    Only an input's add: the kernels read an input only where they store an element, after their norm, so
    it would split the chain into two regions; a number or a parameter they add for free before the norm,
    and their statistics (sums around a pivot) take such an offset as PyTorch does (tests/gpu_chains' offset
    chains check that on a GPU)."""
    ranks = _ranks(steps, _first_shape(spec))
    return [step for i, step in enumerate(steps)
            if not (isinstance(step.op, (Add, Sub)) and step.op.reads_input() is not None and _cancelling_norm(
                steps, i + 1, _constant_dims(step.op, spec, ranks[i]), spec, ranks[i]) is not None)]


def _ranks(steps: Sequence[Step], shape: Shape) -> list[int]:
    """Each step's input rank, from the convolution output's shape."""
    out = []
    for step in steps:
        out.append(len(shape))
        shape = step.op.out_shape(shape)
    return out


def _constant_dims(op: Op, spec: ProblemSpec, rank: int) -> frozenset[int]:
    """The dims of a rank-``rank`` tensor along which a binary op's operand is one value: all of them for a
    number or a single parameter, the batch and spatial ones for a per-channel parameter, those a broadcast
    input has size 1 in (broadcast.KINDS); none for the convolution's output or a full-shape input."""
    every, spatial = frozenset(range(rank)), frozenset(range(2, rank))
    if op.uses_producer():
        return frozenset()
    name = op.reads_input()
    if name is not None:
        kind = broadcast.kind_of(spec, name)
        if kind is None:
            return frozenset()
        return spatial | ({0} if not kind.per_sample else set()) | ({1} if not kind.per_channel else set())
    param = getattr(op, "param", None)
    declared = {p.name: p for p in spec.parameters}
    if param is not None and not declared[param].scalar:
        return spatial | {0}
    return every


def _cancelling_norm(steps: Sequence[Step], start: int, dims: frozenset[int], spec: ProblemSpec,
                     rank: int) -> int | None:
    """The index of the first norm from ``steps[start]`` on, where it cancels a value constant along ``dims``
    (of a rank-``rank`` tensor) added before ``steps[start]``; None where none does. The steps up to it must be
    mul, div, add or sub: an add or sub leaves the value as it is, a mul or div by an operand scales it by that
    operand, constant along the operand's own dims only. The norm cancels it where its statistics average over
    dims among those (_averaged_dims): each set's mean then moves by the set's one value."""
    for i in range(start, len(steps)):
        op = steps[i].op
        if isinstance(op, Norm):
            averaged = _averaged_dims(op, rank, spec.channels_at(steps[i].entries[0]))
            return i if averaged is not None and averaged <= dims else None
        if isinstance(op, (Mul, Div)):
            dims = dims & _constant_dims(op, spec, rank)
        elif not isinstance(op, (Add, Sub)):
            return None
    return None


def _norm_cancels_centring(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """x - x.mean(dims) subtracts a constant that varies only along the dims it does not average; a norm after
    it whose statistics average over dims among those (the same sets or smaller ones: a plane inside its sample
    or inside its channel over the batch, a group inside its sample) subtracts its own sets' mean, which that
    constant shifts by itself: the norm's output is the same without the centring, which is dropped. Maps by
    numbers between them (mul, div, add, sub) keep the constant one per set; a norm that keeps running
    statistics (batch norm in training mode) would see it, and does not cancel it."""
    out: list[Step] = []
    for i, step in enumerate(steps):
        if isinstance(step.op, MeanCentre) and _cancelled(step.op, steps[i + 1:], spec):
            continue
        out.append(step)
    return out


def _cancelled(centre: MeanCentre, rest: Sequence[Step], spec: ProblemSpec) -> bool:
    for step in rest:
        op = step.op
        if isinstance(op, Norm):
            dims = _averaged_dims(op, centre.in_rank, spec.channels_at(step.entries[0]))
            return dims is not None and dims <= set(centre.dims)
        if not (isinstance(op, (Mul, Div, Add, Sub)) and getattr(op, "scalar", None) is not None):
            return False
    return False


def _averaged_dims(norm: Norm, rank: int, channels: int) -> frozenset[int] | None:
    """The dims of a rank-``rank`` input a norm's mean is over: a group norm's are the spatial ones and the
    channels of a group, which where each group is one channel (``channels`` at the norm, num_groups of them) are
    the spatial ones alone; None for batch norm (training: its running statistics would see a centring before it;
    eval: it subtracts no mean of its input)."""
    spatial = frozenset(range(2, rank))
    if isinstance(norm, MeanCentre):
        return frozenset(norm.dims)
    if isinstance(norm, LayerNorm):
        return frozenset(range(rank - len(norm.normalized_shape), rank))
    if norm.scope == "group" and norm.groups_of(channels) == 1:
        return spatial
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


def _drop_identity(steps: list[Step], shape: Shape) -> list[Step]:
    return [s for s in steps if s.op.role != "identity"]


def _pairwise(steps: list[Step], merge: Callable[[Step, Step, int], list[Step] | None], shape: Shape) -> list[Step]:
    """Apply ``merge`` to neighbours until it merges nothing more (it gets the first's input rank); ``shape`` is
    the first step's input shape."""
    out: list[Step] = []
    shapes = [shape]
    for step in steps:
        if out:
            merged = merge(out[-1], step, len(shapes[-2]))
            if merged is not None:
                out.pop()
                shapes.pop()
                for m in merged:
                    out.append(m)
                    shapes.append(m.op.out_shape(shapes[-1]))
                continue
        out.append(step)
        shapes.append(step.op.out_shape(shapes[-1]))
    return out


def _merge_reductions(steps: list[Step], shape: Shape) -> list[Step]:
    """torch.sum(torch.sum(x, 2), 2) is torch.sum(x, (2, 3)): reductions of one mode that folds (_SPLITTABLE;
    not logsumexp, not var or std: a var of vars is no var) with the same keepdim, in a row, over disjoint dims
    of the input."""
    def merge(a: Step, b: Step, in_rank: int) -> list[Step] | None:
        if not (isinstance(a.op, DimReduce) and isinstance(b.op, DimReduce)):
            return None
        mode_a, mode_b = (kernel_mode(s.op.mode) for s in (a, b))
        if (mode_a != mode_b or mode_a == "logsumexp" or mode_a not in _SPLITTABLE
                or a.op.keepdim != b.op.keepdim):
            return None
        kept = list(range(in_rank)) if a.op.keepdim else [d for d in range(in_rank) if d not in a.op.dims]
        dims = tuple(sorted(set(a.op.dims) | {kept[d] for d in b.op.dims}))
        if _kernel_form(a.op.dims, in_rank) and not _kernel_form(dims, in_rank):
            return None  # the first alone is what the kernels reduce: merged, neither would be fused
        op = DimReduce(mode=mode_a, over="dim", dim=dims[0], dims=dims, keepdim=a.op.keepdim)
        return [Step(op, None, a.entries + b.entries, written=a.written + b.written)]
    return _pairwise(steps, merge, shape)


#: Reductions over all dims but the batch's that are one over the spatial dims, then one over the channels
#: (each plane holds as many values, so a mean of plane means is the mean; max, min, sum and logsumexp fold).
_SPLITTABLE = ("sum", "mean", "max", "min", "amax", "amin", "logsumexp")


def _split_full_reductions(steps: list[Step], shape: Shape) -> list[Step]:
    """torch.sum(x, (1, 2, 3)) is the sum over the channels of each plane's sum: the kernels' spatial
    reduction in the first region, their channel reduction in a later one (fusetune/pipeline.py). Only on
    the convolution's rank, where the first region may take the spatial part: on a tensor of another rank
    (after a reduction that dropped a dim) the whole reduction is one later region, on a view of its input
    (fusetune/views.py), where split it took two."""
    out: list[Step] = []
    rank = len(shape)
    for step in steps:
        op, current = step.op, len(shape)
        if (isinstance(op, DimReduce) and op.mode in _SPLITTABLE and current > 2 and current == rank
                and op.dims == tuple(range(1, current))):
            mode = kernel_mode(op.mode)
            spatial = tuple(range(2, current))
            out.append(step.becomes(DimReduce(mode=mode, over="dim", dim=2, dims=spatial, keepdim=True)))
            out.append(step.becomes(DimReduce(mode=mode, over="dim", dim=1, dims=(1,), keepdim=True)))
            if not op.keepdim:
                out.append(step.becomes(Squeeze(dims=tuple(range(1, current)))))
        else:
            out.append(step)
        shape = op.out_shape(shape)
    return out


def _kernel_form(dims: tuple[int, ...], rank: int) -> bool:
    """Whether a reduction over ``dims`` of a rank-``rank`` input is one the kernels compute: over the
    channel dim, or over every spatial dim."""
    return dims == (1,) or dims == tuple(range(2, rank))


def _kernel_reductions(steps: list[Step], shape: Shape) -> list[Step]:
    """Reductions into the two forms the kernels compute, each with the view that restores the
    shape PyTorch gives."""
    out: list[Step] = []
    rank = len(shape)
    for step in steps:
        op, current = step.op, len(shape)
        if isinstance(op, AdaptivePool) and op.global_ and current == rank:
            out.append(step.becomes(op.as_reduce()))
        elif isinstance(op, DimReduce) and kernel_mode(op.mode) in REDUCTIONS and current == rank:
            mode = kernel_mode(op.mode)  # logsumexp: over the channel dim only (channel_reduce)
            if _kernel_form(op.dims, rank) and op.dims != (1,) and mode in KERNEL_MODES:
                out.append(step.becomes(SpatialReduce(mode=mode)))
                if not op.keepdim:
                    out.append(step.becomes(Flatten(start_dim=1, end_dim=-1)))
            elif op.dims == (1,):  # (the op's own class and arguments kept: a var's correction)
                out.append(step.becomes(dataclasses.replace(op, mode=mode, over="dim", dim=1, dims=(1,),
                                                            keepdim=False)))
                if op.keepdim:
                    out.append(step.becomes(Unsqueeze(dim=1)))
            else:
                out.append(step)
        else:
            out.append(step)
        shape = step.op.out_shape(shape)
    return out


def _sink_views(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """A view, then an op that maps each value alone (no per-channel parameter, a scalar one being the same
    value everywhere, unless the view keeps every channel where it was: a slice of a spatial dim; not the
    convolution's output, not an extra input, which has the chain's shape before the view): the same values
    either way round, and with the op first the kernels may take it."""
    scalars = spec.scalar_parameters
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


def _shuffle_commutes(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """A pixel shuffle, then an op that maps each value alone: the shuffle moves values without changing them, so
    the op gives the same values before it, each read at the channel it came from. Channel c of the shuffle's input
    lands in channel c // r^2 of its output, so a per-channel parameter of C / r^2 values is read repeated r^2 times
    (repeat_interleave: Step.repeat); a number or a scalar parameter is the same everywhere. A batch norm in eval
    mode is such a map too (its running statistics and affine per channel, repeated alike). Not an op that reads
    the convolution's output or an extra input (their shape is the chain's after the shuffle), nor a per-channel
    parameter an op reads other than as its one operand. A norm with statistics of its input (batch norm in
    training mode, group, instance, layer), a pool, a reduction or a softmax does not commute with it (their sets
    of values are not the shuffle's) and stops the move; the shuffle then runs in PyTorch between regions. The
    moved step is marked (MOVED): ``fusetune plan`` says it moved."""
    scalars = spec.scalar_parameters
    out = list(steps)
    moved = True
    while moved:
        moved = False
        for i in range(len(out) - 1):
            shuffle, step = out[i], out[i + 1]
            if isinstance(shuffle.op, PixelShuffle) and _commutes_with_shuffle(step.op, scalars):
                per_channel = isinstance(step.op, BatchNorm) or set(step.op.params()) - scalars
                repeat = step.repeat * (shuffle.op.block if per_channel else 1)
                marks = step.marks if MOVED in step.marks else step.marks + (MOVED,)
                out[i], out[i + 1] = dataclasses.replace(step, repeat=repeat, marks=marks), shuffle
                moved = True
    return out


def _commutes_with_shuffle(op: Op, scalars: frozenset[str]) -> bool:
    """Whether an op maps each value alone, reading nothing at the shuffled position but its per-channel
    parameters, each as its one operand (``param``: the operand Step.forward_code repeats); or is a batch norm in
    eval mode, a per-channel affine map of its module's running statistics and affine (repeated alike)."""
    if isinstance(op, BatchNorm):
        return not op.training
    if op.role != "elementwise" or op.uses_producer() or op.reads_input() is not None:
        return False
    per_channel = set(op.params()) - scalars
    return not per_channel or per_channel == {getattr(op, "param", None)}


def _ceil_adds_no_window(steps: list[Step], spec: ProblemSpec) -> list[Step]:
    """A pool in ceil mode pools one more window than in floor mode only where a partial one starts inside its
    input (or its left padding); where that adds no window at any of the config's shapes, its windows there are
    floor mode's, the same inputs and (an average's) the same divisors: the kernels' pool, exact at those
    shapes (the importer reads a traced model's ceil_mode so at its one shape). The step keeps the reference's
    module (in ceil mode: exact at any shape where PyTorch runs it)."""
    shapes = [spec.producer.out_shape(shape) for shape in spec.shapes]
    out = []
    for step in steps:
        op = step.op
        if isinstance(op, Pool) and op.ceil_mode:
            floor = dataclasses.replace(op, ceil_mode=False)
            if all(floor.out_shape(shape) == op.out_shape(shape) for shape in shapes):
                step = dataclasses.replace(step, op=floor)
        out.append(step)
        shapes = [op.out_shape(shape) for shape in shapes]
    return out


def _compose_pools(steps: list[Step], shape: Shape) -> list[Step]:
    """Two pools of one mode whose windows neither overlap nor skip (stride = window) nor pad nor dilate, nor
    divide by a divisor_override, compose into one pool of the product window."""
    def plain(op: Op) -> bool:
        return (isinstance(op, Pool) and op.padding is None and tuple(op.stride) == tuple(op.kernel_size)
                and op.exact_in_kernels and op.dilation is None and op.divisor_override is None)

    def merge(a: Step, b: Step, in_rank: int) -> list[Step] | None:
        if not (plain(a.op) and plain(b.op) and a.op.mode == b.op.mode):
            return None
        window = tuple(x * y for x, y in zip(a.op.kernel_size, b.op.kernel_size))
        marks = tuple(dict.fromkeys(m for m in a.marks + b.marks if m == AT_SHAPES))  # a pool ceil_adds_no_window made
        return [Step(type(a.op)(kernel_size=window, stride=window), None, a.entries + b.entries, marks=marks,
                     written=a.written + b.written)]
    return _pairwise(steps, merge, shape)


#: Every rule, in the order it runs: the later ones read the forms the earlier ones leave.
RULES: tuple[Rule, ...] = (
    Rule("drop_identity", "dropout that is the identity (eval mode, or p = 0) is dropped", _ranked(_drop_identity)),
    Rule("merge_reductions", "reductions of one mode in a row, over disjoint dims, merge into one",
         _ranked(_merge_reductions)),
    Rule("split_full_reductions", "a reduction over the channels and every spatial dim is one over the spatial "
         "dims, then one over the channels", _ranked(_split_full_reductions)),
    Rule("kernel_reductions", "a reduction over every spatial dim or over the channels is the kernels' own, "
         "with a view that restores PyTorch's shape", _ranked(_kernel_reductions)),
    Rule("shuffle_commutes", "a pointwise op or an eval-mode batch norm after a pixel shuffle moves before it, the "
         "same values each read at the channel it came from: a per-channel parameter repeated r^2 times, a scalar "
         "as it is",
         _shuffle_commutes),
    Rule("sink_views", "a view before an op that maps each value alone moves after it", _sink_views),
    Rule("ceil_adds_no_window", "a pool in ceil mode that adds no partial window at any of the config's shapes "
         "is the floor-mode pool there", _ceil_adds_no_window, at_shapes=True),
    Rule("compose_pools", "non-overlapping pools of one mode in a row compose into one of the product window",
         _ranked(_compose_pools)),
    Rule("norm_cancels_input", "a norm cancels an add or sub before it of a broadcast input that is one value "
         "over each of its statistics' sets (temb before instance norm): the add is dropped", _norm_cancels_input),
    Rule("norm_cancels_centring", "a norm cancels a mean centring before it whose averaged dims hold its own: the "
         "centring is dropped", _norm_cancels_centring),
    Rule("norm_cancels_bias", "a norm that averages each channel's values per sample (instance norm, a group norm "
         "of one channel a group) cancels the producer's bias added before it: the convolution runs without bias",
         _norm_cancels_bias),
    Rule("mean_of_norm", "a spatial mean or sum right after a batch, group or instance norm is finalize's map of "
         "the plane means: no main pass", _mean_of_norm),
)
