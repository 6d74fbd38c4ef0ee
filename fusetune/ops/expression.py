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
the power takes pow's helpers (fusetune/ops/elementwise.py). The planner's flags are False: an expression is not
analysed for monotonicity (the max-pool shortcuts then do not apply, which costs speed, never correctness).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
from typing import Any, Callable, ClassVar, Mapping, Union

from fusetune.errors import did_you_mean
from fusetune.ops.activations import UNARY
from fusetune.ops.base import Op, OpContext, reject_unknown
from fusetune.ops.elementwise import Elementwise, ParamLoader, Relu, _float_literal, pow_cuda

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


def _number(value: float) -> Num:
    if not math.isfinite(value):
        raise ExpressionError(f"expected finite numbers, got {value!r}")
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


def _reads(node: Node) -> int:
    """How many times ``node`` reads x."""
    if isinstance(node, Value):
        return 1
    if isinstance(node, Num):
        return 0
    if isinstance(node, Negate):
        return _reads(node.operand)
    if isinstance(node, BinOp):
        return _reads(node.left) + _reads(node.right)
    if isinstance(node, Power):
        return _reads(node.base)
    return sum(_reads(arg) for arg in node.args)


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
        if _IDENTIFIER.fullmatch(v) or _reads(self.tree) <= 1:
            return render_cuda(self.tree, v)
        return f"([](float {CUDA_VALUE}) {{ return {render_cuda(self.tree, CUDA_VALUE)}; }}({v}))"
