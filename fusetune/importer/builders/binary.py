"""Builders of binary ops: x (op) other for add, sub, mul, div, pow, minimum and maximum, the other operand a number, a
parameter, a derived tensor, the convolution's output (a residual: ``by: producer``) or an extra input (Site.operand).
The chain's value on the right is rewritten into the vocabulary (c - x: neg then add; c / x: pow -1 then mul), x + x and
x * x are one op, and torch's keyword forms and alpha= are bound.
"""
from __future__ import annotations

from typing import Any

import torch

from fusetune.importer.graph import Entry, _describe
from fusetune.importer.matching import Builder, Mapped, Site, Stop, _call_args, _constant_tensor_nodes, _one
from fusetune.importer.operands import InputRef


def binary(kind: str) -> Builder:
    """x (op) other, other (op) x: a number, a per-channel parameter or the producer; c - x is
    neg then add; c / x is pow -1 then mul c (a number or a parameter); c ** x is not in the vocabulary;
    x * x is pow 2, x + x is mul 2."""
    def build(site: Site) -> Mapped:
        args, kwargs = _call_args(site)
        if kwargs or len(args) != 2:
            raise Stop(f"{_describe(site.gm, site.node)} with arguments {sorted(kwargs)} is not in the vocabulary")
        a, b = args
        if site.is_x(a) and site.is_x(b) and not (site.cur & site.producer):
            if kind == "mul":
                return _one(site, {"op": "pow", "by": 2.0})
            if kind == "add":
                return _one(site, {"op": "mul", "by": 2.0})
            raise Stop("both operands are the chain's value")
        if site.is_x(a):
            return Mapped([_binary_entry(kind, site.operand(b))], site.node, _constant_tensor_nodes(site, b) or [])
        if not site.is_x(b):
            raise Stop("its operands do not include the chain's value")
        other = site.operand(a)
        extra = _constant_tensor_nodes(site, a) or []
        if kind in ("add", "mul", "minimum", "maximum"):
            return Mapped([_binary_entry(kind, other)], site.node, extra)
        if kind == "sub":
            return Mapped([{"op": "neg"}, _binary_entry("add", other)], site.node, extra)
        if kind == "div" and not isinstance(other, (str, InputRef)):  # c / x: 1 / x (pow -1), times c unless 1
            scale = [] if other == 1.0 else [_binary_entry("mul", other)]
            return Mapped([{"op": "pow", "by": -1.0}, *scale], site.node, extra)
        raise Stop(f"{'c / x' if kind == 'div' else 'c ** x'} (the chain's value on the right, c {other!r}) is not "
                    "in the vocabulary")
    return build


def _binary_entry(kind: str, operand: Any) -> Entry:
    if isinstance(operand, str) and operand != "producer":
        raise Stop(operand)
    if kind == "div" and operand == 0.0:
        raise Stop("division by zero")
    return {"op": kind, "by": operand}


#: The names torch's binary functions give their two operands (torch.add(input, other), torch.pow(self, exponent),
#: torch.true_divide(dividend, divisor)): a keyword call is bound by them.
_FIRST_OPERAND = ("input", "self", "dividend")
_SECOND_OPERAND = ("other", "exponent", "divisor")


def _method_or_fn_binary(kind: str) -> Builder:
    """torch.add(x, y, alpha=a) / x.sub(y, alpha=a) / x.div(y, rounding_mode=None), positional or by keyword:
    ``binary``'s op, alpha (x + a * y) folded into a number operand (x - 1 * a) or into a multiply of the chain's
    value (y + a * x: mul a then add y; x + a * x: mul 1 + a); a true division (rounding_mode None)."""
    inner = binary(kind)

    def build(site: Site) -> Mapped:
        a, b, options = _binary_operands(site.node)
        alpha = options.pop("alpha", 1)
        if options.pop("rounding_mode", None) is not None and kind == "div":
            raise Stop(f"rounding_mode={site.node.kwargs['rounding_mode']!r} (a rounded division) is not in the "
                       "vocabulary")
        if options:
            raise Stop(f"arguments {sorted(options)} are not in the vocabulary")
        if alpha != 1:
            if kind not in ("add", "sub") or isinstance(alpha, (bool, torch.fx.Node)) or not isinstance(alpha, (int, float)):
                raise Stop(f"alpha={alpha!r} is not in the vocabulary")
            return _scaled_binary(site, kind, a, b, float(alpha))
        node = site.node
        saved = node.args, node.kwargs
        try:
            node.args, node.kwargs = (a, b), {}
            return inner(site)
        finally:
            node.args, node.kwargs = saved
    return build


def _binary_operands(node: torch.fx.Node) -> tuple[Any, Any, dict[str, Any]]:
    """A binary function's or method's two operands, positional or by keyword, and its other keyword arguments."""
    args, kwargs = list(node.args), dict(node.kwargs)
    for names in (_FIRST_OPERAND, _SECOND_OPERAND):
        given = [k for k in names if k in kwargs]
        if len(args) < 2 and given:
            args.append(kwargs.pop(given[0]))
    if len(args) != 2:
        raise Stop(f"called with {len(args)} operands")
    return args[0], args[1], kwargs


def _scaled_binary(site: Site, kind: str, a: Any, b: Any, alpha: float) -> Mapped:
    """a + alpha * b (add) or a - alpha * b (sub), one of them the chain's value."""
    sign = 1.0 if kind == "add" else -1.0
    if site.is_x(a) and site.is_x(b):
        return _one(site, {"op": "mul", "by": 1.0 + sign * alpha})
    if site.is_x(a):
        other = site.operand(b)
        if isinstance(other, float):
            return Mapped([_binary_entry(kind, alpha * other)], site.node, _constant_tensor_nodes(site, b) or [])
        raise Stop(f"alpha={alpha:g} scales the other operand, a tensor ({getattr(b, 'name', b)}): x {'+' if sign > 0 else '-'} "
                   f"{alpha:g} * y is in the vocabulary where y is a number, or the chain's value is y")
    if not site.is_x(b):
        raise Stop("its operands do not include the chain's value")
    other = site.operand(a)
    return Mapped([{"op": "mul", "by": sign * alpha}, _binary_entry("add", other)], site.node,
                  _constant_tensor_nodes(site, a) or [])
