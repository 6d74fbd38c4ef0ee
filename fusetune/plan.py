"""Lower an op chain to kernel stages.

Every supported chain has the canonical form

    producer -> pre* -> [norm] -> mid* -> [pool] -> post* -> [reduce] -> final*

where the starred groups are elementwise ops. A norm becomes a per-(sample, channel)
affine map ``A*v + B`` computed by a small ``finalize`` kernel from per-plane sums that
the ``stats`` kernel takes in one pass over the producer output. The main kernel family
then depends on what the chain ends with:

  * ``plane_reduce``   a reduction over all spatial dims (optionally after pooling);
  * ``channel_reduce`` a reduction over the channel dim;
  * ``channel_softmax`` a softmax, log_softmax, L2 normalize or layer norm over the channel dim (the cuDNN
    world's; fusetune/ops/channel.py);
  * ``window_map``     neither: a pooled (or same-size) tensor.

Where the convolution runs, and so which kernel stages run the chain, is a world (producer.impl):
cuDNN's, the convolution inside the kernels on CUDA cores (direct) or on the tensor cores (gemm and
its variants, the K-tiled gemm_wide), the statistics from spectra (spectral), or eager PyTorch. The
search picks among the worlds that take the region.

Each world is a registered class in fusetune/worlds/ (why it is not offered, its stages, its facts);
the plan describes the region alone. The exact algebra the planner reads (the bias an instance norm
cancels, a spatial mean after a norm that finalize computes) is rules in fusetune/regions.py, which
mark the chain's steps before the split.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

from fusetune import broadcast
from fusetune.config import ProblemSpec
from fusetune.errors import PlanError
from fusetune.ops import AdaptivePool, Add, DimReduce, Elementwise, LayerNorm, Norm, Op, Pool, Reduce
from fusetune.ops.channel import CHANNEL_MAPS, ChannelNorm
from fusetune.ops.reduce import KERNEL_MODES, Softmax, kernel_mode
from fusetune.ops.reductions import REDUCTIONS, KernelReduction
from fusetune.regions import AT_SHAPES, CANCELS_BIAS, FROM_STATISTICS, MOVED, RULES, Step, affine, rewrite

#: What a step moved before a pixel shuffle reads repeated, by its role (regions.shuffle_commutes).
_REPEATED = {"elementwise": "its per-channel parameter", "norm": "its running statistics and affine"}
#: The norms the kernels compute: statistics per (sample, channel) sums (batch, group, instance) or none
#: (eval-mode batch norm's running ones).
KERNEL_SCOPES = ("batch", "group", "instance", "running")


@dataclasses.dataclass(frozen=True)
class Plan:
    """One fused region: its ops sorted into the canonical slots, the main family that ends it, and
    what runs after it in PyTorch. Which worlds take it, with which stages, is fusetune.worlds'."""

    spec: ProblemSpec
    pre: tuple[Elementwise, ...]
    norm: Norm | None
    mid: tuple[Elementwise, ...]
    pool: Pool | AdaptivePool | None  # an adaptive pool: a grid of windows whose sizes vary (pool_output)
    post: tuple[Elementwise, ...]
    reduce: Reduce | None
    final: tuple[Elementwise, ...]
    family: str | None  # main kernel family, or None when finalize computes the output
    drop_bias: bool  # the producer's bias is cancelled exactly by the norm: never applied
    head: tuple[Step, ...] = ()  # the fused region's ops, as rewritten (fusetune/regions.py)
    tail: tuple[Step, ...] = ()  # the ops after it, run in PyTorch inside ModelNew
    ends: str | None = None  # why the fused region ends before the tail (None: no tail)
    rules: tuple[str, ...] = ()  # the rewrite rules that changed or marked the chain (regions.RULES)
    dropped: tuple[Step, ...] = ()  # the config's entries the rules dropped (identities, what a norm cancels)
    #: A map over the channels in the reduce slot (channel_softmax): a softmax or log_softmax, or a norm over the
    #: channels (normalize, channel_layer_norm: fusetune/ops/channel.py).
    channel_map: Softmax | ChannelNorm | None = None
    #: The kernels compute a step a rule that holds at the config's shapes only gave its form (regions.AT_SHAPES):
    #: the generated model runs PyTorch's own forward at any other input shape. Not where PyTorch runs that step
    #: after the region, as written, nor where a later region takes it (its problem has it as written, and its
    #: own plan guards its model: pipeline.region_spec); but where a later region takes it composed with another
    #: pool (written as two ops: its problem has the composed form, so the whole chain is guarded here).
    at_shapes: bool = False
    #: The config's extra input (``inputs:``) that ops of the region read (``by: NAME``), None where none does:
    #: the kernels read it at the index they store each element at (INPUT_SLOTS), as ``a.extra``.
    extra: str | None = None
    #: The per-channel parameters the kernels read repeated (name, times): those of ops moved before a pixel
    #: shuffle (regions.shuffle_commutes), each value of C / r^2 read at the r^2 channels that shuffle into it.
    param_repeats: tuple[tuple[str, int], ...] = ()
    #: How many times the kernels read each of the norm's per-channel tensors: r^2 for an eval-mode batch norm moved
    #: before a pixel shuffle (its running statistics and affine, of C / r^2 values), else 1.
    norm_repeat: int = 1

    def param_repeat(self, name: str) -> int:
        """How many times the kernels read each value of parameter ``name`` (torch.repeat_interleave): 1 but where
        an op moved before a pixel shuffle reads it."""
        return dict(self.param_repeats).get(name, 1)

    @property
    def channel_fold(self) -> KernelReduction:
        """The accumulator channel_softmax folds a position's channels into: a softmax's logsumexp (its max and
        sum), normalize's sum of squares, a layer norm's moments (fusetune/ops/channel.py's CHANNEL_MAPS)."""
        return CHANNEL_MAPS[self.channel_map.kind].fold if self.channel_map is not None else REDUCTIONS["logsumexp"]

    @property
    def bias_in_epilogue(self) -> bool:
        """cuDNN applies a bias as a pass of its own; the first kernel adds it for free instead (not where the
        convolution's output is returned too: bias_in_producer)."""
        return self.spec.producer.bias and not self.drop_bias and not self.bias_in_producer

    @property
    def bias_in_producer(self) -> bool:
        """The convolution adds its own bias: where the model also returns its output (``outputs: [chain,
        producer]``), which holds the bias whether or not a norm of the chain cancels it."""
        return self.spec.producer.bias and self.spec.returns_producer

    @property
    def bias_where(self) -> str:
        """Where the producer's bias is applied, as ``fusetune plan`` says it."""
        return ("producer" if self.bias_in_producer else "dropped" if self.drop_bias
                else "epilogue" if self.bias_in_epilogue else "none")

    @property
    def needs_stats(self) -> bool:
        """A statistics pass over the producer output is needed (not for eval-mode batch norm)."""
        return self.norm is not None and self.norm.scope != "running"

    @functools.cached_property
    def impl_stages(self) -> dict[str, tuple[str, ...]]:
        """producer.impl -> its stages in launch order, for every world that takes the region
        (fusetune.worlds.offered: cudnn and eager, the reference as PyTorch runs it, always)."""
        from fusetune.worlds import offered

        return offered(self)

    @property
    def stages(self) -> tuple[str, ...]:
        """Every kernel family of the module (all worlds; finalize serves them all), in a fixed order."""
        ordered: list[str] = []
        for stages in self.impl_stages.values():
            ordered += [s for s in stages if s not in ordered]
        return tuple(ordered)

    @property
    def pre_scale(self) -> tuple[Elementwise, ...] | None:
        """The multiplicative ops of the pre chain where that chain is affine per channel (mul, div and
        add only), else None. Then pre(y) - pre(p) = scale * (y - p): statistics kernels may sum raw
        convolution values around a raw pivot and scale the sums once at the end."""
        if affine(self.pre):
            return tuple(op for op in self.pre if not isinstance(op, Add))
        return None

    @property
    def pool_window(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """The pooling window and stride, 3-D (a 2-D one padded with a leading 1); ones without a pool. An
        adaptive pool's windows vary (pool_output): the one window they are at the config's shapes
        (adaptive_window), else zeros, which the worlds whose kernels pool fixed windows of their boxes
        refuse (facts.fixed_window_refusal)."""
        if self.pool is None:
            return (1, 1, 1), (1, 1, 1)
        if isinstance(self.pool, AdaptivePool):
            window = self.adaptive_window or (0, 0, 0)
            return window, window
        pad = (1,) * (3 - self.spec.producer.spatial_dims)
        return pad + tuple(self.pool.kernel_size), pad + tuple(self.pool.stride)

    @property
    def pool_padding(self) -> tuple[int, int, int]:
        """The pool's padding, 3-D (zeros without a pool or without padding). Only the cuDNN world's
        main kernels (window_map, plane_reduce) pool padded windows: the kernels that compute the
        convolution inside them build their boxes of whole unpadded windows, so they refuse it."""
        if not isinstance(self.pool, Pool) or self.pool.padding is None:
            return (0, 0, 0)
        return (0,) * (3 - self.spec.producer.spatial_dims) + tuple(self.pool.padding)

    @property
    def pool_dilation(self) -> tuple[int, int, int]:
        """A max pool's dilation, 3-D (ones without a pool or without dilation). Only the cuDNN world's main
        kernels (window_map, plane_reduce) pool dilated windows: the kernels that compute the convolution inside
        them build their boxes of whole undilated windows, so they refuse it (facts.fixed_window_refusal)."""
        if not isinstance(self.pool, Pool) or self.pool.dilation is None:
            return (1, 1, 1)
        return (1,) * (3 - self.spec.producer.spatial_dims) + tuple(self.pool.dilation)

    @property
    def pool_divisor(self) -> int | None:
        """An average pool's divisor for every window where it has a divisor_override (PyTorch's), else None
        (the whole window's size: pool.j2's reciprocal)."""
        return self.pool.divisor_override if isinstance(self.pool, Pool) else None

    @property
    def adaptive_window(self) -> tuple[int, int, int] | None:
        """The one window (3-D; its stride the same) an adaptive pool's windows all are at every shape of the
        config, where its output divides its input there into one window size, not all ones (the identity);
        None where they differ, or without an adaptive pool. The kernels that pool fixed windows of their boxes
        take the pool as that window, exact at the config's shapes only (at_shapes_worlds)."""
        if self.pool_output is None:
            return None
        windows = set()
        for shape in self.spec.shapes:
            sizes = (1,) * (3 - self.spec.producer.spatial_dims) + tuple(self.spec.producer.out_shape(shape)[2:])
            if any(size % out for size, out in zip(sizes, self.pool_output)):
                return None
            windows.add(tuple(size // out for size, out in zip(sizes, self.pool_output)))
        window = windows.pop() if len(windows) == 1 else None
        return window if window is not None and window != (1, 1, 1) else None

    @property
    def at_shapes_worlds(self) -> tuple[str, ...]:
        """The offered worlds whose kernels pool the region's adaptive pool as the fixed window it is at the
        config's shapes (adaptive_window; facts.FIXED_WINDOW_STAGES): exact there only, so that at another
        input shape the generated model runs PyTorch's forward where one of them won. The others pool
        PyTorch's adaptive windows at any shape."""
        from fusetune.worlds.facts import FIXED_WINDOW_STAGES

        if self.pool_output is None:
            return ()
        return tuple(impl for impl, stages in self.impl_stages.items() if set(stages) & set(FIXED_WINDOW_STAGES))

    @property
    def pool_output(self) -> tuple[int, int, int] | None:
        """An adaptive pool's output sizes, 3-D (a leading 1 where the producer has fewer dims: a window of
        the whole size-1 dim); None for a window pool or none. Output index i of ``out`` over an input of
        ``size`` pools PyTorch's window (ops/pool.py's ADAPTIVE_BOUNDS) at any input shape."""
        if not isinstance(self.pool, AdaptivePool):
            return None
        return (1,) * (3 - self.spec.producer.spatial_dims) + tuple(self.pool.output_size)

    @property
    def param_names(self) -> tuple[str, ...]:
        """Learnable per-channel parameters the kernels read, in slot order."""
        names: list[str] = []
        channel_norm = (self.channel_map,) if isinstance(self.channel_map, ChannelNorm) else ()
        for op in (*self.pre, *self.mid, *self.post, *channel_norm, *self.final):
            for name in op.params():
                if name not in names:
                    names.append(name)
        return tuple(names)

    def fused_output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape the kernels write for an input shape: the convolution's output through the fused
        region (the whole chain's output where nothing runs after it in PyTorch)."""
        out = self.spec.producer.out_shape(shape)
        for step in self.head:
            out = step.op.out_shape(out)
        return out

    def regions(self) -> list[str]:
        """What runs where, region by region, as ``fusetune plan`` prints it: the fused region (the
        convolution and the ops the kernels take) and, where the chain goes on, what runs in PyTorch
        after it and why the kernels stop there."""
        from fusetune.pipeline import later_segments

        producer = self.spec.producer.kind
        fused = ", ".join(step.where for step in self.head) or "the convolution alone"
        lines = [f"region 0 (fused kernels): {producer} -> {fused}"]
        if self.dropped:
            lines.append(f"  dropped (the result is the same without: the rewrites listed say why): "
                         f"{', '.join(s.where for s in self.dropped)}")
        if self.at_shapes_worlds:
            window = " x ".join(str(k) for k in self.adaptive_window[3 - self.spec.producer.spatial_dims:])
            lines.append(f"  exact at the config's shapes only in worlds {', '.join(self.at_shapes_worlds)}: their "
                         f"kernels pool fixed windows, and the adaptive pool's are one {window} window there; at "
                         "another shape ModelNew runs PyTorch's forward where one of them won (the other worlds "
                         "pool PyTorch's adaptive windows at any shape)")
        moved = [step for step in (*self.head, *self.tail) if MOVED in step.marks]
        if moved:
            why = next(rule.doc for rule in RULES if rule.name == "shuffle_commutes")
            lines.append(f"  moved before a pixel shuffle (shuffle_commutes: {why}): " + "; ".join(
                step.where + (f", {_REPEATED[step.op.role]} repeated {step.repeat} times" if step.repeat > 1 else "")
                for step in moved))
        if self.at_shapes:
            why = "; ".join(rule.doc for rule in RULES if rule.at_shapes and rule.name in self.rules)
            lines.append(f"  exact at the config's shapes only ({why}): at another shape ModelNew runs PyTorch's "
                         "forward")
        if self.tail:
            lines.append(f"  ends: {self.ends.split(': ', 1)[-1] if self.ends else ''}")
        for segment in later_segments(self):
            if segment.kernels:
                worlds = ", ".join(w for w in make_plan(segment.spec).impl_stages)
                lines.append(f"region {segment.index} (kernels on region {segment.index - 1}'s output, tuned as "
                             f"{segment.spec.name}; worlds {worlds}): {segment.where}")
                if segment.view is not None:
                    lines.append(f"  view: {segment.view.describe(segment.inputs[0])}")
            else:
                views = all(step.op.role == "view" for step in segment.steps)
                lines.append(f"region {segment.index} (PyTorch{', a view: free' if views else ''}): {segment.where}")
                lines.append(f"  why: {segment.why}")
        return lines

    def describe(self) -> str:
        """One line: the default world's stages, each other world's (not the reference's own forwards,
        which have none), and the region's slots."""
        from fusetune.worlds import DEFAULT, WORLDS

        def names(ops: Sequence[Op]) -> str:
            return ",".join(op.kind for op in ops) or "-"
        worlds = "".join(f" {impl}={'+'.join(stages) or WORLDS[impl].launch}" for impl, stages in self.impl_stages.items()
                         if impl != DEFAULT and not WORLDS[impl].runs_reference)
        return (f"stages={'+'.join(self.impl_stages[DEFAULT])}{worlds} pre={names(self.pre)} "
                f"norm={self.norm.kind if self.norm else '-'} mid={names(self.mid)} "
                f"pool={self.pool.kind if self.pool else '-'} post={names(self.post)} "
                f"reduce={self.reduce.kind if self.reduce else '-'} final={names(self.final)} "
                f"bias={self.bias_where}"
                + (f" extra={self.extra}" if self.extra else ""))


#: Learnable per-channel parameters one module can read (FT_MAX_PARAMS in templates/args.h.j2).
MAX_PARAMS = 8
_SLOTS = ("pre", "norm", "mid", "pool", "post", "reduce", "final")
#: The map slots whose values still stand one to one for the convolution's outputs, so that an op there may
#: read the convolution's output at the same position (``by: producer``): before the norm, and after it (a
#: norm maps each value in place; every main stage has the convolution's value there: facts.PRODUCER_STAGES).
PRODUCER_SLOTS = ("pre", "mid")
#: Why an op after a slot's op cannot read the convolution's output: the values no longer stand for positions.
_PRODUCER_GONE = {
    "pool": "pool: a pooled value stands for a window of positions, and the convolution's output at a position "
            "is gone",
    "reduce": "reduction or softmax: the kernels apply the chain after it to what they reduced or normalised, "
              "without the convolution's output at a position",
}
#: The map slots where an op may read an extra input (``by: NAME`` of ``inputs:``): the chains the kernels apply
#: where they store each element (ft_post, ft_final), which read the input at the stored index. Without a pool
#: the value of a position is the output's there, so an op that reads an input starts the post chain (a pool of
#: one element stands between mid and post); not before a reduction or softmax, whose input the kernels never
#: store (the op must come after it, in the final chain).
INPUT_SLOTS = ("post", "final")
#: A softmax or a norm over the channels takes the reduce slot: it ends the region's reductions and maps as a
#: reduction does.
_ROLE_SLOT = {"norm": 1, "pool": 3, "adaptive": 3, "reduce": 5, "softmax": 5, "channel_norm": 5}
#: A role as the planner's messages name it: an adaptive pool is a pool.
_ROLE_NAME = {"adaptive": "pool", "channel_norm": "norm over the channels"}


def make_plan(spec: ProblemSpec) -> Plan:
    """The fused region and what runs after it in PyTorch. Never raises for a valid config.

    After the exact rewrites (fusetune/regions.py), the longest prefix of the chain that the kernels
    take is the fused region; the rest (``tail``) runs in PyTorch inside the generated ModelNew, and
    ``ends`` says why the region stops where it does. A prefix may be empty: the kernels then compute
    the convolution (and its bias) alone, which is still a region to tune (the worlds that compute it
    inside the kernels may beat cuDNN), and its output is the convolution's, so a later op may read it
    (``by: producer``)."""
    rewritten = rewrite(spec)
    steps = rewritten.steps
    ends = None
    for cut in range(len(steps), -1, -1):
        head, tail = steps[:cut], steps[cut:]
        try:
            readers = [s for s in tail if s.op.uses_producer()]
            if cut and readers:
                raise PlanError(_reader_refusal(spec, steps, readers[-1]))
            plan = _plan_region(spec, head)
        except PlanError as exc:
            ends = str(exc)
            continue
        plan = dataclasses.replace(plan, head=head, tail=tail, ends=_why_tail(spec, head, tail, ends),
                                   rules=rewritten.fired, at_shapes=any(AT_SHAPES in s.marks for s in head),
                                   dropped=rewritten.dropped)
        return dataclasses.replace(plan, at_shapes=True) if _composed_at_shapes_later(plan) else plan
    raise AssertionError("the empty region is always planned")  # pragma: no cover


def _composed_at_shapes_later(plan: Plan) -> bool:
    """Whether a later region of kernels takes a step that a rule holding at the config's shapes only gave its form
    (regions.AT_SHAPES) composed of several written ops: its problem (pipeline.region_spec) can only have the
    composed form, exact at those shapes alone, so the whole chain's model must know them (Plan.at_shapes)."""
    if plan.at_shapes or not any(AT_SHAPES in s.marks and len(s.written) > 1 for s in plan.tail):
        return False
    from fusetune.pipeline import later_segments

    return any(AT_SHAPES in s.marks and len(s.written) > 1
               for segment in later_segments(plan) if segment.kernels for s in segment.steps)


def _reader_refusal(spec: ProblemSpec, steps: Sequence[Step], reader: Step) -> str:
    """Why a region of kernels before ``reader``, an op that reads the convolution's output (by: producer),
    would leave it without that output: only region 0's kernels have it, and they do not take the chain up to
    the reader (the last one: a region that took it would have been planned first). Region 0 then computes the
    convolution alone, whose output the reader reads in PyTorch."""
    try:
        _plan_region(spec, steps[:list(steps).index(reader) + 1])
        why = "the kernels take it only before their pool or reduction"  # pragma: no cover (the reader is the last)
    except PlanError as exc:
        why = str(exc).removeprefix(f"{spec.path}: ")
    if not why.startswith(f"{reader.where} reads the convolution's output"):
        why = (f"{reader.where} reads the convolution's output (by: producer), which only region 0's kernels have, "
               f"and they do not take the chain up to it ({why})")
    return f"{spec.path}: {why}; region 0 computes the convolution alone, whose output it reads in PyTorch"


def _why_tail(spec: ProblemSpec, head: tuple[Step, ...], tail: tuple[Step, ...], ends: str | None) -> str | None:
    """Why the kernels stop before the tail: where it starts with views (free), why its first op
    that does work could not join the region."""
    work = [i for i, step in enumerate(tail) if step.op.role != "view"]
    if not work or work[0] == 0:
        return ends
    try:
        _plan_region(spec, head + (tail[work[0]],))
    except PlanError as exc:
        return str(exc)
    return ends


def _plan_region(spec: ProblemSpec, steps: Sequence[Step]) -> Plan:
    """Sort a region's ops into the canonical slots; ``PlanError`` where the kernels cannot take them."""
    groups: dict[str, list[Step]] = {slot: [] for slot in _SLOTS}
    position = 0  # index into _SLOTS of the latest filled slot
    reader: Step | None = None  # the first op that reads an extra input (by: NAME of inputs:)
    for step in steps:
        op = step.op
        refusal = _kernel_refusal(op)
        if refusal is None and isinstance(op, LayerNorm) and op.in_rank != 2 + spec.producer.spatial_dims:
            refusal = (f"a {op.kind} parsed for an input of rank {op.in_rank}, here of rank "
                       f"{2 + spec.producer.spatial_dims}: its scope would not be its dims'; it runs after this region (in a "
                       "later one, on the plane view of its input)")
        if refusal is not None:
            raise PlanError(f"{spec.path}: {step.where}: {refusal}")
        if op.role == "elementwise":
            position = position if _SLOTS[position] in ("pre", "mid", "post", "final") else position + 1
            if op.uses_producer() and _SLOTS[position] not in PRODUCER_SLOTS:
                if reader is not None and not groups["pool"] and _SLOTS[position] == "post":
                    raise PlanError(f"{spec.path}: {step.where} reads the convolution's output (by: producer) after "
                                    f"{reader.where}, which reads input '{reader.op.reads_input()}': the kernels read "
                                    "an input where they store an element (their post chain), where the "
                                    "convolution's output is not kept")
                raise PlanError(f"{spec.path}: {step.where} reads the convolution's output (by: producer) after a "
                                f"{_PRODUCER_GONE[_SLOTS[position - 1]]}")
            name = op.reads_input()
            if name is not None and reader is not None and reader.op.reads_input() != name:
                raise PlanError(f"{spec.path}: {step.where} reads input '{name}', and {reader.where} reads "
                                f"'{reader.op.reads_input()}': the kernels read one extra input a region; it runs "
                                "after this region")
            if name is not None and _SLOTS[position] not in INPUT_SLOTS:
                position = _SLOTS.index("post")  # no pool before it: the value of a position is the stored one's
            reader = reader or (step if name is not None else None)
            groups[_SLOTS[position]].append(step)
            continue
        if reader is not None and _SLOTS[position] != "final":
            raise PlanError(f"{spec.path}: {step.where}: a {op.role} after {reader.where}, which reads input "
                            f"'{reader.op.reads_input()}': the kernels read an input only at the element they store, "
                            f"after their norm, pool and reduction; it runs after this region")
        target = _ROLE_SLOT[op.role]
        if target < position or (target == position and groups[_SLOTS[target]]):
            raise PlanError(f"{spec.path}: {step.where}: the kernels fuse chains of the form elementwise* [norm] "
                            f"elementwise* [pool] elementwise* [reduce] elementwise*; a "
                            f"{_ROLE_NAME.get(op.role, op.role)} cannot come here")
        position = target
        groups[_SLOTS[target]].append(step)
    ops = {slot: tuple(step.op for step in group) for slot, group in groups.items()}
    norm = groups["norm"][0] if groups["norm"] else None
    pool = ops["pool"][0] if ops["pool"] else None
    reduce = groups["reduce"][0] if groups["reduce"] else None
    family = _family(spec, pool, reduce)
    if norm is not None and norm.op.element_affine:
        from fusetune.worlds.facts import ELEMENT_AFFINE_STAGES

        if family not in ELEMENT_AFFINE_STAGES:  # (a reduce or softmax over the channels: family is not None)
            raise PlanError(f"{spec.path}: {reduce.where}: the kernels apply a {norm.op.kind}'s per-element affine "
                            f"only in a region that ends in a map, a pool or a reduction over space (the families "
                            f"of facts.ELEMENT_AFFINE_STAGES), not before {family}; it runs after this region")
    plan_params = {name for step in steps if step.op.role in ("elementwise", "channel_norm")
                   for name in step.op.params()}
    if len(plan_params) > MAX_PARAMS:
        raise PlanError(f"{spec.path}: the chain reads {len(plan_params)} learnable parameters; the kernels take "
                        f"at most {MAX_PARAMS}")
    channel_map = reduce.op if reduce and isinstance(reduce.op, (Softmax, ChannelNorm)) else None
    scalars = spec.scalar_parameters
    repeats = tuple(dict.fromkeys((name, step.repeat) for step in steps for name in step.repeated_params(scalars)))
    plan = Plan(spec=spec, pre=ops["pre"], norm=norm.op if norm else None, mid=ops["mid"], pool=pool,
                post=ops["post"], reduce=reduce.op if reduce and not channel_map else None, final=ops["final"],
                family=family, drop_bias=norm is not None and CANCELS_BIAS in norm.marks,
                channel_map=channel_map,
                extra=reader.op.reads_input() if reader else None, param_repeats=repeats,
                norm_repeat=norm.repeat if norm else 1)
    broadcast.check_plan(plan)  # a broadcast input (inputs: shape:) read where the kernels know its (n, c)
    return plan


#: Why the kernels do not take an op of a role, where no kernel family computes that role at all.
_ROLE_REFUSALS = {
    "view": "a view of the kernels' output, free in PyTorch",
    "gate": ("a gated unit multiplies each value by a gate half its dim away (C/2 channels), and no kernel family "
             "reads both of a pair (fusetune/ops/gate.py); it runs in PyTorch between regions"),
    "shuffle": ("a pixel shuffle moves each value to another channel and position, a permutation copy no kernel "
                "family writes (fusetune/ops/shuffle.py); it runs in PyTorch between regions"),
}


def _kernel_refusal(op: Op) -> str | None:
    """Why no kernel family takes this op wherever it stands, None where one may."""
    if op.role in _ROLE_REFUSALS:
        return _ROLE_REFUSALS[op.role]
    if isinstance(op, Softmax) and op.widens:
        return (f"a {op.kind} with dtype={op.dtype} returns {op.dtype}, wider than the config's dtype, which the "
                f"kernels store; it and every op after it run in PyTorch, in {op.dtype}")
    if isinstance(op, Softmax) and op.dim != 1:
        return (f"a {op.kind} over dim {op.dim} (the kernels normalise over the channels, dim 1, only); "
                "it runs after this region (in a later one, on a view of its input, or in PyTorch)")
    if isinstance(op, ChannelNorm):
        return op.kernel_refusal()
    if isinstance(op, Norm) and op.scope not in KERNEL_SCOPES:
        return (f"the kernels' norms take statistics per (sample, channel) plane, per sample or per channel "
                f"({', '.join(KERNEL_SCOPES)}); {op.outside_scopes()}")
    if isinstance(op, Pool) and not op.exact_in_kernels:
        what = ("ceil_mode=True (a partial last window), adding a window at one of the config's shapes or more,"
                if op.ceil_mode else "count_include_pad=False")
        how = "in floor mode" + (", dividing by the whole window's size" if op.mode == "avg" else "")
        return f"the kernels pool whole windows, {how}; {what} runs in PyTorch after this region"
    if isinstance(op, Reduce) and kernel_mode(op.mode) not in REDUCTIONS:
        return f"the kernels reduce by {', '.join(REDUCTIONS)}; {op.mode} runs in PyTorch"
    if isinstance(op, DimReduce) and op.dims != (1,) and op.dims != (op.dim,):
        return (f"the kernels reduce over the channel dim, or by {', '.join(KERNEL_MODES)} over every spatial dim; "
                f"not {op.mode} over dims {list(op.dims)}, which runs after this region (in a later one, on a view "
                "of its input, or in PyTorch)")
    return None


#: Where an op the region does not take goes (fusetune/pipeline.py decides which, and says it per region).
_AFTER_REGION = "it runs after this region (in a later one, on a view of its input, or in PyTorch)"


def _family(spec: ProblemSpec, pool: Pool | AdaptivePool | None, reduce: Step | None) -> str | None:
    """The main kernel family that ends the region, None where finalize computes the output (the rule
    regions.mean_of_norm marked the reduction); a softmax or a norm over the channels in the reduce slot is
    channel_softmax's."""
    if reduce is None:
        return "window_map"
    if isinstance(reduce.op, (Softmax, ChannelNorm)):
        if pool is not None:
            raise PlanError(f"{spec.path}: {reduce.where}: the kernels do not normalise over channels after a pool; "
                            f"{_AFTER_REGION}")
        return "channel_softmax"
    if FROM_STATISTICS in reduce.marks:
        return None
    if reduce.op.over == "spatial":
        return "plane_reduce"
    if reduce.op.dim == 1:
        if pool is not None:
            raise PlanError(f"{spec.path}: {reduce.where}: the kernels do not reduce over channels after a pool; "
                            f"{_AFTER_REGION}")
        return "channel_reduce"
    raise PlanError(f"{spec.path}: {reduce.where}: the kernels reduce over the channel dim or over every spatial "
                    f"dim, not over dim {reduce.op.dim}; {_AFTER_REGION}")
