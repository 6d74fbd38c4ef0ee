"""The importer's patterns for gated activations (fusetune/ops/gate.py), in the forms models write them:

  * ``F.glu(x, dim)`` and ``nn.GLU(dim)``: one call (rows of importer.table.TABLE, ``glu_function`` and ``glu_module``);
  * by hand, the two halves of a dim taken by ``x.chunk(2, dim)`` / ``torch.chunk``, ``x.split(C // 2, dim)`` /
    ``torch.split`` (a size or two equal sizes) or two slices ``x[:, :C // 2]`` and ``x[:, C // 2:]``, then
    ``f(a) * g(b)`` with f none or, like g, a parameter-free activation of the vocabulary (gate.GATE_FUNCTIONS):
    ``a * torch.sigmoid(b)`` is F.glu, WaveNet's ``torch.tanh(a) * torch.sigmoid(b)`` the glu entry with
    ``activation: tanh``.

Each matcher takes the subgraph exactly: two equal halves (an odd size, or halves split unequally, match
nothing), the value half the first one (``sigmoid(a) * b`` is no glu: the chain stops there as before), each
intermediate read by the product alone, the functions called on the half alone (no other argument but
``inplace=False``). A near miss matches nothing, and the chain stops there as before.
"""
from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.importer import Mapped, Site, bind_op, bind_all, has_node, module_input, shape_number, Stop
from fusetune.ops.gate import GATE_FUNCTIONS, GLU_GATE

_CHUNKS = (("call_method", "chunk"), ("call_function", torch.chunk))
_SPLITS = (("call_method", "split"), ("call_function", torch.split))
_MULS = (("call_function", operator.mul), ("call_function", torch.mul), ("call_method", "mul"))
#: The modules of the half functions that have one (a name of GATE_FUNCTIONS -> nn class).
_MODULES: dict[str, type[nn.Module]] = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU,
                                        "mish": nn.Mish, "relu6": nn.ReLU6, "selu": nn.SELU,
                                        "hardsigmoid": nn.Hardsigmoid, "hardswish": nn.Hardswish}


def glu_function(site: Site) -> Mapped:
    """F.glu(x, dim=-1)."""
    a = bind_op(site, ["dim"], {"dim": -1})
    return Mapped([_entry(site, int(a["dim"]))], site.node)


def glu_module(site: Site) -> Mapped:
    """nn.GLU(dim=-1) called on the chain's value."""
    module_input(site)
    return Mapped([_entry(site, int(site.module.dim))], site.node)


def _entry(site: Site, dim: int, activation: str | None = None, gate: str = GLU_GATE) -> dict[str, Any]:
    shape = site.shape_in
    if shape is None:
        raise Stop("the shape of its input is unknown")
    if not -len(shape) <= dim < len(shape) or shape[dim] % 2:
        raise Stop(f"a glu over dim {dim} of {list(shape)}: PyTorch halves an even size only")
    entry: dict[str, Any] = {"op": "glu", "dim": dim % len(shape)}
    if activation is not None:
        entry["activation"] = activation
    if gate != GLU_GATE:
        entry["gate"] = gate
    return entry


def match_gate(site: Site, readers: Sequence[torch.fx.Node]
               ) -> tuple[list[torch.fx.Node], dict[str, Any], torch.fx.Node] | None:
    """A gated product of two halves of the chain's value where ``readers`` (every reader of it) are its first
    nodes: (the nodes it covers, in graph order; the config's entry; the product's node), or None."""
    shape = site.shape_in
    if shape is None:
        return None
    found = _halves(site, readers, shape)
    if found is None:
        return None
    nodes, dim, first, second = found
    value = _through(site, first)
    gate = _through(site, second)
    if value is None or gate is None or gate[0] is None:
        return None
    (activation, value_nodes, value_out), (gate_name, gate_nodes, gate_out) = value, gate
    mul = _sole_user(value_out)
    if mul is None or mul is not _sole_user(gate_out) or not _is(mul, _MULS) or mul.kwargs:
        return None
    if set(mul.args) != {value_out, gate_out} or len(mul.args) != 2:
        return None
    try:
        entry = _entry(site, dim, activation, gate_name)
    except Stop:
        return None
    order = {n: i for i, n in enumerate(site.gm.graph.nodes)}
    covered = set(nodes) | set(value_nodes) | set(gate_nodes) | {mul}
    return sorted(covered, key=order.__getitem__), entry, mul


def _is(node: Any, targets: Sequence[tuple[str, Any]]) -> bool:
    return isinstance(node, torch.fx.Node) and (node.op, node.target) in targets


def _sole_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _dim(value: Any, rank: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not -rank <= value < rank:
        return None
    return value % rank


def _halves(site: Site, readers: Sequence[torch.fx.Node], shape: tuple[int, ...]
            ) -> tuple[list[torch.fx.Node], int, torch.fx.Node, torch.fx.Node] | None:
    """The two equal halves of a dim of the chain's value: (the nodes taking them, the dim, the first half's
    node, the second's), or None."""
    if len(readers) == 1 and (_is(readers[0], _CHUNKS) or _is(readers[0], _SPLITS)):
        return _split_halves(site, readers[0], shape)
    if len(readers) == 2 and all(r.op == "call_function" and r.target is operator.getitem for r in readers):
        return _slice_halves(site, readers, shape)
    return None


def _split_halves(site: Site, node: torch.fx.Node, shape: tuple[int, ...]):
    """x.chunk(2, dim), x.split(size // 2, dim), x.split([h, h], dim) (and torch's functions), then [0] and [1]."""
    chunk = _is(node, _CHUNKS)
    names = ["chunks", "dim"] if chunk else ["split_size_or_sections", "dim"]
    bound = bind_all(node, ["input", *names], {"dim": 0})
    if isinstance(bound, str) or not site.is_x(bound["input"]):
        return None
    if isinstance(bound[names[0]], torch.fx.Node):  # x.split(x.shape[1] // 2, 1): a size at the traced shape
        bound[names[0]] = shape_number(site, bound[names[0]])
    if any(has_node(bound[k]) for k in names):
        return None
    dim = _dim(bound["dim"], len(shape))
    if dim is None or shape[dim] % 2:
        return None
    half = shape[dim] // 2
    parts = bound[names[0]]
    if chunk and parts != 2:
        return None
    if not chunk and not (parts == half or (isinstance(parts, (list, tuple)) and list(parts) == [half, half])):
        return None
    items = {}
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.args[1] not in (0, 1):
            return None
        if user.args[1] in items:
            return None
        items[user.args[1]] = user
    if set(items) != {0, 1}:
        return None
    return [node, items[0], items[1]], dim, items[0], items[1]


def _slice_halves(site: Site, readers: Sequence[torch.fx.Node], shape: tuple[int, ...]):
    """x[:, :h] and x[:, h:] (h half the dim's size; a bound computed from x.shape is read at the traced shape)."""
    found = {}
    for node in readers:
        if not site.is_x(node.args[0]) or not isinstance(node.args[1], tuple):
            return None
        index = node.args[1]
        if len(index) > len(shape) or any(not isinstance(i, slice) for i in index):
            return None
        cut = [d for d, i in enumerate(index) if i != slice(None, None, None)]
        if len(cut) != 1:
            return None
        d = cut[0]
        part = _which_half(site, index[d], shape[d])
        if part is None or part in found:
            return None
        found[part] = (d, node)
    if set(found) != {0, 1} or found[0][0] != found[1][0]:
        return None
    return [found[0][1], found[1][1]], found[0][0], found[0][1], found[1][1]


def _which_half(site: Site, piece: slice, size: int) -> int | None:
    """0 for a slice of the first half of a dim of ``size``, 1 for the second, None otherwise."""
    if size % 2 or piece.step not in (None, 1):
        return None
    bounds = []
    for bound in (piece.start, piece.stop):
        if isinstance(bound, torch.fx.Node):
            bound = shape_number(site, bound)
        if bound is not None and (isinstance(bound, bool) or not float(bound).is_integer()):
            return None
        bounds.append(None if bound is None else int(bound))
    start, stop = bounds
    half = size // 2
    start = 0 if start is None else start + size if start < 0 else start
    stop = size if stop is None else stop + size if stop < 0 else stop
    return {(0, half): 0, (half, size): 1}.get((start, stop))


def _function(site: Site, node: torch.fx.Node, half: torch.fx.Node) -> str | None:
    """The GATE_FUNCTIONS name of ``node`` where it calls one on ``half`` alone, None otherwise."""
    if node.op == "call_module":
        module = site.gm.get_submodule(node.target)
        name = next((n for n, cls in _MODULES.items() if type(module) is cls), None)
        if name is None or node.args != (half,) or node.kwargs or getattr(module, "inplace", False):
            return None
        return name
    if node.op not in ("call_function", "call_method") or node.args != (half,):
        return None
    if node.kwargs not in ({}, {"inplace": False}):
        return None
    for name in GATE_FUNCTIONS:
        if node.op == "call_method" and node.target == name:
            return name
        if node.op == "call_function" and node.target in (getattr(torch, name, None), getattr(F, name, None)):
            return name
    return None


def _through(site: Site, half: torch.fx.Node) -> tuple[str | None, list[torch.fx.Node], torch.fx.Node] | None:
    """A half as the product reads it: (the function it goes through, None for none; its nodes; its value)."""
    user = _sole_user(half)
    if user is None:
        return None
    if _is(user, _MULS):
        return None, [], half
    name = _function(site, user, half)
    if name is None or _sole_user(user) is None:
        return None
    return name, [user], user


def channel_divisor(entry: Mapping[str, Any]) -> int:
    """How many of the chain's channels a config entry makes one: 2 for a glu over the channels, upscale_factor^2
    for a pixel shuffle (fusetune/ops/shuffle.py), else 1."""
    if entry.get("op") == "glu" and entry.get("dim") == 1:
        return 2
    if entry.get("op") == "pixel_shuffle":
        return int(entry["upscale_factor"]) ** 2
    return 1


def channels(out_channels: int, steps: Sequence[Any]) -> int:
    """The chain's channels after ``steps`` (importer Steps, whose entries are config entries): the convolution's,
    halved by each glu over the channels and divided by r^2 by each pixel shuffle, so that a per-channel parameter
    after one is read at the channels there."""
    for step in steps:
        for entry in step.entries:
            out_channels //= channel_divisor(entry)
    return out_channels


def read_channels(raw: Mapping[str, Any], name: str | None) -> int:
    """The channels where config parameter ``name`` is first read in a raw config (``by: name``, a layer norm's
    weight or bias): the convolution's out_channels, divided by each glu or pixel shuffle before it
    (channel_divisor)."""
    count = int(raw["producer"]["out_channels"])
    for entry in raw.get("epilogue", []):
        if name is not None and name in (entry.get("by"), entry.get("weight"), entry.get("bias")):
            break
        count //= channel_divisor(entry)
    return count
