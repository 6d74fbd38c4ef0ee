"""Ops that map each value to one value, optionally through a per-channel parameter or the producer's
value at the same element; the activations are in fusetune/ops/activations.py."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, reject_unknown, take_number

#: ``load(name)`` returns the CUDA expression of parameter ``name`` at the current channel.
ParamLoader = Callable[[str], str]


def _float_literal(value: float) -> str:
    return f"{float(value)!r}f".replace("inff", "INFINITY")


@dataclasses.dataclass(frozen=True)
class Elementwise(Op):
    """Shared base: the planner may move these into any kernel stage."""

    role: ClassVar[str] = "elementwise"

    def params(self) -> tuple[str, ...]:
        """Names of learnable parameters the op reads."""
        return ()

    def monotone(self) -> bool:
        """Whether the op is monotone in its value for every channel (either direction, NaN kept
        NaN): a max pool after a chain of such ops is then that chain at a window's largest or
        smallest input (plan.extrema). False unless an op says otherwise."""
        return False

    def increasing(self) -> bool:
        """Whether the op is non-decreasing in its value for every channel, whatever its parameters
        hold: a max pool after a chain of such ops is then that chain at a window's largest input
        alone (plan.pool_increasing). False unless an op says otherwise."""
        return False

    def uses_producer(self) -> bool:
        """Whether the op reads the producer's output at the element as an operand (``by: producer``):
        the generated forward binds it as ``y``, the kernels' chains as ``ft_y``. Such an op is not a
        per-channel map of its value: neither monotone nor affine."""
        return False

    def cuda(self, v: str, load: ParamLoader) -> str:
        raise NotImplementedError


#: The ``by:`` value naming the convolution's own output at the element (bias included), for residual
#: chains such as ``y = conv(x); x = (y + b) * y + y``. Config parameters cannot take this name.
PRODUCER = "producer"
#: Its name in the generated PyTorch forward (bound there before the chain) and in the kernels' chains.
PRODUCER_PY = "y"
PRODUCER_CUDA = "ft_y"
#: An extra input tensor of the model (``inputs:``, read ``by: NAME``) at the element, in the kernels: read at
#: the index the kernel stores the element at (``ft_o``, an argument of the chains ft_post and ft_final), the
#: tensor having the output's shape and memory layout there (fusetune/plan.py places such ops so). Where the input
#: broadcasts (inputs: shape:), the chain derives ft_o from the stored index instead (fusetune/broadcast.py).
INPUT_CUDA = "__ldg(a.extra + ft_o)"


@dataclasses.dataclass(frozen=True)
class _Binary(Elementwise):
    """x (op) operand, where the operand is a Python scalar, a named per-channel parameter, the
    producer's output at the element (``by: producer``) or an extra input tensor of the model at the
    element (``by: NAME`` of ``inputs:``, a residual's identity)."""

    scalar: float | None = None
    param: str | None = None
    producer: bool = False
    input: str | None = None
    symbol: ClassVar[str] = "*"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["by"], ctx)
        if "by" not in raw:
            raise ctx.error("by", "missing; expected a number or the name of a declared parameter")
        by = raw["by"]
        if by == PRODUCER:  # reserved: never a parameter name, so it is looked at first
            return cls(producer=True)
        if isinstance(by, str) and by in ctx.inputs:  # config.py keeps input and parameter names apart
            return cls(input=by)
        if isinstance(by, str):
            if by not in ctx.parameters:
                declared = ", ".join(sorted(ctx.parameters)) or "none declared"
                inputs = ", ".join(ctx.inputs) or "none declared"
                raise ctx.error("by", f"unknown parameter '{by}'; declared parameters: {declared}; declared "
                                      f"inputs (inputs:): {inputs}; or '{PRODUCER}'")
            return cls(param=by)
        value = take_number(raw, "by", ctx)
        if cls.symbol == "/" and value == 0:
            raise ctx.error("by", f"expected a nonzero divisor, got {value!r} (division by zero: every value inf "
                                  "or nan)")
        return cls(scalar=float(value))

    def canonical(self) -> dict[str, Any]:
        # The field came after the cache keys of the first ops: left out where False, they stay as they were.
        out = super().canonical()
        if not self.producer:
            del out["producer"]
        if self.input is None:
            del out["input"]
        return out

    def uses_producer(self) -> bool:
        return self.producer

    def reads_input(self) -> str | None:
        return self.input

    def params(self) -> tuple[str, ...]:
        return (self.param,) if self.param else ()

    def monotone(self) -> bool:
        # By a per-channel constant: monotone, in either direction. Not a division by a learnable
        # parameter, which may be 0 (0 / 0 is NaN inside a window whose ends are +-inf); nothing by the
        # producer's value, which varies inside a window.
        return not self.producer and self.input is None and not (self.symbol == "/" and self.param)

    def increasing(self) -> bool:
        # Adding anything; multiplying or dividing by a positive constant (a parameter may be negative).
        if self.producer or self.input is not None:
            return False
        return self.symbol in ("+", "-") or (self.param is None and self.scalar is not None and self.scalar > 0)

    def _operand_py(self) -> str:
        if self.producer:
            return PRODUCER_PY
        if self.input is not None:
            return self.input  # a forward argument of the generated models, by its config name
        return f"self.{self.param}" if self.param else repr(self.scalar)

    def _operand_cuda(self, load: ParamLoader) -> str:
        if self.producer:
            return PRODUCER_CUDA
        if self.input is not None:
            return INPUT_CUDA
        return load(self.param) if self.param else _float_literal(self.scalar)

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"({x} {self.symbol} {self._operand_py()})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        return f"({v} {self.symbol} {self._operand_cuda(load)})"


@dataclasses.dataclass(frozen=True)
class Mul(_Binary):
    kind: ClassVar[str] = "mul"
    symbol: ClassVar[str] = "*"


@dataclasses.dataclass(frozen=True)
class Div(_Binary):
    kind: ClassVar[str] = "div"
    symbol: ClassVar[str] = "/"


@dataclasses.dataclass(frozen=True)
class Add(_Binary):
    kind: ClassVar[str] = "add"
    symbol: ClassVar[str] = "+"


@dataclasses.dataclass(frozen=True)
class Sub(_Binary):
    kind: ClassVar[str] = "sub"
    symbol: ClassVar[str] = "-"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        """``by: {op: mean, dim: [...], keepdim: true}`` is x - x.mean(dim, keepdim=True): a mean centring, a
        barrier like a norm (fusetune/ops/norm.py's MeanCentre); any other ``by`` is _Binary's."""
        if isinstance(raw.get("by"), Mapping):
            from fusetune.ops.norm import MeanCentre

            return MeanCentre.parse(raw, ctx)
        return super().parse(raw, ctx)


@dataclasses.dataclass(frozen=True)
class _Extremum(_Binary):
    """torch.minimum / torch.maximum against the operand, NaN from either side propagated, as torch
    does; against a number, torch.clamp (the same values, NaN included). Non-decreasing in x whatever
    the operand holds, unless it is the producer's value, which varies inside a window."""

    helper: ClassVar[str] = "ft_min_nan"
    torch_name: ClassVar[str] = "minimum"
    clamp_key: ClassVar[str] = "max"

    def monotone(self) -> bool:
        return not self.producer and self.input is None

    def increasing(self) -> bool:
        return not self.producer and self.input is None

    def forward_code(self, x: str, attr: str | None) -> str:
        if self.scalar is not None:
            return f"torch.clamp({x}, {self.clamp_key}={self.scalar!r})"
        return f"torch.{self.torch_name}({x}, {self._operand_py()})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        return f"{self.helper}({v}, {self._operand_cuda(load)})"


@dataclasses.dataclass(frozen=True)
class Minimum(_Extremum):
    kind: ClassVar[str] = "minimum"
    helper: ClassVar[str] = "ft_min_nan"
    torch_name: ClassVar[str] = "minimum"
    clamp_key: ClassVar[str] = "max"


@dataclasses.dataclass(frozen=True)
class Maximum(_Extremum):
    kind: ClassVar[str] = "maximum"
    helper: ClassVar[str] = "ft_max_nan"
    torch_name: ClassVar[str] = "maximum"
    clamp_key: ClassVar[str] = "min"


@dataclasses.dataclass(frozen=True)
class Prelu(_Binary):
    """F.prelu(x, weight): x where x > 0, else weight * x (as torch computes it, NaN kept NaN); the weight a
    number, or a declared parameter: nn.PReLU(C)'s one per channel, nn.PReLU()'s single value (shape: scalar).
    Not the producer's value nor an extra input: a PReLU's weight is learnt."""

    kind: ClassVar[str] = "prelu"
    symbol: ClassVar[str] = "prelu"  # not an infix operator: forward_code and cuda below

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        op = super().parse(raw, ctx)
        if op.producer or op.input is not None:  # type: ignore[attr-defined]
            raise ctx.error("by", "expected a number or the name of a declared parameter (PReLU's weight), got "
                                  f"{raw['by']!r}")
        return op

    def monotone(self) -> bool:
        # as leaky_relu's slope: a non-negative one is monotone, a negative one falls then rises, a parameter may
        # be either; a slope of 0 gives NaN at -inf (-inf * 0), at the low end: monotone, not increasing
        return self.scalar is not None and self.scalar >= 0

    def increasing(self) -> bool:
        return self.scalar is not None and self.scalar > 0

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.where({x} > 0, {x}, {x} * {self._operand_py()})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        return f"ft_leaky_relu({v}, {self._operand_cuda(load)})"  # the same function, its slope learnt


#: Exponents torch.pow computes without pow (its scalar special cases), and the helper of
#: templates/elementwise.cuh that does the same; 0 and 1 are constants and copies.
_POW_HELPERS: dict[float, str] = {2.0: "ft_pow2", 3.0: "ft_pow3", 4.0: "ft_pow4", -1.0: "ft_pow_m1",
                                  -2.0: "ft_pow_m2", 0.5: "ft_pow_half", -0.5: "ft_pow_mhalf"}


@dataclasses.dataclass(frozen=True)
class Pow(_Binary):
    """torch.pow(x, by). A number exponent: products or a square root where torch uses them, powf
    otherwise (NaN for a negative base and a non-integer exponent, as torch)."""

    kind: ClassVar[str] = "pow"
    symbol: ClassVar[str] = "**"

    def monotone(self) -> bool:
        # x ** odd positive integer: increasing. x ** 0.5 (a square root): increasing where defined, NaN
        # below 0, so at a window's smallest value if anywhere. Not other non-integer exponents:
        # powf(-inf, 1.5) is +inf beside NaN for finite negatives. Not x ** 0 (NaN -> 1), even or negative
        # powers, or a per-channel or per-element exponent.
        return self.scalar is not None and (self._odd_positive() or self.scalar == 0.5)

    def increasing(self) -> bool:
        return self.scalar is not None and self._odd_positive()

    def _odd_positive(self) -> bool:
        return self.scalar is not None and self.scalar > 0 and self.scalar.is_integer() and self.scalar % 2 == 1

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.pow({x}, {self._operand_py()})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        if self.scalar is None:
            return f"powf({v}, {self._operand_cuda(load)})"
        return pow_cuda(v, self.scalar)


@dataclasses.dataclass(frozen=True)
class Clamp(Elementwise):
    kind: ClassVar[str] = "clamp"
    min: float | None = None
    max: float | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["min", "max"], ctx)
        lo = take_number(raw, "min", ctx, default=None)
        hi = take_number(raw, "max", ctx, default=None)
        if lo is None and hi is None:
            raise ctx.error("", "clamp needs at least one of 'min' and 'max'")
        if lo is not None and hi is not None and lo > hi:
            raise ctx.error("min", f"expected min <= max, got min={lo}, max={hi}")
        return cls(min=None if lo is None else float(lo), max=None if hi is None else float(hi))

    def monotone(self) -> bool:
        return True

    def increasing(self) -> bool:
        return True

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.clamp({x}, min={self.min!r}, max={self.max!r})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        # fmaxf/fminf drop NaN; clamp must keep it, as torch.clamp does.
        out = v
        if self.min is not None:
            out = f"ft_max_nan({out}, {_float_literal(self.min)})"
        if self.max is not None:
            out = f"ft_min_nan({out}, {_float_literal(self.max)})"
        return out


@dataclasses.dataclass(frozen=True)
class Relu(Elementwise):
    kind: ClassVar[str] = "relu"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, [], ctx)
        return cls()

    def monotone(self) -> bool:
        return True

    def increasing(self) -> bool:
        return True

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"torch.relu({x})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        return f"ft_max_nan({v}, 0.0f)"


def pow_cuda(v: str, exponent: float) -> str:
    """``v`` to a number's power in CUDA as torch.pow computes it: 1 for 0 (NaN included), ``v`` for 1, a helper
    of templates/elementwise.cuh where one is exact for the exponent (_POW_HELPERS), else powf."""
    if exponent == 0.0:
        return "1.0f"
    if exponent == 1.0:
        return v
    helper = _POW_HELPERS.get(exponent)
    return f"{helper}({v})" if helper else f"powf({v}, {_float_literal(exponent)})"
