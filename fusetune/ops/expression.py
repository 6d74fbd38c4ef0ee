"""A pointwise op written as an arithmetic expression of the chain's value: ``{op: expression, expr: "x *
sigmoid(x + 3) / 6"}``.

Models write pointwise forms that are no activation of the vocabulary (KernelBench's ``x * torch.sigmoid(x + 3) /
6``, ``x * torch.tanh(x)``); as one op they stay inside the kernels instead of ending the chain. The grammar is
small: ``x``, numbers, ``+ - * /``, ``**`` with a number as exponent, unary minus and plus, parentheses, and calls
by name of the parameter-free ops (UNARY's rows, ``relu``) and of ``minimum(a, b)`` / ``maximum(a, b)``. The text
is parsed with ``ast`` and every node checked against that whitelist; it is never evaluated. A subexpression of
numbers alone is folded into one number (in float64, as Python computes it), which both renderings write as a
literal; a call must read x (``sqrt(2)`` is written as its value), so every call in the reference takes a tensor.

The CUDA expression is UNARY's format strings and float arithmetic, the PyTorch reference UNARY's torch strings;
the power takes pow's helpers (fusetune/ops/elementwise.py). The planner's flags (monotone, increasing: the
max-pool shortcuts, see fusetune/ops/activations.py) are derived from the tree by ``trend``: a small set of rules
that proves them or gives up (False costs a shortcut, a wrong True a wrong result).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
import struct
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Union

from fusetune.dtypes import DTYPES
from fusetune.errors import did_you_mean
from fusetune.ops.activations import UNARY
from fusetune.ops.base import Op, OpContext, reject_unknown
from fusetune.ops.elementwise import _POW_HELPERS, Elementwise, ParamLoader, Relu, _float_literal, pow_cuda

#: The functions of one argument an expression may call: name -> (CUDA format of ``{v}``, PyTorch format of
#: ``{x}``): UNARY's rows and relu (elementwise.Relu's forms).
FUNCTIONS: dict[str, tuple[str, str]] = {**{name: (facts.cuda, facts.torch) for name, facts in UNARY.items()},
                                         "relu": (Relu().cuda("{v}", None), Relu().forward_code("{x}", None))}
#: The functions of two arguments: name -> (CUDA helper, torch function, torch.clamp's key against a number).
#: NaN from either side propagates, as torch.minimum / torch.maximum (and torch.clamp) do.
EXTREMA: dict[str, tuple[str, str, str]] = {"minimum": ("ft_min_nan", "torch.minimum", "max"),
                                            "maximum": ("ft_max_nan", "torch.maximum", "min")}
#: The arithmetic operators: ast class -> its symbol.
OPERATORS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
#: What the grammar takes, for the messages.
GRAMMAR = ("x, numbers, + - * /, ** with a number as exponent, unary minus, parentheses, and calls of "
           "minimum(a, b), maximum(a, b) and the parameter-free ops (sigmoid, tanh, exp, relu, ...)")
#: The value's name in the expression.
VALUE = "x"


@dataclasses.dataclass(frozen=True)
class Num:
    value: float


@dataclasses.dataclass(frozen=True)
class Value:
    """The chain's value x."""


@dataclasses.dataclass(frozen=True)
class Call:
    name: str
    args: tuple["Node", ...]


@dataclasses.dataclass(frozen=True)
class BinOp:
    symbol: str
    left: "Node"
    right: "Node"


@dataclasses.dataclass(frozen=True)
class Negate:
    operand: "Node"


@dataclasses.dataclass(frozen=True)
class Power:
    base: "Node"  # reads x (a power of numbers is folded)
    exponent: float


Node = Union[Num, Value, Call, BinOp, Negate, Power]


class ExpressionError(ValueError):
    """Why a text is not an expression of the grammar (the op's parser names the key)."""


def parse_expression(text: str) -> Node:
    """The tree of ``text``, numbers folded, or ExpressionError naming what is outside the grammar."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ExpressionError(f"not a Python expression ({err.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExpressionError("too deeply nested or not text") from None
    try:
        node = _node(tree.body)
    except RecursionError:
        raise ExpressionError("too deeply nested") from None
    if isinstance(node, Num):
        raise ExpressionError(f"it reads no {VALUE}: a constant is no pointwise op")
    return node


def _node(tree: ast.AST) -> Node:
    if isinstance(tree, ast.Constant):
        if isinstance(tree.value, bool) or not isinstance(tree.value, (int, float)):
            raise ExpressionError(f"{tree.value!r} is no number")
        return _fold(lambda: float(tree.value))  # an int past float's range: no number
    if isinstance(tree, ast.Name):
        if tree.id != VALUE:
            raise ExpressionError(f"unknown name '{tree.id}': the expression reads {VALUE} alone")
        return Value()
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, (ast.USub, ast.UAdd)):
        operand = _node(tree.operand)
        if isinstance(tree.op, ast.UAdd):
            return operand
        return Num(-operand.value) if isinstance(operand, Num) else Negate(operand)
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Pow):
        base, exponent = _node(tree.left), _node(tree.right)
        if not isinstance(exponent, Num):
            raise ExpressionError("expected a number as the exponent of **")
        if isinstance(base, Num):
            return _fold(lambda: base.value ** exponent.value)
        return Power(base, exponent.value)
    if isinstance(tree, ast.BinOp) and type(tree.op) in OPERATORS:
        symbol = OPERATORS[type(tree.op)]
        left, right = _node(tree.left), _node(tree.right)
        if symbol == "/" and isinstance(right, Num) and right.value == 0:
            raise ExpressionError("a division by 0 (every value inf or nan)")
        if isinstance(left, Num) and isinstance(right, Num):
            return _fold(lambda: _ARITHMETIC[symbol](left.value, right.value))
        return BinOp(symbol, left, right)
    if isinstance(tree, ast.Call):
        return _call(tree)
    raise ExpressionError(f"'{_source(tree)}' is not in the grammar")


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
                                                           "*": lambda a, b: a * b, "/": lambda a, b: a / b}


def _call(tree: ast.Call) -> Node:
    if not isinstance(tree.func, ast.Name):
        raise ExpressionError(f"'{_source(tree.func)}' is not a function of the grammar: call functions by their "
                              "bare names (sigmoid(x), not torch.sigmoid(x))")
    name = tree.func.id
    arity = 2 if name in EXTREMA else 1
    if name not in FUNCTIONS and name not in EXTREMA:
        known = [*FUNCTIONS, *EXTREMA]
        raise ExpressionError(f"unknown function '{name}'{did_you_mean(name, known)} (known: "
                              f"{', '.join(sorted(known))})")
    if tree.keywords or len(tree.args) != arity or any(isinstance(a, ast.Starred) for a in tree.args):
        raise ExpressionError(f"{name} takes {arity} argument{'s' if arity > 1 else ''}, without keywords")
    args = tuple(_node(a) for a in tree.args)
    if all(isinstance(a, Num) for a in args):
        raise ExpressionError(f"{name}({', '.join(_source(a) for a in tree.args)}) reads no {VALUE}: write its "
                              "value as a number")
    return Call(name, args)


#: The magnitudes a float32 literal holds, the kernels' (the largest finite float32, half the smallest subnormal):
#: a number past them would be inf or 0 in the kernels and not in the float64 reference.
FLOAT32_MAX = DTYPES["float32"].largest
FLOAT32_ROUNDS_TO_ZERO = 0.7006492321624085e-45


def _number(value: float) -> Num:
    if not math.isfinite(value):
        raise ExpressionError(f"expected finite numbers, got {value!r}")
    if abs(value) > FLOAT32_MAX or 0 < abs(value) <= FLOAT32_ROUNDS_TO_ZERO:
        raise ExpressionError(f"{value!r} is outside float32's range, in which the kernels compute (a magnitude "
                              f"of at most {FLOAT32_MAX:.7g}, and 0 or at least 1.4e-45)")
    return Num(value)


def _fold(compute: Callable[[], Any]) -> Num:
    try:
        value = compute()
    except (ZeroDivisionError, OverflowError) as err:
        raise ExpressionError(f"its numbers alone give no number ({err})") from None
    if not isinstance(value, (int, float)):  # a negative number to a fractional power: complex
        raise ExpressionError(f"its numbers alone give {value!r}, no real number")
    return _number(float(value))


def _source(tree: ast.AST) -> str:
    return ast.unparse(tree)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
#: The value's name in the CUDA lambda that reads it more than once (Expression.cuda).
CUDA_VALUE = "ft_x"


def reads(node: Node) -> int:
    """How many times ``node`` reads x."""
    if isinstance(node, Value):
        return 1
    if isinstance(node, Num):
        return 0
    if isinstance(node, Negate):
        return reads(node.operand)
    if isinstance(node, BinOp):
        return reads(node.left) + reads(node.right)
    if isinstance(node, Power):
        return reads(node.base)
    return sum(reads(arg) for arg in node.args)


def _wrap(text: str) -> str:
    """``text`` as an operand: parenthesised unless a name (the value may be a whole expression)."""
    return text if _IDENTIFIER.fullmatch(text) else f"({text})"


def render_cuda(node: Node, v: str) -> str:
    """The float CUDA expression of ``node`` with ``v`` for x."""
    if isinstance(node, Value):
        return _wrap(v)
    if isinstance(node, Num):
        return _float_literal(node.value)
    if isinstance(node, Negate):
        return f"(-{_wrap(render_cuda(node.operand, v))})"
    if isinstance(node, BinOp):
        return f"({render_cuda(node.left, v)} {node.symbol} {render_cuda(node.right, v)})"
    if isinstance(node, Power):
        return pow_cuda(render_cuda(node.base, v), node.exponent)
    if node.name in EXTREMA:
        a, b = (render_cuda(arg, v) for arg in node.args)
        return f"{EXTREMA[node.name][0]}({a}, {b})"
    return FUNCTIONS[node.name][0].format(v=render_cuda(node.args[0], v))


def render_torch(node: Node, x: str) -> str:
    """The PyTorch expression of ``node`` with tensor ``x`` for x: every call's argument a tensor."""
    if isinstance(node, Value):
        return _wrap(x)
    if isinstance(node, Num):
        return repr(node.value)
    if isinstance(node, Negate):
        return f"(-{_wrap(render_torch(node.operand, x))})"
    if isinstance(node, BinOp):
        return f"({render_torch(node.left, x)} {node.symbol} {render_torch(node.right, x)})"
    if isinstance(node, Power):
        return f"torch.pow({render_torch(node.base, x)}, {node.exponent!r})"
    if node.name in EXTREMA:
        _, function, clamp_key = EXTREMA[node.name]
        a, b = node.args
        if isinstance(a, Num):
            a, b = b, a  # the extremum is symmetric: the number second, as torch.clamp's bound
        if isinstance(b, Num):
            return f"torch.clamp({render_torch(a, x)}, {clamp_key}={b.value!r})"
        return f"{function}({render_torch(a, x)}, {render_torch(b, x)})"
    return FUNCTIONS[node.name][1].format(x=render_torch(node.args[0], x))


def evaluate(node: Node, x: Any) -> Any:
    """``node`` on tensor ``x``: render_torch's text, the very code the generated model runs, executed with torch and
    F as its only names (the importer compares it with the region it was read from, in float64). The text is ours,
    rendered from a tree of the grammar, never the user's."""
    import torch
    import torch.nn.functional as F

    code = compile(render_torch(node, VALUE), "<expression>", "eval")
    return eval(code, {"__builtins__": {}, "torch": torch, "F": F}, {VALUE: x})  # noqa: S307 (a tree of the grammar)


class Trend(NamedTuple):
    """What ``trend`` proves of a subexpression as a function of x, over every float32 x but NaN (which every
    analysed node maps to NaN): non-decreasing (``direction`` +1) or non-increasing (-1) wherever it is no NaN;
    NaN, if at all, only for a run of the lowest inputs (``nan_low``, -inf first) or of the highest (``nan_high``),
    so that a pool window's extremes meet it (the flags' sense, fusetune/ops/activations.py); its values within
    [``lo``, ``hi``] (float32's, widened outward: _outward), which the rules read for signs and infinities;
    ``exact`` where its float32 values are monotone without exception (every step a correctly rounded operation or
    an exact function), not only up to the ulps a function such as tanhf may dip by (which a step function such as
    floor would turn into a jump of 1: FunctionTrend.steps)."""

    direction: int
    nan_low: bool
    nan_high: bool
    lo: float
    hi: float
    exact: bool


class FunctionTrend(NamedTuple):
    """A monotone function of the grammar on every float32 argument: its direction, the bounds of its values, NaN
    for arguments below ``nan_below`` (log: 0, where -0 gives -inf) and, where ``nan_at_infinities``, at +-inf
    (softsign: inf / inf); NaN to NaN. ``exact`` where its float32 values are monotone without exception (no
    ulp's dip); ``steps`` where it jumps between integers, so that it takes an exact argument only (floor of
    softsign(x), whose float32 values dip by an ulp below 1 past x = 2^24, jumps from 1 to 0 there).
    tests/test_expression_flags.py checks each row on the host-compiled kernels' values and against the op's own
    UNARY flags."""

    direction: int
    lo: float
    hi: float
    nan_below: float = -math.inf
    nan_at_infinities: bool = False
    exact: bool = False
    steps: bool = False


_INF = math.inf
#: The monotone functions of one argument (FUNCTIONS' rows whose ops flag monotone()): the others (silu, abs,
#: tanhshrink's float32 cancellation, reciprocal's jump at 0, ...) make any expression that calls them unknown.
FUNCTION_TRENDS: dict[str, FunctionTrend] = {
    "relu": FunctionTrend(1, 0.0, _INF, exact=True),
    "relu6": FunctionTrend(1, 0.0, 6.0, exact=True),
    "selu": FunctionTrend(1, -1.7581, _INF),  # scale * alpha at -inf: -1.7580993...
    "sigmoid": FunctionTrend(1, 0.0, 1.0),
    "hardsigmoid": FunctionTrend(1, 0.0, 1.0, exact=True),
    "tanh": FunctionTrend(1, -1.0, 1.0),
    "exp": FunctionTrend(1, 0.0, _INF),
    "exp2": FunctionTrend(1, 0.0, _INF),
    "expm1": FunctionTrend(1, -1.0, _INF),
    "log": FunctionTrend(1, -_INF, _INF, nan_below=0.0),
    "log2": FunctionTrend(1, -_INF, _INF, nan_below=0.0),
    "log10": FunctionTrend(1, -_INF, _INF, nan_below=0.0),
    "log1p": FunctionTrend(1, -_INF, _INF, nan_below=-1.0),
    "sqrt": FunctionTrend(1, 0.0, _INF, nan_below=0.0, exact=True),  # sqrt(-0) is -0: within [0, inf] as a bound
    "logsigmoid": FunctionTrend(1, -_INF, 0.0),
    "softsign": FunctionTrend(1, -1.0, 1.0, nan_at_infinities=True),
    "erf": FunctionTrend(1, -1.0, 1.0),
    "erfc": FunctionTrend(-1, 0.0, 2.0),
    "neg": FunctionTrend(-1, -_INF, _INF, exact=True),
    "floor": FunctionTrend(1, -_INF, _INF, exact=True, steps=True),
    "ceil": FunctionTrend(1, -_INF, _INF, exact=True, steps=True),
    "round": FunctionTrend(1, -_INF, _INF, exact=True, steps=True),
    "trunc": FunctionTrend(1, -_INF, _INF, exact=True, steps=True),
}
#: Bounds past these magnitudes are taken as infinite (float32 overflows near 2^128) and as zero (it underflows
#: below 2^-149), whichever is outward; every bound is also widened by a relative margin, for float32's rounding.
_HUGE, _TINY, _MARGIN = 2.0 ** 120, 2.0 ** -120, 2.0 ** -20


def _outward(lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened outward to hold the float32 values that float64's arithmetic of the bounds stands for."""
    lo = lo - abs(lo) * _MARGIN if math.isfinite(lo) else lo
    hi = hi + abs(hi) * _MARGIN if math.isfinite(hi) else hi
    lo = -_INF if lo < -_HUGE else 0.0 if 0 < lo < _TINY else lo
    hi = _INF if hi > _HUGE else 0.0 if -_TINY < hi < 0 else hi
    return lo, hi


def _trend(direction: int, nan_low: bool, nan_high: bool, lo: float, hi: float, exact: bool) -> Trend | None:
    if math.isnan(lo) or math.isnan(hi):
        return None  # a bound of inf - inf or 0 * inf: not proved
    return Trend(direction, nan_low, nan_high, *_outward(lo, hi), exact)


def _negated(t: Trend) -> Trend:
    return Trend(-t.direction, t.nan_low, t.nan_high, -t.hi, -t.lo, t.exact)


def _shifted(t: Trend, c: float) -> Trend | None:
    """t + c: rounding is monotone, a finite c turns no value NaN."""
    return _trend(t.direction, t.nan_low, t.nan_high, t.lo + c, t.hi + c, t.exact)


def _scaled(t: Trend, c: float) -> Trend | None:
    """t * c (or t / (1 / c)): c > 0 keeps the direction, c < 0 turns it; 0 is a constant but for NaN at the
    infinities, not analysed."""
    if c == 0:
        return None
    lo, hi = sorted((t.lo * c, t.hi * c))
    return _trend(t.direction if c > 0 else -t.direction, t.nan_low, t.nan_high, lo, hi, t.exact)


def _divided(t: Trend, c: float) -> Trend | None:
    """t / c, c nonzero (the parser refuses / 0)."""
    lo, hi = sorted((t.lo / c, t.hi / c))
    return _trend(t.direction if c > 0 else -t.direction, t.nan_low, t.nan_high, lo, hi, t.exact)


def _reciprocal(c: float, t: Trend) -> Trend | None:
    """c / t: monotone (the other way for c > 0) where t keeps one sign, zeros of either sign excluded (1 / -0 is
    -inf beside 1 / +0's inf); c / inf is 0."""
    if c == 0 or not (t.lo > 0 or t.hi < 0):
        return None
    lo, hi = sorted((c / t.lo, c / t.hi))
    return _trend(-t.direction if c > 0 else t.direction, t.nan_low, t.nan_high, lo, hi, t.exact)


def _sum(a: Trend, b: Trend) -> Trend | None:
    """a + b of one direction: rounding is monotone in each operand, so the sum keeps it; NaN from either
    operand's end stays at that end. Not where one may be +inf and the other -inf (inf - inf is NaN, possibly
    amid the inputs), nor of opposite directions (x - tanh(x): monotone as a real function, its float32 values not,
    through the cancellation)."""
    if a.direction != b.direction or (a.hi == _INF and b.lo == -_INF) or (a.lo == -_INF and b.hi == _INF):
        return None
    return _trend(a.direction, a.nan_low or b.nan_low, a.nan_high or b.nan_high, a.lo + b.lo, a.hi + b.hi,
                  a.exact and b.exact)


def _product(a: Trend, b: Trend) -> Trend | None:
    """a * b of one direction, both never below 0: rounding is monotone in each nonnegative operand. Not where one
    may be 0 and the other inf (NaN, possibly amid the inputs)."""
    if a.direction != b.direction or a.lo < 0 or b.lo < 0:
        return None
    if (a.lo == 0 and b.hi == _INF) or (b.lo == 0 and a.hi == _INF):
        return None
    return _trend(a.direction, a.nan_low or b.nan_low, a.nan_high or b.nan_high, a.lo * b.lo, a.hi * b.hi,
                  a.exact and b.exact)


def _extremum(name: str, a: Trend, b: Trend) -> Trend | None:
    """minimum / maximum of one direction: exact, NaN from either side (EXTREMA's helpers propagate it)."""
    if a.direction != b.direction:
        return None
    pick = min if name == "minimum" else max
    return _trend(a.direction, a.nan_low or b.nan_low, a.nan_high or b.nan_high, pick(a.lo, b.lo), pick(a.hi, b.hi),
                  a.exact and b.exact)


def _clamped(name: str, t: Trend, c: float) -> Trend | None:
    """minimum / maximum against a number: torch.clamp, NaN kept."""
    pick = min if name == "minimum" else max
    return _trend(t.direction, t.nan_low, t.nan_high, pick(t.lo, c), pick(t.hi, c), t.exact)


def _bound_power(base: float, exponent: float) -> float:
    try:
        return base ** exponent
    except OverflowError:
        return math.copysign(_INF, base) if exponent.is_integer() and exponent % 2 == 1 else _INF
    except ZeroDivisionError:  # 0 to a negative power: a bound of an excluded base (_power keeps t above 0)
        return _INF


def _power(t: Trend, exponent: float) -> Trend | None:
    """t ** e as pow_cuda computes it: an odd positive integer keeps the direction (as op pow's flags); any e > 0 of
    a base never below 0 keeps it, e < 0 of a base above 0 turns it; e = 0.5 (a square root) of a base that may be
    negative keeps it, NaN below 0, at the end where the base is lowest. Not e = 0 (1 for NaN too), nor the rest
    (x ** 2 falls then rises; powf(-inf, 1.5) is inf beside the NaN of finite negatives). Exact where a helper of
    correctly rounded products, quotients or square roots computes it (_POW_HELPERS), not powf."""
    e = exponent
    odd = e > 0 and e.is_integer() and e % 2 == 1
    exact = t.exact and (e == 1 or e in _POW_HELPERS)
    if odd or (e > 0 and t.lo >= 0):
        return _trend(t.direction, t.nan_low, t.nan_high, _bound_power(t.lo, e), _bound_power(t.hi, e), exact)
    if e < 0 and t.lo > 0:
        return _trend(-t.direction, t.nan_low, t.nan_high, _bound_power(t.hi, e), _bound_power(t.lo, e), exact)
    if e == 0.5:
        low = t.direction > 0
        return _trend(t.direction, t.nan_low or low, t.nan_high or not low, 0.0, _bound_power(max(t.hi, 0.0), e),
                      exact)
    return None


def _applied(f: FunctionTrend, t: Trend) -> Trend | None:
    """f(t): directions multiply; f's NaN for its lowest (or infinite) arguments lands at the end of x where t is
    lowest (or highest): x's low end where t rises, its high end where t falls. A step function of an argument
    that is not exact is not analysed (FunctionTrend.steps)."""
    if f.steps and not t.exact:
        return None
    nan_lowest = t.lo < f.nan_below or (f.nan_at_infinities and t.lo == -_INF)
    nan_highest = f.nan_at_infinities and t.hi == _INF
    if t.direction < 0:
        nan_lowest, nan_highest = nan_highest, nan_lowest
    return _trend(f.direction * t.direction, t.nan_low or nan_lowest, t.nan_high or nan_highest, f.lo, f.hi,
                  t.exact and f.exact)


#: x itself: non-decreasing, no NaN but for NaN, any value.
_VALUE_TREND = Trend(1, False, False, -_INF, _INF, True)


def trend(node: Node) -> Trend | None:
    """What the rules prove of ``node`` as a function of x (Trend), None where they prove nothing. The rules, one a
    node: x rises; a number with a subexpression: + and - shift (c - t turns), * and / by c scale (c < 0 turns, * 0
    is not analysed), c / t turns where t keeps one sign (_reciprocal), c taken as float32 (_single); unary minus
    turns; a power by _power; a function of FUNCTION_TRENDS composes (_applied), any other gives up; minimum /
    maximum against a number clamp. Where x is read on both sides of an operator, only what _sum (+, and - of
    opposite directions made one by the minus), _product (*) and _extremum prove; / of two subexpressions is not
    analysed. A function's own float32 rounding (the few ulps its op's flags allow) carries through as the
    expression's float32 error at that point, except through a step function (floor, ...), which takes an exact
    argument only (Trend.exact); tests/test_expression_flags.py checks the data's claims on float32."""
    if isinstance(node, Value):
        return _VALUE_TREND
    if isinstance(node, Num):
        return None  # only within an operator, beside a subexpression (the parser refuses a constant expression)
    if isinstance(node, Negate):
        inner = trend(node.operand)
        return _negated(inner) if inner else None
    if isinstance(node, Power):
        inner = trend(node.base)
        exact = _single(node.exponent) == node.exponent  # powf's float32 exponent is the one analysed
        return _power(inner, node.exponent) if inner and exact else None
    if isinstance(node, BinOp):
        return _binary(node)
    if node.name in EXTREMA:
        return _extremum_call(node)
    inner, function = trend(node.args[0]), FUNCTION_TRENDS.get(node.name)
    return _applied(function, inner) if inner and function else None


def _single(value: float) -> float | None:
    """A number as the kernels take it (a float literal, _float_literal): rounded to float32, None where that
    overflows (1e39 is inf there: x * 1e39 is NaN at x = 0)."""
    rounded = struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 2.0 ** 128 else _INF
    return rounded if math.isfinite(rounded) else None


def _binary(node: BinOp) -> Trend | None:
    left, right = node.left, node.right
    if isinstance(left, Num) or isinstance(right, Num):
        number, other = (_single(left.value), right) if isinstance(left, Num) else (_single(right.value), left)
        t = trend(other)
        if t is None or number is None:
            return None
        number_first = isinstance(left, Num)
        if node.symbol == "+":
            return _shifted(t, number)
        if node.symbol == "-":
            return _shifted(_negated(t), number) if number_first else _shifted(t, -number)
        if node.symbol == "*":
            return _scaled(t, number)
        return _reciprocal(number, t) if number_first else _divided(t, number)
    a, b = trend(left), trend(right)
    if a is None or b is None:
        return None
    if node.symbol == "+":
        return _sum(a, b)
    if node.symbol == "-":
        return _sum(a, _negated(b))
    if node.symbol == "*":
        return _product(a, b)
    return None


def _extremum_call(node: Call) -> Trend | None:
    a, b = node.args
    if isinstance(a, Num):
        a, b = b, a
    t = trend(a)
    if t is None:
        return None
    if isinstance(b, Num):
        bound = _single(b.value)
        return _clamped(node.name, t, bound) if bound is not None else None
    u = trend(b)
    return _extremum(node.name, t, u) if u else None


def flags(node: Node) -> tuple[bool, bool]:
    """(monotone, increasing) of ``node`` for the planner: monotone where trend proves a direction (NaN at the
    ends either way); increasing where it rises and no NaN comes at the low end (a window's largest value alone
    would miss it)."""
    t = trend(node)
    if t is None:
        return False, False
    return True, t.direction > 0 and not t.nan_low


def canonical_text(text: str) -> str:
    """``text`` (an expression parse_expression takes) as ``ast`` unparses it: spellings that differ in spaces or
    parentheses alone are one op, one cache key."""
    return ast.unparse(ast.parse(text.strip(), mode="eval"))


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> Node:
    return parse_expression(text)


@dataclasses.dataclass(frozen=True)
class Expression(Elementwise):
    """An arithmetic expression of the chain's value (the module's docstring). ``expr`` is kept as ``ast`` unparses
    it, so spellings that differ in spaces or parentheses alone share a cache key."""

    kind: ClassVar[str] = "expression"
    expr: str = VALUE

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["expr"], ctx)
        if "expr" not in raw:
            raise ctx.error("expr", f"missing; expected an arithmetic expression of {VALUE} ({GRAMMAR})")
        text = raw["expr"]
        if not isinstance(text, str):
            raise ctx.error("expr", f"expected an arithmetic expression of {VALUE} as text ({GRAMMAR}), got {text!r}")
        try:
            parse_expression(text)
        except ExpressionError as err:
            raise ctx.error("expr", f"expected an arithmetic expression of {VALUE} ({GRAMMAR}), got {text!r}: "
                                    f"{err}") from None
        return cls(expr=canonical_text(text))

    @property
    def tree(self) -> Node:
        return _parsed(self.expr)

    def forward_code(self, x: str, attr: str | None) -> str:
        return render_torch(self.tree, x)

    def cuda(self, v: str, load: ParamLoader) -> str:
        # The value read more than once, and an expression itself (the ops before, a parameter's __ldg, which the
        # compiler keeps every copy of): computed once, as a lambda's argument.
        if _IDENTIFIER.fullmatch(v) or reads(self.tree) <= 1:
            return render_cuda(self.tree, v)
        return f"([](float {CUDA_VALUE}) {{ return {render_cuda(self.tree, CUDA_VALUE)}; }}({v}))"

    def monotone(self) -> bool:
        return flags(self.tree)[0]

    def increasing(self) -> bool:
        return flags(self.tree)[1]
