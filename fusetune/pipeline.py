"""A chain as a pipeline of regions: the first computes the convolution (fusetune/plan.py), the later
ones read the tensor the one before wrote.

``make_plan`` fuses the longest prefix of the chain the kernels take (region 0). What follows it is cut
here into segments, in order:

  * a later region: the longest run of ops the kernels take, planned as a problem of its own whose
    producer is the tensor it reads (``Producer.tensor``: no convolution; the worlds that compute one
    inside refuse it) and whose shapes are that tensor's at the config's shapes. It is searched and
    cached like any config (its own key), and the generated ModelNew runs its tuned module there.
    A later region may carry a view of its input (fusetune/views.py): a reduction or softmax over dims
    other than the channel dim or every spatial one, or on a tensor without the (N, C, spatial...)
    structure (a 2-D tensor after a flatten), is one over dim 1 (or over space) of a free view of the
    contiguous tensor, and a layer norm or a mean centring over the last k dims an instance norm's over
    the plane view; the region's problem is planned on the view's shape, and the generated ModelNew
    views the tensor in before the region and the region's output back to the chain's shape after it;
  * PyTorch: a view (free), an op no kernel family computes (a mean centring over dims that are not the
    last ones nor a scope of the statistics pass, a reduction over dims that are not consecutive), an
    op that reads the convolution's output (which only region 0 has), or any op after a softmax whose
    ``dtype`` widens the tensor past the config's (the kernels read and store the config's dtype). It runs
    with the reference's own modules, and the segment says why.

Where a later region has no tuned module (not searched yet, or a search that found nothing), ModelNew
runs its ops in PyTorch, exactly as before this module existed: a pipeline never needs more than the
first region's winner to run.
"""
from __future__ import annotations

import dataclasses
import functools

from fusetune.config import DEFAULT_OUTPUTS, ProblemSpec
from fusetune.errors import PlanError
from fusetune.ops import DimReduce, Op, Shape
from fusetune.plan import Plan, _kernel_refusal, make_plan
from fusetune.producers import Producer
from fusetune.regions import AT_SHAPES, Step, reference_attr
from fusetune.views import RegionView, region_view, view_op


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of the chain after region 0: a later region of kernels (``spec`` set) or PyTorch (``why``)."""

    index: int  # its place in the pipeline: region 1, 2, ...
    steps: tuple[Step, ...]
    spec: ProblemSpec | None = None  # the region as a problem of its own, where the kernels take it
    why: str | None = None  # why PyTorch runs it, where they do not
    #: (the region's reference attribute, the chain's) for each op with a module (a norm): the region's
    #: ModelNew runs the chain's very modules.
    attrs: tuple[tuple[str, str], ...] = ()
    #: The view of its input the region's problem is planned on (None: the tensor as it is).
    view: RegionView | None = None
    #: The chain's tensor it reads, at each of the config's shapes (before its view).
    inputs: tuple[Shape, ...] = ()

    @property
    def kernels(self) -> bool:
        return self.spec is not None

    @property
    def where(self) -> str:
        return ", ".join(step.where for step in self.steps)

    def view_document(self) -> dict | None:
        """The region's view as ``fusetune plan --json`` shows it: the fact, and at each of the config's
        shapes the chain's tensor, the shape the region's problem sees, and the chain's shape after it."""
        if self.view is None:
            return None
        return {**self.view.fact(), "tensor": [list(s) for s in self.inputs],
                "as": [list(self.view.shape(s)) for s in self.inputs],
                "back": [list(self.view.back(s)) for s in self.inputs]}

    @property
    def params(self) -> tuple[str, ...]:
        """The chain's learnable parameters the region reads (by their names, which it keeps)."""
        return tuple(p.name for p in self.spec.parameters) if self.spec else ()

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        """The chain's extra inputs the region reads (forward arguments of its model after x, in order)."""
        return self.spec.inputs if self.spec else ()


def later_segments(plan: Plan) -> tuple[Segment, ...]:
    """The segments after region 0, in order; none where the kernels take the whole chain."""
    return _segments(plan)


@functools.lru_cache(maxsize=256)
def _segments(plan: Plan) -> tuple[Segment, ...]:
    spec = plan.spec
    shapes = [plan.fused_output_shape(s) for s in spec.shapes]
    rest = list(plan.tail)
    scalars = spec.scalar_parameters
    out: list[Segment] = []
    pytorch: list[Step] = []
    why: list[str] = []

    def flush() -> None:
        if pytorch:
            out.append(Segment(index=len(out) + 1, steps=tuple(pytorch), why="; ".join(dict.fromkeys(why))))
            pytorch.clear()
            why.clear()

    dtype = spec.dtype  # the tensor's element type: another after a softmax's dtype, which PyTorch then runs
    while rest:
        step = rest[0]
        refusal = _refusal(step, shapes[0], scalars) if dtype == spec.dtype else (
            f"{step.where}: the tensor is {dtype} here (a softmax's dtype before it), and the kernels read and "
            f"store the config's {spec.dtype}")
        region = refusal or _region(spec, rest, shapes, len(out) + 1 + bool(pytorch))
        if isinstance(region, str):
            pytorch.append(step)
            why.append(region)
            shapes = [step.op.out_shape(s) for s in shapes]
            dtype = step.op.out_dtype(dtype)
            rest = rest[1:]
            continue
        flush()
        region = dataclasses.replace(region, index=len(out) + 1, inputs=tuple(tuple(s) for s in shapes))
        out.append(region)
        for taken in region.steps:
            shapes = [taken.op.out_shape(s) for s in shapes]
        rest = rest[len(region.steps):]
    flush()
    return tuple(out)


def _refusal(step: Step, shape: Shape, scalars: frozenset[str] = frozenset()) -> str | None:
    """Why no later region starts at this step, None where one may (with a view, where it needs one); a map
    by a parameter of ``scalars`` (a single value) runs on any view."""
    op = step.op
    if op.role == "view":
        return f"{step.where}: a view, free in PyTorch"
    if op.uses_producer():
        return f"{step.where} reads the convolution's output (by: producer), which only the first region has"
    view = region_view([op], shape, scalars)
    if isinstance(view, str):
        return f"{step.where}: {view}"
    target = view_op(op, view) if view is not None else op
    # a reduction's form is the region's own rewrites' to find (regions.py): its plan says why where it fails
    refusal = None if isinstance(target, DimReduce) else _kernel_refusal(target)
    return f"{step.where}: {refusal}" if refusal else None


def _region(spec: ProblemSpec, rest: list[Step], shapes: list[Shape], index: int) -> Segment | str:
    """The later region that starts at ``rest[0]``: the longest run the kernels take, on the view of its
    input that run needs (fusetune/views.py); where they take none of it, why not (the planner's reason
    for the first op alone)."""
    why = f"{rest[0].where}: the kernels take none of it alone"
    for end in range(len(rest), 0, -1):
        steps = tuple(rest[:end])
        if any(s.op.uses_producer() for s in steps):
            continue
        if any(s.repeat > 1 for s in steps):  # its problem would size the parameter at the channels it reads it at
            if end == 1:
                why = (f"{rest[0].where}: moved before a pixel shuffle, it reads its per-channel parameter repeated, "
                       "which only the first region's kernels do")
            continue
        view = region_view([s.op for s in steps], shapes[0], spec.scalar_parameters)
        if view is not None and any(s.op.reads_input() for s in steps):
            continue  # an extra input has the chain's shape, not the view's
        if isinstance(view, str):
            if end == 1:
                why = f"{rest[0].where}: {view}"
            continue
        try:
            region = region_spec(spec, steps, shapes, index, view)
            plan = make_plan(region)
        except PlanError as exc:  # pragma: no cover - make_plan plans every valid chain
            why = str(exc)
            continue
        if end == 1 and plan.ends:
            why = f"{rest[0].where}: {plan.ends.split(': ', 1)[-1].split(': ', 1)[-1]}"
        if plan.tail or not plan.head:
            continue  # the kernels stop inside it: a shorter run is the region
        attrs = tuple((reference_attr(region, i), step.attr) for i, step in enumerate(steps)
                      if reference_attr(region, i) is not None and step.attr is not None)
        return Segment(index=index, steps=steps, spec=region, attrs=attrs, view=view)
    return why


def region_spec(spec: ProblemSpec, steps: tuple[Step, ...], shapes: list[Shape], index: int,
                view: RegionView | None = None) -> ProblemSpec:
    """A later region as a problem of its own: the chain's numerics and search settings, its producer
    the tensor it reads (at ``shapes``, the tensor's shape at each of the config's; through ``view`` where
    it has one, its ops then the view's), its ops as the rewritten chain has them, the chain's parameters
    they read (same names). A step a rule holding at the config's shapes only gave its form (regions.AT_SHAPES: a
    ceil-mode pool that adds no window there) is its op as written, so that the region's own plan finds that form
    and guards its model (Plan.at_shapes); composed with another op, its form (make_plan guards the chain)."""
    if view is not None:
        shapes = [view.shape(s) for s in shapes]
    first = shapes[0]
    # A run-time channel count on a view, and where the tensor's dim 1 differs between the config's shapes (a batch
    # dim an unsqueeze(0) moved there): never the first shape's size fixed into kernels tuned at the others.
    varies = len({s[1] for s in shapes}) > 1
    producer = Producer.tensor(first[1], len(first) - 2, any_channels=view is not None or varies)
    ops = tuple(view_op(_as_written(step), view) if view is not None else _as_written(step) for step in steps)
    names = {name for op in ops if op.role in ("elementwise", "channel_norm") for name in op.params()}
    parameters = tuple(p for p in spec.parameters if p.name in names)
    inputs = tuple(name for name in spec.inputs if any(op.reads_input() == name for op in ops))
    return dataclasses.replace(spec, name=f"{spec.name}_r{index}", producer=producer, parameters=parameters,
                               epilogue=ops, shapes=tuple(tuple(s) for s in shapes), inputs=inputs,
                               input_kinds=tuple((n, k) for n, k in spec.input_kinds if n in inputs),
                               outputs=DEFAULT_OUTPUTS)  # the convolution's output is region 0's to return


def _as_written(step: Step) -> Op:
    """The op a later region's problem has for a step: as the config wrote it where a rule holding at the config's
    shapes only gave it its form (and it is one written op), else the step's op."""
    return step.written[0] if AT_SHAPES in step.marks and len(step.written) == 1 else step.op


def problems(spec: ProblemSpec) -> list[ProblemSpec]:
    """Everything a config asks to tune: the chain (region 0, with the rest in PyTorch) and each later
    region of kernels, each with its own shapes. ``fusetune search``, ``submit`` and ``deploy`` tune them all."""
    return [spec, *(s.spec for s in later_segments(make_plan(spec)) if s.spec is not None)]


def region_shapes(spec: ProblemSpec, region: ProblemSpec, shapes: list[Shape]) -> list[Shape]:
    """A later region's input shapes at some of the config's shapes (its own shapes are at all of them, in order)."""
    return [region.shapes[spec.shapes.index(tuple(s))] for s in shapes]


def expand(spec: ProblemSpec, shapes: list[Shape]) -> list[tuple[ProblemSpec, list[Shape]]]:
    """``(spec, shapes)`` and, after it, each later region of kernels at the shapes its tensor has at
    those of the config (what ``fusetune search`` tunes for them, in order: the first region first)."""
    out = [(spec, list(shapes))]
    for segment in later_segments(make_plan(spec)):
        if segment.spec is not None:
            out.append((segment.spec, region_shapes(spec, segment.spec, shapes)))
    return out
