"""Ops that map each value to one value, optionally through a per-channel parameter."""
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

    def cuda(self, v: str, load: ParamLoader) -> str:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _Binary(Elementwise):
    """x (op) operand, where the operand is a Python scalar or a named per-channel parameter."""

    scalar: float | None = None
    param: str | None = None
    symbol: ClassVar[str] = "*"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["by"], ctx)
        if "by" not in raw:
            raise ctx.error("by", "missing; expected a number or the name of a declared parameter")
        by = raw["by"]
        if isinstance(by, str):
            if by not in ctx.parameters:
                declared = ", ".join(sorted(ctx.parameters)) or "none declared"
                raise ctx.error("by", f"unknown parameter '{by}'; declared parameters: {declared}")
            return cls(param=by)
        value = take_number(raw, "by", ctx)
        if cls.symbol == "/" and value == 0:
            raise ctx.error("by", "division by zero")
        return cls(scalar=float(value))

    def params(self) -> tuple[str, ...]:
        return (self.param,) if self.param else ()

    def monotone(self) -> bool:
        # By a per-channel constant: monotone, in either direction. Not a division by a learnable
        # parameter, which may be 0 (0 / 0 is NaN inside a window whose ends are +-inf).
        return not (self.symbol == "/" and self.param)

    def increasing(self) -> bool:
        # Adding anything; multiplying or dividing by a positive constant (a parameter may be negative).
        return self.symbol == "+" or (self.param is None and self.scalar is not None and self.scalar > 0)

    def _operand_py(self) -> str:
        return f"self.{self.param}" if self.param else repr(self.scalar)

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"({x} {self.symbol} {self._operand_py()})"

    def cuda(self, v: str, load: ParamLoader) -> str:
        operand = load(self.param) if self.param else _float_literal(self.scalar)
        return f"({v} {self.symbol} {operand})"


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
