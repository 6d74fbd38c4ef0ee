"""Free views that bring a later region's tensor into a form the kernels take: the one place that says
which view a later region runs on, what its problem sees, and how its output goes back to the chain's shape.

A later region (fusetune/pipeline.py) reads a contiguous tensor. Over a run of consecutive dims
``[first..last]`` of a contiguous tensor of shape S, a reduction, softmax, log_softmax or logsumexp
equals the same op over dim 1 of the view ``(prod(S[:first]), prod(S[first..last]), prod(S[last+1:]))``
(``channels``: what channel_reduce and channel_softmax take as (N, C, L)), and where the run is S's
trailing dims, a reduction equals one over the spatial dim of ``(prod(S[:first]), 1, prod(S[first:]))``
(``plane``: plane_reduce's (N, C, L), a plane a row, far more parallel than one thread a row); a layer
norm over the last k dims (and a mean centring over them) is an instance norm over the spatial dim of
the plane view. Both
views keep the elements where they are, so they are free; ``keepdim`` and the output's shape are a view
back (``after``). A map that reads no per-channel parameter runs on any view; one that does would read
the view's dim 1 as the chain's channels, so a region with a view holds none.

``RegionView`` is the fact a later region carries (its problem is planned on ``shape``, and the generated
ModelNew folds its input with ``shape`` and unfolds its output with ``back``, templates/model.py.j2's
``_fold``/``_unfold``, which compute the same from ``fact``); ``VIEWERS`` is the table of which op takes
which view, one small typed function per kind of op, and ``region_view`` chooses a run's.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

from fusetune.ops import DimReduce, LayerNorm, MeanCentre, Op, Shape
from fusetune.ops.reduce import KERNEL_MODES, Softmax, kernel_mode
from fusetune.ops.reductions import REDUCTIONS

#: The views, and what the kernels see in each.
FORMS = {
    "channels": "the run as the channel dim of (before, run, after): channel_reduce, channel_softmax",
    "plane": "the trailing run as the spatial dim of (before, 1, run): plane_reduce",
}
#: How the region's output goes back to the chain's shape: its input's shape (a softmax), the run's dims
#: kept with size 1 (keepdim), or dropped.
AFTER = ("same", "keepdim", "drop")


@dataclasses.dataclass(frozen=True)
class RegionView:
    """A later region's view of its contiguous input: dims ``first..last`` folded into the view's dim 1
    (``channels``) or its spatial dim (``plane``), and the view back to the chain's shape (``after``)."""

    first: int
    last: int
    form: str
    after: str

    def __post_init__(self) -> None:
        if self.form not in FORMS or self.after not in AFTER or not 1 <= self.first <= self.last:
            raise ValueError(f"not a region view: {self}")

    def shape(self, shape: Shape) -> Shape:
        """What the region's problem sees of a tensor of ``shape`` (always rank 3: a tensor1d producer)."""
        before = math.prod(shape[:self.first])
        run = math.prod(shape[self.first:self.last + 1])
        after = math.prod(shape[self.last + 1:])
        return (before, run, after) if self.form == "channels" else (before, 1, run * after)

    def back(self, shape: Shape) -> Shape:
        """The chain's shape after the region, from its input's ``shape`` (the view of the region's output)."""
        if self.after == "same":
            return tuple(shape)
        run = range(self.first, self.last + 1)
        if self.after == "keepdim":
            return tuple(1 if i in run else s for i, s in enumerate(shape))
        return tuple(s for i, s in enumerate(shape) if i not in run)

    def fact(self) -> dict[str, Any]:
        """The view as data, for the generated model and ``fusetune plan --json``."""
        return dataclasses.asdict(self)

    def describe(self, shape: Shape) -> str:
        """``dims 2..3 of [2, 7, 10, 13] as [14, 1, 130] (plane), back to [2, 7, 1, 1]``: what the region
        reads at ``shape``, the shape its problem sees, and the chain's after it."""
        region_out = self.back(shape)
        dims = f"dim {self.first}" if self.first == self.last else f"dims {self.first}..{self.last}"
        return (f"{dims} of {list(shape)} as {list(self.shape(shape))} ({self.form}), "
                f"back to {list(region_out)}")


def _run(dims: Sequence[int]) -> str | None:
    """Why ``dims`` are not one run of consecutive dims (no view of a contiguous tensor makes them one)."""
    if list(dims) != list(range(dims[0], dims[0] + len(dims))):
        return f"dims {list(dims)} are not consecutive: no view of the tensor makes them one dim"
    return None


def _reduce_view(op: DimReduce, shape: Shape) -> RegionView | str | None:
    """A reduction in the kernels' own forms (over the channel dim, dropped; over every spatial dim, kept)
    needs none; over another run, the plane view where the run is trailing and plane_reduce takes the mode,
    else the channels view."""
    rank = len(shape)
    mode = kernel_mode(op.mode)
    if mode not in REDUCTIONS:
        return f"the kernels reduce by {', '.join(REDUCTIONS)}; {op.mode} runs in PyTorch"
    if 3 <= rank <= 5 and ((op.dims == (1,) and not op.keepdim)
                           or (op.dims == tuple(range(2, rank)) and op.keepdim and mode in KERNEL_MODES)):
        return None
    why = _run(op.dims)
    if why:
        return why
    after = "keepdim" if op.keepdim else "drop"
    form = "plane" if op.dims[-1] == rank - 1 and mode in KERNEL_MODES else "channels"
    return RegionView(first=op.dims[0], last=op.dims[-1], form=form, after=after)


def _softmax_view(op: Softmax, shape: Shape) -> RegionView | str | None:
    """A softmax over the channels of an (N, C, spatial...) tensor needs none; over any other dim, the
    channels view of that dim."""
    if op.dim == 1 and 3 <= len(shape) <= 5:
        return None
    if op.dim == 0:
        return f"a {op.kind} over the batch dim: every sample's output depends on the others"
    return RegionView(first=op.dim, last=op.dim, form="channels", after="same")


def _layer_norm_view(op: LayerNorm, shape: Shape) -> RegionView | str | None:
    """A layer norm over (C, *spatial) or every spatial dim of an (N, C, spatial...) tensor needs none (group
    or instance norm's statistics: ops/norm.py); over its last k dims alone (fewer trailing dims than every
    spatial one, or the features of a 2-D tensor after a flatten), the plane view of those dims,
    (prod(S[:-k]), 1, prod(S[-k:])): an instance norm over the view's one spatial dim, the per-element weight
    and bias indexed by its position there (the same elements, in the same order, as the module's own of
    shape S[-k:], contiguous)."""
    if 3 <= len(shape) <= 5 and op.scope in ("group", "instance"):
        return None
    over = len(op.normalized_shape)
    return RegionView(first=len(shape) - over, last=len(shape) - 1, form="plane", after="same")


def _centre_view(op: MeanCentre, shape: Shape) -> RegionView | str | None:
    """A mean centring over a scope of the statistics pass (every spatial dim, (C, *spatial), the batch and
    every spatial dim) of an (N, C, spatial...) tensor needs none; over its last k dims alone, the plane view
    of those dims (a centring over the view's spatial dim); over others no view makes it one the kernels take."""
    if 3 <= len(shape) <= 5 and op.scope in ("instance", "group", "batch"):
        return None
    if not op.trailing:
        return (f"a mean centring over dims {list(op.dims)} of {list(shape)}: not its last dims, nor a scope of the "
                "statistics pass (a plane, a sample, a channel over the batch)")
    return RegionView(first=op.dims[0], last=op.dims[-1], form="plane", after="same")


#: op class -> the view a later region that holds it runs on (None: the tensor as it is), or why none helps.
VIEWERS: dict[type, Callable[[Any, Shape], RegionView | str | None]] = {
    DimReduce: _reduce_view,
    Softmax: _softmax_view,
    LayerNorm: _layer_norm_view,
    MeanCentre: _centre_view,
}


def _viewer(op: Op) -> Callable[[Any, Shape], RegionView | str | None] | None:
    return next((f for kind, f in VIEWERS.items() if isinstance(op, kind)), None)


def view_op(op: Op, view: RegionView) -> Op:
    """The op the region's problem runs on the view in place of ``op`` (a map is itself)."""
    if isinstance(op, DimReduce):
        mode = kernel_mode(op.mode)
        # (the op's own class and arguments kept: a var's correction)
        if view.form == "plane":  # every spatial dim, kept: the kernels' spatial reduction (regions.py)
            return dataclasses.replace(op, mode=mode, over="dim", dim=2, dims=(2,), keepdim=True)
        return dataclasses.replace(op, mode=mode, over="dim", dim=1, dims=(1,), keepdim=False)
    if isinstance(op, Softmax):
        return dataclasses.replace(op, dim=1)
    if isinstance(op, (LayerNorm, MeanCentre)):  # over the last k dims: the view's spatial dim
        return op.on_plane()
    return op


def region_view(ops: Sequence[Op], shape: Shape, scalars: frozenset[str] = frozenset()) -> RegionView | str | None:
    """The view a later region of ``ops`` reading a contiguous tensor of ``shape`` runs on: None where it
    runs on the tensor as it is, why not where no view makes it one the kernels may take.

    A run with a view is maps, one op that chose the view, maps (maps that read no per-channel parameter:
    the view's dim 1 is not the chain's channels; a scalar one, of ``scalars``, applies anywhere). An (N, C,
    spatial...) tensor with no op that asks for a view runs as it is; a map alone on another (a 2-D tensor
    after a flatten) on the channels view of dim 1."""
    viewed = [(i, op) for i, op in enumerate(ops) if op.role != "elementwise"]
    if not viewed:
        if 3 <= len(shape) <= 5:
            return None
        view = RegionView(first=1, last=len(shape) - 1, form="channels", after="same") if len(shape) >= 2 else None
    else:
        i, op = viewed[0]
        viewer = _viewer(op)
        if viewer is None:
            return None if 3 <= len(shape) <= 5 else (
                f"its input {list(shape)} is not (N, C, spatial...) with 1 to 3 spatial dims, the tensors the "
                f"kernels take, and no view makes a {op.kind} one they do")
        view = viewer(op, shape)
        if not isinstance(view, RegionView):
            return view
        if len(viewed) > 1:
            return (f"a later region with a view holds one reduction or softmax; {viewed[1][1].kind} after "
                    f"{op.kind} starts another")
    if view is None:
        return f"its input {list(shape)} has no channel dim"
    readers = [op for op in ops if op.role == "elementwise" and set(op.params()) - scalars]
    if readers:
        return (f"{readers[0].kind} reads a per-channel parameter, and the region's view "
                f"{list(view.shape(shape))} has no channel dim of the chain's")
    return view
