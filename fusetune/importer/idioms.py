"""Subgraphs matched whole where the chain's value has exactly two readers: ``x * f(x)`` written out by hand (IDIOMS:
silu, mish, hardswish, f a run of the table's ops) and the mean centring ``x - x.mean(dim, keepdim=True)``
(fusetune/ops/norm.py's MeanCentre).
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Sequence

import torch

from fusetune.derived import overwrites_input
from fusetune.importer.builders.reductions import reduction
from fusetune.importer.graph import Entry
from fusetune.importer.matching import Site, Stop
from fusetune.importer.table import lookup


#: relu6(x + 3) as PyTorch users write it.
_RELU6_OF_X_PLUS_3: tuple[tuple[Entry, ...], ...] = (
    ({"op": "add", "by": 3.0}, {"op": "relu6"}),
    ({"op": "add", "by": 3.0}, {"op": "clamp", "min": 0.0, "max": 6.0}),
    ({"op": "add", "by": 3.0}, {"op": "hardtanh", "min_val": 0.0, "max_val": 6.0}),
)
#: ``x * f(x)`` written out by hand: the entries of f (a run of the table's unary ops from x to the
#: multiply) -> the vocabulary's entries computing ``x * f(x)``; the chain's value is read twice, which no
#: single op of the table takes.
IDIOMS: tuple[tuple[tuple[Entry, ...], tuple[Entry, ...]], ...] = (
    (({"op": "sigmoid"},), ({"op": "silu"},)),
    (({"op": "softplus", "beta": 1.0, "threshold": 20.0}, {"op": "tanh"}), ({"op": "mish"},)),
    (({"op": "hardsigmoid"},), ({"op": "hardswish"},)),
    # x * relu6(x + 3) is 6 hardswish(x) (its / 6 follows as an op of its own)
    *((run, ({"op": "hardswish"}, {"op": "mul", "by": 6.0})) for run in _RELU6_OF_X_PLUS_3),
    # x * (relu6(x + 3) / 6), x * clamp((x + 3) / 6, 0, 1): hardswish
    *((run + ({"op": "div", "by": 6.0},), ({"op": "hardswish"},)) for run in _RELU6_OF_X_PLUS_3),
    (({"op": "add", "by": 3.0}, {"op": "div", "by": 6.0}, {"op": "clamp", "min": 0.0, "max": 1.0}),
     ({"op": "hardswish"},)),
    (({"op": "add", "by": 3.0}, {"op": "div", "by": 6.0}, {"op": "hardtanh", "min_val": 0.0, "max_val": 1.0}),
     ({"op": "hardswish"},)),
)
#: The multiply that closes an idiom: operator.mul, torch.mul, x.mul(y), torch.multiply, x.multiply(y).
_MUL_TARGETS = (("call_function", operator.mul), ("call_function", torch.mul), ("call_method", "mul"),
                ("call_function", torch.multiply), ("call_method", "multiply"))


def match_idiom(site: Site, readers: Sequence[torch.fx.Node]
                ) -> tuple[list[torch.fx.Node], list[Entry], torch.fx.Node] | None:
    """``x * f(x)`` where the chain's value x has exactly two readers: the multiply and the first op of f.
    Returns (f's nodes, the idiom's entries, the multiply), or None where the readers are anything else."""
    if len(readers) != 2:
        return None
    for mul, first in (readers, readers[::-1]):
        if (mul.op, mul.target) not in _MUL_TARGETS or mul.kwargs or len(mul.args) != 2:
            continue
        inner: list[torch.fx.Node] = []
        entries: list[Entry] = []
        node, cur = first, set(site.cur)
        while node is not mul and len(inner) < 3:
            builder = lookup(site.gm, node)
            if builder is None or overwrites_input(site.gm, node):  # in place: the multiply would read f(x) twice
                break
            try:
                mapped = builder(dataclasses.replace(site, node=node, cur=cur))
            except Exception:  # noqa: BLE001 - Stop, or arguments no row foresaw: no idiom
                break
            if isinstance(mapped, str) or mapped.out is not node or mapped.module is not None or len(node.users) != 1:
                break
            inner.append(node)
            entries.extend(mapped.entries)
            cur = {node}
            node = next(iter(node.users))
        if node is not mul or not inner:
            continue
        a, b = mul.args
        if not ((site.is_x(a) and b is inner[-1]) or (site.is_x(b) and a is inner[-1])):
            continue
        for pattern, replacement in IDIOMS:
            if list(pattern) == entries:
                return inner, [dict(e) for e in replacement], mul
    return None


#: The subtraction that closes a mean centring: x - m, torch.sub(x, m), x.sub(m), torch.subtract, x.subtract(m).
_SUB_TARGETS = (("call_function", operator.sub), ("call_function", torch.sub), ("call_method", "sub"),
                ("call_function", torch.subtract), ("call_method", "subtract"))
#: The mean a centring subtracts: torch.mean(x, dim, keepdim=True), x.mean(dim, keepdim=True).
_MEAN_TARGETS = (("call_function", torch.mean), ("call_method", "mean"))


def match_centring(site: Site, readers: Sequence[torch.fx.Node]) -> tuple[list[torch.fx.Node], Entry] | None:
    """``x - x.mean(dim, keepdim=True)`` where ``readers`` are two of the chain's value x (every reader, or two of the
    convolution's output beside readers outside the chain: chains._centring): the mean (read by the subtraction
    alone) and the subtraction of it from x. Returns (the mean and the subtraction; the config's
    entry, ``{op: sub, by: {op: mean, dim, keepdim: true}}``: fusetune/ops/norm.py's MeanCentre), or None."""
    if len(readers) != 2:
        return None
    for mean, sub in (readers, readers[::-1]):
        if ((mean.op, mean.target) not in _MEAN_TARGETS or (sub.op, sub.target) not in _SUB_TARGETS
                or list(mean.users) != [sub] or len(sub.args) != 2 or set(sub.kwargs) - {"alpha"}
                or sub.kwargs.get("alpha", 1) != 1 or not site.is_x(sub.args[0]) or sub.args[1] is not mean):
            continue
        try:
            mapped = reduction("mean")(dataclasses.replace(site, node=mean))
        except Stop:
            return None
        (entry,) = mapped.entries
        if not entry["keepdim"]:
            return None  # x - x.mean(dim): the mean broadcast against other dims than it reduced
        return [mean, sub], {"op": "sub", "by": {"op": "mean", "dim": entry["dim"], "keepdim": True}}
    return None
