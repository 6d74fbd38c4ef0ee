"""Reductions, channel-wise softmax and views: ops that drop, keep or reshape dimensions.

A reduction is ``torch.<mode>(x, dim, keepdim)`` over any dims but the batch. The kernels reduce
over all spatial dims (``over == "spatial"``: the dims kept with size 1, as adaptive pooling to 1
leaves them) or over the channel dim (``over == "dim"``, dim 1, dropped); the planner's rewrites
(fusetune/regions.py) bring a reduction into one of those forms where that is exact, and a view
after it (dropping or keeping the dims) runs in PyTorch for free.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

from fusetune.dtypes import DTYPES, alias_of
from fusetune.errors import did_you_mean, suggestion
from fusetune.ops.base import Op, OpContext, Shape, is_int, reject_unknown, take_bool, take_int
from fusetune.ops.reductions import REDUCTIONS, SPREAD_CORRECTION, KernelReduction

#: Reduction modes torch names; amax/amin are max/min without indices, which the values equal.
REDUCE_MODES = ("max", "min", "sum", "mean", "amax", "amin", "logsumexp")
#: The reductions that measure a spread around the mean, with torch's ``correction`` (``Spread``): the kernels
#: reduce them over the channels, by sums around a pivot (fusetune/ops/reductions.py, templates/variance.cuh).
SPREAD_MODES = ("var", "std")
#: The modes every kernel that reduces computes (over space or over channels); most that reduce over
#: the channels take logsumexp too (fusetune/worlds/facts.py's STAGE_REDUCE_MODES). How each mode is
#: computed is fusetune/ops/reductions.py's table.
KERNEL_MODES = ("max", "min", "sum", "mean")
#: amax and amin hold max's and min's values (without their indices): the kernels reduce them as those modes.
SAME_MODE = {"amax": "max", "amin": "min"}


def kernel_mode(mode: str) -> str:
    """The mode the kernels reduce a reduction of ``mode`` by (SAME_MODE; the others are their own)."""
    return SAME_MODE.get(mode, mode)


@dataclasses.dataclass(frozen=True)
class Reduce(Op):
    """``over`` is "spatial" (all spatial dims, keeping size-1 dims) or "dim" (one dim, dropped)."""

    role: ClassVar[str] = "reduce"
    mode: str = "mean"  # max | min | sum | mean | logsumexp (the last over channels only)
    over: str = "dim"
    dim: int = 1

    @property
    def kernel(self) -> KernelReduction:
        """How the kernels compute this mode (its accumulator, step, merge and end), for the modes they take,
        with the op's values of the mode's arguments."""
        return REDUCTIONS[self.mode].bind(**self.kernel_arguments())

    def kernel_arguments(self) -> dict[str, float]:
        """The op's values of its mode's arguments (KernelReduction.arguments): none but a spread's correction."""
        return {}


@dataclasses.dataclass(frozen=True)
class SpatialReduce(Reduce):
    """A reduction over every spatial dim that keeps them with size 1: ``adaptive_avg_pool`` and
    ``adaptive_max_pool`` to 1, and what the planner rewrites ``mean(dim=[2, 3])`` and the like to."""

    kind: ClassVar[str] = "spatial_reduce"
    over: str = "spatial"
    dim: int = -1

    def out_shape(self, shape: Shape) -> Shape:
        return shape[:2] + (1,) * (len(shape) - 2)

    def forward_code(self, x: str, attr: str | None) -> str:
        dims = f"tuple(range(2, {x}.dim()))"
        if self.mode in ("max", "min"):
            return f"torch.a{self.mode}({x}, dim={dims}, keepdim=True)"
        return f"torch.{self.mode}({x}, dim={dims}, keepdim=True)"

    def canonical(self) -> dict[str, Any]:
        # A mean over space is the adaptive average pool the cache has always keyed it as.
        if self.mode == "mean":
            return {"kind": "adaptive_avg_pool", "mode": "mean", "over": "spatial", "dim": -1}
        return {"kind": f"spatial_{self.mode}"}


@dataclasses.dataclass(frozen=True)
class AdaptivePool(Op):
    """``adaptive_avg_pool`` / ``adaptive_max_pool``: output_size 1 is a spatial reduction the kernels
    take (regions.kernel_reductions); any other size is the region's pool, whose window per output index
    the cuDNN world's main kernels compute at any input shape (ops/pool.py's ADAPTIVE_BOUNDS, pool.j2)."""

    role: ClassVar[str] = "adaptive"
    mode: ClassVar[str]
    output_size: tuple[int, ...] = (1,)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["output_size"], ctx)
        size = raw.get("output_size", 1)
        dims = len(ctx.in_shape) - 2
        if is_int(size):
            sizes = (size,) * dims
        elif isinstance(size, list) and len(size) == dims and all(
                is_int(s) for s in size):
            sizes = tuple(size)
        else:
            raise ctx.error("output_size", f"expected a positive integer or a list of {dims}, got {size!r}")
        if any(s < 1 for s in sizes):
            raise ctx.error("output_size", f"expected positive sizes, got {size!r}")
        return cls(output_size=sizes)

    @property
    def global_(self) -> bool:
        return all(s == 1 for s in self.output_size)

    def out_shape(self, shape: Shape) -> Shape:
        return shape[:2] + self.output_size

    def forward_code(self, x: str, attr: str | None) -> str:
        dims = len(self.output_size)
        return f"F.adaptive_{self.mode}_pool{dims}d({x}, {self.output_size})"

    def as_reduce(self) -> SpatialReduce:
        return SpatialReduce(mode="mean" if self.mode == "avg" else "max")

    def canonical(self) -> dict[str, Any]:
        if self.global_ and self.mode == "avg":
            return self.as_reduce().canonical()  # as it has always been keyed
        return {"kind": self.kind, "output_size": list(self.output_size)}


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool(AdaptivePool):
    kind: ClassVar[str] = "adaptive_avg_pool"
    mode: ClassVar[str] = "avg"


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool(AdaptivePool):
    kind: ClassVar[str] = "adaptive_max_pool"
    mode: ClassVar[str] = "max"


def take_dims(raw: Mapping[str, Any], key: str, ctx: OpContext, *, default: Any) -> tuple[int, ...]:
    """An int or a non-empty list of distinct ints, each a dim of the input (negatives from the end),
    normalised to sorted non-negative dims; the batch dim (0) is refused."""
    rank = len(ctx.in_shape)
    value = raw.get(key, default)
    values = [value] if is_int(value) else value
    if (not isinstance(values, list) or not values
            or any(isinstance(v, bool) or not isinstance(v, int) for v in values)):
        raise ctx.error(key, f"expected a dim or a list of dims of the rank-{rank} input, got {value!r}")
    dims = []
    for v in values:
        if not -rank <= v < rank:
            raise ctx.error(key, f"expected dims in [{-rank}, {rank - 1}] for an input of rank {rank}, got {v}")
        dims.append(v % rank)
    if len(set(dims)) != len(dims):
        raise ctx.error(key, f"expected distinct dims, got {value!r}: a dim is named twice")
    if 0 in dims:
        raise ctx.error(key, f"reducing over the batch dim (0) is not supported: a sample's output would "
                             f"depend on the other samples (expected dims in [1, {rank - 1}], or their negative "
                             f"forms), got {value!r}")
    return tuple(sorted(dims))


@dataclasses.dataclass(frozen=True)
class DimReduce(Reduce):
    """torch.<mode>(x, dim, keepdim): values only (torch.max/min's indices are not kept).

    ``dims`` are the input's dims, sorted; ``dim`` (the first) keeps the single-dim form the kernels
    and the cache key have always used."""

    kind: ClassVar[str] = "reduce"
    dims: tuple[int, ...] = (1,)
    keepdim: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim", "keepdim"], ctx)
        dims = take_dims(raw, "dim", ctx, default=1)
        keepdim = take_bool(raw, "keepdim", ctx, default=False)
        return cls(mode=str(raw["op"]), over="dim", dim=dims[0], dims=dims, keepdim=keepdim)

    @property
    def config_name(self) -> str:
        """Every mode is an op of its own in a config (``amax``, ``sum``): the mode is the name."""
        return self.mode

    def out_shape(self, shape: Shape) -> Shape:
        if self.keepdim:
            return tuple(1 if i in self.dims else s for i, s in enumerate(shape))
        return tuple(s for i, s in enumerate(shape) if i not in self.dims)

    def forward_code(self, x: str, attr: str | None) -> str:
        dim = self.dims[0] if len(self.dims) == 1 else self.dims
        keep = ", keepdim=True" if self.keepdim else ""
        if self.mode in ("max", "min") and len(self.dims) == 1:
            return f"torch.{self.mode}({x}, dim={dim}{keep})[0]"
        mode = {"max": "amax", "min": "amin"}.get(self.mode, self.mode)
        return f"torch.{mode}({x}, dim={dim}{keep})"

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.mode, "dim": self.dim}
        if len(self.dims) > 1:
            out["dims"] = list(self.dims)
        if self.keepdim:
            out["keepdim"] = True
        return out


@dataclasses.dataclass(frozen=True)
class Spread(DimReduce):
    """torch.var / torch.std(x, dim, correction, keepdim): the sum of squared deviations from the mean over
    ``dims``, divided by max(0, n - correction) (std: its square root). ``unbiased`` is the older spelling
    (true: correction 1, false: 0). ``dim`` is required: torch's default reduces the batch dim too.

    Not a fold of folds: a var of vars is no var, so the rules neither merge two in a row nor split one over the
    channels and space (regions.py); the kernels take one over the channels (or, in a later region, over a run
    of consecutive dims as the channels of a view), by sums of deviations from a pivot (templates/variance.cuh)."""

    correction: int = SPREAD_CORRECTION

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim", "keepdim", "correction", "unbiased"], ctx)
        if "dim" not in raw:
            raise ctx.error("dim", f"missing; expected the dim or dims to reduce (torch.{raw['op']} without dim "
                                   "reduces every dim, the batch's too: a sample's output would depend on the others)")
        dims = take_dims(raw, "dim", ctx, default=None)
        keepdim = take_bool(raw, "keepdim", ctx, default=False)
        if "correction" in raw and "unbiased" in raw:
            raise ctx.error("unbiased", "give correction or unbiased, not both (unbiased is the older spelling of "
                                        "correction 1 or 0), as PyTorch refuses both")
        if "unbiased" in raw:
            correction = 1 if take_bool(raw, "unbiased", ctx, default=True) else 0
        else:
            correction = take_int(raw, "correction", ctx, default=SPREAD_CORRECTION, minimum=0)
        return cls(mode=str(raw["op"]), over="dim", dim=dims[0], dims=dims, keepdim=keepdim, correction=correction)

    def kernel_arguments(self) -> dict[str, float]:
        return {"correction": float(self.correction)}

    def forward_code(self, x: str, attr: str | None) -> str:
        dim = self.dims[0] if len(self.dims) == 1 else self.dims
        keep = ", keepdim=True" if self.keepdim else ""
        return f"torch.{self.mode}({x}, dim={dim}, correction={self.correction}{keep})"

    def canonical(self) -> dict[str, Any]:
        return {**super().canonical(), "correction": self.correction}


@dataclasses.dataclass(frozen=True)
class Softmax(Op):
    """softmax / log_softmax over one dim: every value of a row is needed before any is written.

    ``dtype`` is PyTorch's (``torch.softmax(x, dim, dtype=torch.float32)``: the input cast to it, the op computed
    and returned in it), kept as written, so that the reference runs the model's own forward (a float64 run of it
    too: rounded to the dtype there, as the user's model is, then back: forward_code). The input's own dtype is no cast for the kernels; a wider
    one (``widens``: float32 on a float16 chain) the planner runs, and everything after it, in PyTorch (the kernels
    store the config's dtype); a narrower one (or the other half type) is refused: it would round the values
    before the op, and the config would not say what it meant."""

    role: ClassVar[str] = "softmax"
    log: ClassVar[bool]
    dim: int = 1
    dtype: str | None = None
    widens: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim", "dtype"], ctx)
        if "dim" not in raw:
            raise ctx.error("dim", "missing; expected the dim to normalise over (1 for channels), as PyTorch asks")
        rank = len(ctx.in_shape)
        dim = take_int(raw, "dim", ctx)
        if not -rank <= dim < rank:
            raise ctx.error("dim", f"expected a dim in [{-rank}, {rank - 1}] for an input of rank {rank}, got {dim}")
        dtype = _softmax_dtype(raw, ctx)
        return cls(dim=dim % rank, dtype=dtype, widens=dtype is not None and dtype != ctx.dtype)

    def out_dtype(self, dtype: str) -> str:
        return self.dtype if self.widens and self.dtype else dtype

    def forward_code(self, x: str, attr: str | None) -> str:
        """PyTorch's call as written; where its dtype is the chain's own (no cast at the chain's dtype), the values
        go back to the input's dtype after it, so that a float64 run (verification's reference) rounds them as the
        model does and the ops after it, a norm's float64 tensors among them, see one dtype."""
        cast = f", dtype=torch.{self.dtype}" if self.dtype else ""
        back = f".to({x}.dtype)" if self.dtype and not self.widens else ""
        return f"torch.{'log_softmax' if self.log else 'softmax'}({x}, dim={self.dim}{cast}){back}"

    def canonical(self) -> dict[str, Any]:
        out = super().canonical()
        if self.dtype is None:  # left out where none: the keys of every softmax without it stay as they were
            del out["dtype"], out["widens"]
        return out


def _softmax_dtype(raw: Mapping[str, Any], ctx: OpContext) -> str | None:
    """A softmax's ``dtype`` as written: None where it names none; the input's own or a wider one; a narrower one
    (or the other half type) refused, naming the key."""
    if raw.get("dtype") is None:
        return None
    value = raw["dtype"]
    if value not in DTYPES:
        alias = alias_of(value) if isinstance(value, str) else None
        hint = suggestion(alias) if alias else did_you_mean(value, DTYPES) if isinstance(value, str) else ""
        raise ctx.error("dtype", f"expected one of {', '.join(DTYPES)}, got {value!r}{hint}")
    if value != ctx.dtype and DTYPES[value].bytes <= DTYPES[ctx.dtype].bytes:
        wider = [name for name, d in DTYPES.items() if d.bytes > DTYPES[ctx.dtype].bytes]
        raise ctx.error("dtype", f"dtype {value} does not widen the op's {ctx.dtype} input: PyTorch would round the "
                                 f"values to {value} before the op; expected {ctx.dtype} (the input's own: no "
                                 f"cast){''.join(f' or {name}' for name in wider)}")
    return value


@dataclasses.dataclass(frozen=True)
class SoftmaxOp(Softmax):
    kind: ClassVar[str] = "softmax"
    log: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class LogSoftmax(Softmax):
    kind: ClassVar[str] = "log_softmax"
    log: ClassVar[bool] = True


@dataclasses.dataclass(frozen=True)
class View(Op):
    """Ops that only reshape: free in PyTorch (a view of the kernels' output)."""

    role: ClassVar[str] = "view"


@dataclasses.dataclass(frozen=True)
class Flatten(View):
    kind: ClassVar[str] = "flatten"
    start_dim: int = 1
    end_dim: int = -1

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["start_dim", "end_dim"], ctx)
        rank = len(ctx.in_shape)
        start = take_int(raw, "start_dim", ctx, default=1)
        end = take_int(raw, "end_dim", ctx, default=-1)
        for key, d in (("start_dim", start), ("end_dim", end)):
            if not -rank <= d < rank:
                raise ctx.error(key, f"expected a dim in [{-rank}, {rank - 1}] for an input of rank {rank}, got {d}")
        if start % rank > end % rank:
            raise ctx.error("start_dim", f"start_dim {start} comes after end_dim {end}")
        return cls(start_dim=start % rank, end_dim=end % rank)

    def out_shape(self, shape: Shape) -> Shape:
        start, end = self.start_dim % len(shape), self.end_dim % len(shape)
        merged = 1
        for s in shape[start:end + 1]:
            merged *= s
        return shape[:start] + (merged,) + shape[end + 1:]

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.flatten({x}, {self.start_dim}, {self.end_dim})"


@dataclasses.dataclass(frozen=True)
class Unflatten(View):
    """torch.unflatten(x, dim, sizes): one dim split into several, the inverse of a flatten (a softmax over
    the spatial dims written as x.view(n, c, -1), softmax over dim 2, then x.view(n, c, d, h, w)). One size
    may be -1: the rest of the dim. The batch dim stays as it is."""

    kind: ClassVar[str] = "unflatten"
    dim: int = 1
    sizes: tuple[int, ...] = (1,)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim", "sizes"], ctx)
        for key in ("dim", "sizes"):
            if key not in raw:
                raise ctx.error(key, "missing; expected the dim to split and the sizes it splits into, as "
                                     "torch.unflatten(x, dim, sizes) takes them")
        rank = len(ctx.in_shape)
        dim = take_int(raw, "dim", ctx)
        if not -rank <= dim < rank:
            raise ctx.error("dim", f"expected a dim in [{-rank}, {rank - 1}] for an input of rank {rank}, got {dim}")
        if dim % rank == 0:
            raise ctx.error("dim", "splitting the batch dim would change what a batch is; expected a later dim")
        sizes = raw["sizes"]
        if (not isinstance(sizes, (list, tuple)) or not sizes
                or any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1) for v in sizes)
                or list(sizes).count(-1) > 1):
            raise ctx.error("sizes", f"expected a non-empty list of positive sizes (one may be -1), got {sizes!r}")
        return cls(dim=dim % rank, sizes=tuple(int(v) for v in sizes))

    def _resolved(self, shape: Shape) -> tuple[int, ...] | None:
        known = math.prod(v for v in self.sizes if v != -1)
        if -1 in self.sizes:
            if shape[self.dim] % known:
                return None
            return tuple(shape[self.dim] // known if v == -1 else v for v in self.sizes)
        return self.sizes if known == shape[self.dim] else None

    def check_shape(self, shape: Shape, error) -> None:
        if self._resolved(shape) is None:
            error("sizes", f"sizes {list(self.sizes)} do not split dim {self.dim} of size {shape[self.dim]} "
                           f"(input {list(shape)})")

    def out_shape(self, shape: Shape) -> Shape:
        sizes = self._resolved(shape) or self.sizes
        return tuple(shape[:self.dim]) + tuple(sizes) + tuple(shape[self.dim + 1:])

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.unflatten({x}, {self.dim}, {tuple(self.sizes)})"


@dataclasses.dataclass(frozen=True)
class Squeeze(View):
    """torch.squeeze(x, dim): drop the given dims where their size is 1 (all size-1 dims without one)."""

    kind: ClassVar[str] = "squeeze"
    dims: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim"], ctx)
        if "dim" not in raw:
            return cls(dims=None)
        rank = len(ctx.in_shape)
        value = raw["dim"]
        values = [value] if is_int(value) else value
        if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise ctx.error("dim", f"expected a dim or a list of dims, got {value!r}")
        for v in values:
            if not -rank <= v < rank:
                raise ctx.error("dim", f"expected dims in [{-rank}, {rank - 1}] for an input of rank {rank}, got {v}")
        return cls(dims=tuple(sorted({v % rank for v in values})))

    def check_shape(self, shape: Shape, error) -> None:
        if self.dims and 0 in self.dims and shape[0] == 1:
            error("dim", "squeezing the batch dim would change the output's rank with the batch size")
        if self.dims is None and shape[0] == 1:
            error("dim", "a squeeze of every size-1 dim would drop the batch dim at batch 1; name the dims")

    def out_shape(self, shape: Shape) -> Shape:
        dims = self.dims if self.dims is not None else tuple(range(len(shape)))
        return tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))

    def forward_code(self, x: str, attr: str | None) -> str:
        if self.dims is None:
            return f"torch.squeeze({x})"
        return f"torch.squeeze({x}, {self.dims[0] if len(self.dims) == 1 else self.dims})"


@dataclasses.dataclass(frozen=True)
class Unsqueeze(View):
    """torch.unsqueeze(x, dim): what a reduction's keepdim leaves where the kernels dropped the dim."""

    kind: ClassVar[str] = "unsqueeze"
    dim: int = 1

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim"], ctx)
        rank = len(ctx.in_shape) + 1
        dim = take_int(raw, "dim", ctx)
        if not -rank <= dim < rank:
            raise ctx.error("dim", f"expected a dim in [{-rank}, {rank - 1}], got {dim}")
        return cls(dim=dim % rank)

    def out_shape(self, shape: Shape) -> Shape:
        return shape[:self.dim] + (1,) + shape[self.dim:]

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.unsqueeze({x}, {self.dim})"
