"""PyTorch's pointwise activations and math functions as elementwise ops.

Config names and argument names are PyTorch's (``op: leaky_relu, negative_slope: 0.2``). The
parameter-free ops are rows of one table, ``UNARY``: the CUDA expression (a helper of
templates/elementwise.cuh or a libm function), the PyTorch reference and the two facts the planner
reads (monotone, increasing; see Elementwise). The ops with arguments are a class each.

Flags, for the planner's max-pool shortcuts (plan.pool_at_extremes, plan.pool_increasing): an op
whose NaN outputs for non-NaN inputs lie at the low end (log, sqrt: below 0) is monotone (a window's
smallest value then gives NaN wherever any does) but not increasing (its largest value alone would
miss the NaN that torch's max pool propagates).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping, NamedTuple

from fusetune.dtypes import DTYPES
from fusetune.ops.base import Op, OpContext, reject_unknown, take_number
from fusetune.ops.elementwise import Elementwise, ParamLoader, _float_literal


class UnaryFacts(NamedTuple):
    """One parameter-free op: ``cuda`` and ``torch`` are format strings of ``{v}`` / ``{x}``."""

    cuda: str
    torch: str
    monotone: bool
    increasing: bool


#: Op name -> facts. Monotone and increasing hold for the real function and its NaN behaviour:
#: hardswish, silu, mish, abs and square have a minimum inside; neg and erfc decrease; log, log2, log10 and
#: sqrt are NaN below 0, log1p below -1; softsign is NaN at both infinities (inf / inf, as torch computes
#: it), so at a window's extreme if anywhere, yet the low one rules out non-decreasing; reciprocal and rsqrt
#: jump from -inf at -0 to +inf at +0; torch.sign maps NaN to 0, so a window's extreme, NaN, would miss
#: the sign of its other values; floor, ceil, round (half to even, rintf) and trunc step up.
UNARY: dict[str, UnaryFacts] = {
    "relu6": UnaryFacts("ft_relu6({v})", "F.relu6({x})", True, True),
    "selu": UnaryFacts("ft_selu({v})", "F.selu({x})", True, True),
    "silu": UnaryFacts("ft_silu({v})", "F.silu({x})", False, False),
    "mish": UnaryFacts("ft_mish({v})", "F.mish({x})", False, False),
    "sigmoid": UnaryFacts("ft_sigmoid({v})", "torch.sigmoid({x})", True, True),
    "hardsigmoid": UnaryFacts("ft_hardsigmoid({v})", "F.hardsigmoid({x})", True, True),
    "hardswish": UnaryFacts("ft_hardswish({v})", "F.hardswish({x})", False, False),
    "tanh": UnaryFacts("tanhf({v})", "torch.tanh({x})", True, True),
    "exp": UnaryFacts("expf({v})", "torch.exp({x})", True, True),
    "log": UnaryFacts("logf({v})", "torch.log({x})", True, False),
    "abs": UnaryFacts("fabsf({v})", "torch.abs({x})", False, False),
    "neg": UnaryFacts("(-({v}))", "torch.neg({x})", True, False),
    "sqrt": UnaryFacts("sqrtf({v})", "torch.sqrt({x})", True, False),
    "logsigmoid": UnaryFacts("ft_logsigmoid({v})", "F.logsigmoid({x})", True, True),
    "softsign": UnaryFacts("ft_softsign({v})", "F.softsign({x})", True, False),
    # increasing as a real function, but x - tanhf(x) cancels: tanhf's own rounding (an ulp of tanh(x), many of
    # the result below |x| ~ 1) breaks the order in float32 (libm's and torch's alike), which the shortcuts need
    "tanhshrink": UnaryFacts("ft_tanhshrink({v})", "F.tanhshrink({x})", False, False),
    "erf": UnaryFacts("erff({v})", "torch.erf({x})", True, True),
    "erfc": UnaryFacts("erfcf({v})", "torch.erfc({x})", True, False),
    "log1p": UnaryFacts("log1pf({v})", "torch.log1p({x})", True, False),
    "expm1": UnaryFacts("expm1f({v})", "torch.expm1({x})", True, True),
    "log2": UnaryFacts("log2f({v})", "torch.log2({x})", True, False),
    "log10": UnaryFacts("log10f({v})", "torch.log10({x})", True, False),
    "exp2": UnaryFacts("exp2f({v})", "torch.exp2({x})", True, True),
    "sin": UnaryFacts("sinf({v})", "torch.sin({x})", False, False),
    "cos": UnaryFacts("cosf({v})", "torch.cos({x})", False, False),
    "sign": UnaryFacts("ft_sign({v})", "torch.sign({x})", False, False),
    # the helpers of pow's exponents -1, -0.5 and 2 (torch computes those powers so): the same values
    "reciprocal": UnaryFacts("ft_pow_m1({v})", "torch.reciprocal({x})", False, False),
    "rsqrt": UnaryFacts("ft_pow_mhalf({v})", "torch.rsqrt({x})", False, False),
    "square": UnaryFacts("ft_pow2({v})", "torch.square({x})", False, False),
    "floor": UnaryFacts("floorf({v})", "torch.floor({x})", True, True),
    "ceil": UnaryFacts("ceilf({v})", "torch.ceil({x})", True, True),
    "round": UnaryFacts("rintf({v})", "torch.round({x})", True, True),
    "trunc": UnaryFacts("truncf({v})", "torch.trunc({x})", True, True),
}


@dataclasses.dataclass(frozen=True)
class _Unary(Elementwise):
    """A parameter-free op whose facts are its row of UNARY (subclasses only name it)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, [], ctx)
        return cls()

    @property
    def facts(self) -> UnaryFacts:
        return UNARY[self.kind]

    def monotone(self) -> bool:
        return self.facts.monotone

    def increasing(self) -> bool:
        return self.facts.increasing

    def forward_code(self, x: str, attr: str | None) -> str:
        return self.facts.torch.format(x=x)

    def cuda(self, v: str, load: ParamLoader) -> str:
        return self.facts.cuda.format(v=v)


@dataclasses.dataclass(frozen=True)
class Relu6(_Unary):
    kind: ClassVar[str] = "relu6"


@dataclasses.dataclass(frozen=True)
class Selu(_Unary):
    kind: ClassVar[str] = "selu"


@dataclasses.dataclass(frozen=True)
class Silu(_Unary):
    kind: ClassVar[str] = "silu"


@dataclasses.dataclass(frozen=True)
class Mish(_Unary):
    kind: ClassVar[str] = "mish"


@dataclasses.dataclass(frozen=True)
class Sigmoid(_Unary):
    kind: ClassVar[str] = "sigmoid"


@dataclasses.dataclass(frozen=True)
class Hardsigmoid(_Unary):
    kind: ClassVar[str] = "hardsigmoid"


@dataclasses.dataclass(frozen=True)
class Hardswish(_Unary):
    kind: ClassVar[str] = "hardswish"


@dataclasses.dataclass(frozen=True)
class Tanh(_Unary):
    kind: ClassVar[str] = "tanh"


@dataclasses.dataclass(frozen=True)
class Exp(_Unary):
    kind: ClassVar[str] = "exp"


@dataclasses.dataclass(frozen=True)
class Log(_Unary):
    kind: ClassVar[str] = "log"


@dataclasses.dataclass(frozen=True)
class Abs(_Unary):
    kind: ClassVar[str] = "abs"


@dataclasses.dataclass(frozen=True)
class Neg(_Unary):
    kind: ClassVar[str] = "neg"


@dataclasses.dataclass(frozen=True)
class Sqrt(_Unary):
    kind: ClassVar[str] = "sqrt"


@dataclasses.dataclass(frozen=True)
class Logsigmoid(_Unary):
    kind: ClassVar[str] = "logsigmoid"


@dataclasses.dataclass(frozen=True)
class Softsign(_Unary):
    kind: ClassVar[str] = "softsign"


@dataclasses.dataclass(frozen=True)
class Tanhshrink(_Unary):
    kind: ClassVar[str] = "tanhshrink"


@dataclasses.dataclass(frozen=True)
class Erf(_Unary):
    kind: ClassVar[str] = "erf"


@dataclasses.dataclass(frozen=True)
class Erfc(_Unary):
    kind: ClassVar[str] = "erfc"


@dataclasses.dataclass(frozen=True)
class Log1p(_Unary):
    kind: ClassVar[str] = "log1p"


@dataclasses.dataclass(frozen=True)
class Expm1(_Unary):
    kind: ClassVar[str] = "expm1"


@dataclasses.dataclass(frozen=True)
class Log2(_Unary):
    kind: ClassVar[str] = "log2"


@dataclasses.dataclass(frozen=True)
class Log10(_Unary):
    kind: ClassVar[str] = "log10"


@dataclasses.dataclass(frozen=True)
class Exp2(_Unary):
    kind: ClassVar[str] = "exp2"


@dataclasses.dataclass(frozen=True)
class Sin(_Unary):
    kind: ClassVar[str] = "sin"


@dataclasses.dataclass(frozen=True)
class Cos(_Unary):
    kind: ClassVar[str] = "cos"


@dataclasses.dataclass(frozen=True)
class Sign(_Unary):
    kind: ClassVar[str] = "sign"


@dataclasses.dataclass(frozen=True)
class Reciprocal(_Unary):
    kind: ClassVar[str] = "reciprocal"


@dataclasses.dataclass(frozen=True)
class Rsqrt(_Unary):
    kind: ClassVar[str] = "rsqrt"


@dataclasses.dataclass(frozen=True)
class Square(_Unary):
    kind: ClassVar[str] = "square"


@dataclasses.dataclass(frozen=True)
class Floor(_Unary):
    kind: ClassVar[str] = "floor"


@dataclasses.dataclass(frozen=True)
class Ceil(_Unary):
    kind: ClassVar[str] = "ceil"


@dataclasses.dataclass(frozen=True)
class Round(_Unary):
    kind: ClassVar[str] = "round"


@dataclasses.dataclass(frozen=True)
class Trunc(_Unary):
    kind: ClassVar[str] = "trunc"


@dataclasses.dataclass(frozen=True)
class _NumericArguments(Elementwise):
    """An op of numeric arguments, its dataclass fields in PyTorch's order and by PyTorch's names: PyTorch
    calls it as ``F.<kind>(x, name=value, ...)``, the kernels as ``ft_<kind>(v, value, ...)`` (a helper of
    templates/elementwise.cuh taking the values as float literals)."""

    def forward_code(self, x: str, attr: str | None) -> str:
        named = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"F.{self.kind}({x}, {named})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        values = ", ".join(_float_literal(getattr(self, f.name)) for f in dataclasses.fields(self))
        return f"ft_{self.kind}({v}, {values})"


@dataclasses.dataclass(frozen=True)
class LeakyRelu(_NumericArguments):
    """F.leaky_relu: x where x > 0, else negative_slope * x. Non-decreasing for a slope > 0; a
    negative slope makes a V, monotone in neither direction. A slope of 0 is monotone but gives NaN
    at -inf (-inf * 0), at the low end, where a window's largest value alone would miss it."""

    kind: ClassVar[str] = "leaky_relu"
    negative_slope: float = 0.01

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["negative_slope"], ctx)
        return cls(negative_slope=float(take_number(raw, "negative_slope", ctx, default=0.01)))

    def monotone(self) -> bool:
        return self.negative_slope >= 0

    def increasing(self) -> bool:
        return self.negative_slope > 0


@dataclasses.dataclass(frozen=True)
class Elu(_NumericArguments):
    """F.elu: x where x > 0, else alpha * (exp(x) - 1). Non-decreasing for alpha >= 0; a negative
    alpha falls from -alpha at -inf to 0, then rises."""

    kind: ClassVar[str] = "elu"
    alpha: float = 1.0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["alpha"], ctx)
        return cls(alpha=float(take_number(raw, "alpha", ctx, default=1.0)))

    def monotone(self) -> bool:
        return self.alpha >= 0

    def increasing(self) -> bool:
        return self.alpha >= 0


@dataclasses.dataclass(frozen=True)
class Celu(_NumericArguments):
    """F.celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)). Its slope below 0 is exp(x / alpha)
    > 0 for either sign of alpha: non-decreasing always. alpha = 0 is refused, as torch refuses it."""

    kind: ClassVar[str] = "celu"
    alpha: float = 1.0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["alpha"], ctx)
        alpha = float(take_number(raw, "alpha", ctx, default=1.0))
        if alpha == 0:
            raise ctx.error("alpha", f"expected a nonzero alpha, got {alpha!r}: alpha cannot be 0 for celu (it "
                                     "divides by alpha)")
        return cls(alpha=alpha)

    def monotone(self) -> bool:
        return True

    def increasing(self) -> bool:
        return True


#: F.gelu's approximations and their helpers in templates/elementwise.cuh.
GELU_APPROXIMATIONS: dict[str, str] = {"none": "ft_gelu", "tanh": "ft_gelu_tanh"}


@dataclasses.dataclass(frozen=True)
class Gelu(Elementwise):
    """F.gelu, exact (approximate: none) or with tanh. It dips below 0 for negative x: not monotone."""

    kind: ClassVar[str] = "gelu"
    approximate: str = "none"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["approximate"], ctx)
        approximate = raw.get("approximate", "none")
        if not isinstance(approximate, str) or approximate not in GELU_APPROXIMATIONS:
            expected = " or ".join(f"'{name}'" for name in GELU_APPROXIMATIONS)
            raise ctx.error("approximate", f"expected {expected}, got {approximate!r}")
        return cls(approximate=approximate)

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"F.gelu({x}, approximate={self.approximate!r})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        return f"{GELU_APPROXIMATIONS[self.approximate]}({v})"


#: F.softplus's default threshold. Where beta * x passes the threshold, softplus returns x, a step
#: down by log1p(exp(-threshold)) / |beta| from the curve just before it: non-decreasing in float32
#: only where that step is below half a float32 ulp of the point (threshold / beta); see
#: Softplus.increasing.
SOFTPLUS_THRESHOLD = 20.0


@dataclasses.dataclass(frozen=True)
class Softplus(_NumericArguments):
    """F.softplus: x where beta * x > threshold, else log(1 + exp(beta * x)) / beta. Both pieces
    rise (slope sigmoid(beta * x) > 0, for either sign of beta); the switch between them steps down."""

    kind: ClassVar[str] = "softplus"
    beta: float = 1.0
    threshold: float = SOFTPLUS_THRESHOLD

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["beta", "threshold"], ctx)
        beta = float(take_number(raw, "beta", ctx, default=1.0))
        if beta == 0:
            raise ctx.error("beta", f"expected a nonzero beta, got {beta!r}: beta cannot be 0 (softplus divides "
                                    "by beta)")
        threshold = float(take_number(raw, "threshold", ctx, default=SOFTPLUS_THRESHOLD))
        return cls(beta=beta, threshold=threshold)

    def monotone(self) -> bool:
        return self.increasing()

    def increasing(self) -> bool:
        # The step at the switch, relative to the point where it happens: log1p(exp(-t)) / t, which
        # must stay under 2^-25 (half the least relative float32 ulp) to vanish in rounding; true from
        # t ~ 15.5 on, so for the default 20.
        t = self.threshold
        return t > 0 and math.log1p(math.exp(-t)) < 2.0 ** -25 * t


@dataclasses.dataclass(frozen=True)
class Hardtanh(_NumericArguments):
    """F.hardtanh: x clamped to [min_val, max_val], NaN kept. Non-decreasing."""

    kind: ClassVar[str] = "hardtanh"
    min_val: float = -1.0
    max_val: float = 1.0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["min_val", "max_val"], ctx)
        lo = float(take_number(raw, "min_val", ctx, default=-1.0))
        hi = float(take_number(raw, "max_val", ctx, default=1.0))
        if lo > hi:
            raise ctx.error("min_val", f"expected min_val <= max_val, got min_val={lo}, max_val={hi}")
        return cls(min_val=lo, max_val=hi)

    def monotone(self) -> bool:
        return True

    def increasing(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class Hardshrink(_NumericArguments):
    """F.hardshrink: 0 where -lambd <= x <= lambd, else x (NaN fails the test and stays NaN). Non-decreasing:
    it jumps up at +-lambd, from below -lambd to 0 and from 0 to above lambd; a negative lambd, which torch
    takes, zeroes nothing."""

    kind: ClassVar[str] = "hardshrink"
    lambd: float = 0.5

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["lambd"], ctx)
        return cls(lambd=float(take_number(raw, "lambd", ctx, default=0.5)))

    def monotone(self) -> bool:
        return True

    def increasing(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class Softshrink(_NumericArguments):
    """F.softshrink: x - lambd above lambd, x + lambd below -lambd, 0 between: continuous and
    non-decreasing. A negative lambd is refused, as torch refuses it."""

    kind: ClassVar[str] = "softshrink"
    lambd: float = 0.5

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["lambd"], ctx)
        lambd = float(take_number(raw, "lambd", ctx, default=0.5))
        if lambd < 0:
            raise ctx.error("lambd", f"expected a lambd >= 0, got {lambd!r} (torch refuses a negative one)")
        return cls(lambd=lambd)

    def monotone(self) -> bool:
        return True

    def increasing(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class Threshold(_NumericArguments):
    """F.threshold: x where x > threshold, else value (NaN stays NaN); both arguments required, as in torch.
    Non-decreasing where value <= threshold (value = threshold is a clamp); a larger value steps down at the
    threshold and rises after: monotone in neither direction."""

    kind: ClassVar[str] = "threshold"
    threshold: float = 0.0
    value: float = 0.0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["threshold", "value"], ctx)
        return cls(threshold=float(take_number(raw, "threshold", ctx)), value=float(take_number(raw, "value", ctx)))

    def monotone(self) -> bool:
        return self.value <= self.threshold

    def increasing(self) -> bool:
        return self.value <= self.threshold


@dataclasses.dataclass(frozen=True)
class NanToNum(Elementwise):
    """torch.nan_to_num(x, nan, posinf, neginf): NaN to ``nan``, +inf to ``posinf``, -inf to ``neginf``, any
    other value as it is. PyTorch's defaults are 0 and the largest and lowest finite values of the input's
    dtype, resolved here at the op's dtype (OpContext.dtype), so that the float64 reference and the kernels
    (which compute in float and store the dtype) replace an infinity by what eager PyTorch gives at the config's
    dtype. A value past the dtype's finite range is refused: PyTorch would store an infinity in its place.
    Neither monotone nor increasing: it maps NaN to a number, so a window's extreme, NaN, would miss the
    window's other values (as torch.sign)."""

    kind: ClassVar[str] = "nan_to_num"
    nan: float  # no defaults here: PyTorch's depend on the dtype (defaults)
    posinf: float
    neginf: float

    @staticmethod
    def defaults(dtype: str) -> dict[str, float]:
        """PyTorch's values for a key left out (or None) at ``dtype``: 0, and the dtype's finite extremes."""
        largest = DTYPES[dtype].largest
        return {"nan": 0.0, "posinf": largest, "neginf": -largest}

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["nan", "posinf", "neginf"], ctx)
        largest = DTYPES[ctx.dtype].largest
        values = {}
        for key, default in cls.defaults(ctx.dtype).items():
            value = raw.get(key)
            value = default if value is None else float(take_number(raw, key, ctx))  # null: PyTorch's None
            if abs(value) > largest:
                raise ctx.error(key, f"expected a value within {ctx.dtype}'s finite range [{-largest!r}, "
                                     f"{largest!r}], got {value!r}: PyTorch would store an infinity there")
            values[key] = value
        return cls(**values)

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.nan_to_num({x}, nan={self.nan!r}, posinf={self.posinf!r}, neginf={self.neginf!r})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        return (f"ft_nan_to_num({v}, {_float_literal(self.nan)}, {_float_literal(self.posinf)}, "
                f"{_float_literal(self.neginf)})")
