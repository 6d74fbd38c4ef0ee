"""Operands: how a binary op's other tensor enters a config. A tensor of the model is a parameter (ParamRef: declared
(C, 1, ..., 1) or a scalar, bound as a view of the user's tensor, declared_view), a tensor the forward computes from the
model's tensors alone a derived parameter (DerivedRef, computed again at every call), another tensor of the forward an
extra input (InputRef, with its broadcast kind: _available, _viewed_argument). Site.operand
(fusetune/importer/matching.py) decides with these; the config stage (fusetune/importer/configs.py) reads the same
records.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Sequence

import torch

from fusetune.derived import RESHAPE_METHODS, Derivation
from fusetune.importer.graph import _is_convolution, _is_shape_read, _shape, fetch, has_node


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A tensor of the user's model that the config declares as a per-channel parameter, by its attribute
    path, and its own shape: (C, 1, ..., 1) as declared, or any shape that broadcasts as one against the
    chain's value, (1, C, 1, 1) or a single value (0-dim, (1,), (1, 1, 1)), which binds as a view
    (``declared_view``)."""

    target: str
    shape: tuple[int, ...] = ()
    views: tuple[str, ...] = ()  # the forward's nodes reshaping it (self.bias.view(1, -1, 1, 1)): the chain's too


@dataclasses.dataclass(frozen=True)
class InputRef:
    """A binary op's operand that is another tensor of the forward, of the chain value's shape and computed
    without the convolution (a residual's identity, a second input of the model: ``forward(self, x,
    add_input)``): the config declares it as an extra input (``inputs:``), which the fused module is called with."""

    node: str  # the graph node holding it
    name: str  # its name in the config: the forward's argument where it is one, else the node's
    #: How it broadcasts against the chain's value (fusetune/broadcast.py): "full" (the chain's shape), or a kind
    #: such as a UNet's ``temb[:, :, None, None]`` (per_sample_channel)
    kind: str = "full"


@dataclasses.dataclass(frozen=True)
class DerivedRef:
    """A binary op's operand that the forward computes from the model's tensors alone (``w = bn.weight /
    torch.sqrt(bn.running_var + bn.eps)``, ``self.scale.exp()``, ``torch.sigmoid(self.gate).view(1, -1, 1, 1)``),
    one value per channel or a single value: the config declares it as a parameter, whose value the fused
    chain computes from the user's tensors at every call (fusetune/derived.py), never a constant of the import."""

    target: str  # the base of its config name (derived_<node>)
    node: str  # the graph node holding the operand
    derivation: Derivation
    nodes: tuple[str, ...]  # the derivation's call nodes, in graph order: the chain's where no other op reads them


#: Reshapes of a tensor that keep its values' order (derived.RESHAPE_METHODS: a per-channel tensor viewed as
#: (1, C, 1, 1) in the forward), and contiguous, which keeps them too (derived.VIEW_METHODS, the views a write goes
#: through, leaves it out: it copies a tensor that is not contiguous).
_VIEW_METHODS = RESHAPE_METHODS | {"contiguous"}
_VIEW_FUNCTIONS = tuple(getattr(torch, name) for name in sorted(RESHAPE_METHODS) if name != "view")  # no torch.view


def _viewed_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[str, list[torch.fx.Node]] | None:
    """(the attribute, the view nodes) where ``node`` is a model tensor reshaped in the forward (views,
    ``[None, :, None, None]``), each view read once and the element count kept; else None."""
    nodes: list[torch.fx.Node] = []
    while node.op != "get_attr":
        index_ok = (node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[1], tuple)
                    and all(i is None or i == slice(None) or i is Ellipsis for i in node.args[1]))
        if not (index_ok or (node.op == "call_method" and node.target in _VIEW_METHODS)
                or (node.op == "call_function" and node.target in _VIEW_FUNCTIONS)):
            return None
        if len(node.users) != 1 or not node.args or not isinstance(node.args[0], torch.fx.Node) or any(
                has_node(a) for a in (*node.args[1:], *node.kwargs.values())):
            return None
        nodes.append(node)
        node = node.args[0]
    value = fetch(gm, node.target)
    if not nodes or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None
    shape = _shape(nodes[0])
    if shape is None or math.prod(shape) != value.numel():
        return None
    return str(node.target), nodes[::-1]


def per_channel_form(shape: Sequence[int], value_shape: Sequence[int], channels: int) -> str | None:
    """How a tensor of ``shape`` broadcasts against the chain's value (N, C, spatial...) of
    ``value_shape``: "per_channel" (one value per channel, whatever its leading 1s), "scalar" (one value),
    or None where it is neither or would change the value's shape (rank above the value's, or a size
    other than 1 beside the channels). A single value is "scalar" whatever the value's channels: after a
    channel reduction (keepdim) a (1, 1, 1) parameter is one value, which the config declares shape: scalar."""
    shape, rank = tuple(int(s) for s in shape), len(value_shape)
    if len(shape) > rank:
        return None
    if all(s == 1 for s in shape):  # one value: whatever the value's channels (after a channel reduction too)
        return "scalar"
    if rank < 2 or value_shape[1] != channels:
        return None
    padded = (1,) * (rank - len(shape)) + shape
    if padded[1] == channels and all(s == 1 for i, s in enumerate(padded) if i != 1):
        return "per_channel"
    return None


def declared_view(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The user's tensor as the config declares it, (C, 1, ..., 1) or a scalar's 0-dim: itself where it has that
    shape, else a view of the same storage (a single value expanded or made 0-dim, a (1, C, 1, 1) reshaped), so
    that an in-place update of the user's tensor (an optimizer step, ``load_state_dict``) reaches the kernels."""
    shape = tuple(int(s) for s in shape)
    if tuple(tensor.shape) == shape:
        return tensor
    if tensor.numel() == 1:
        return tensor.reshape(()).expand(shape)
    return tensor.view(shape)


def _viewed_argument(node: torch.fx.Node) -> torch.fx.Node | None:
    """The forward argument (placeholder) ``node`` is, or views (``temb[:, :, None, None]``,
    ``temb.view(n, c, 1, 1)``): a broadcast input's name in the config; None where it is computed otherwise."""
    current = node
    while current.op != "placeholder":
        sources = [n for n in current.all_input_nodes if n.op != "get_attr"]
        viewing = (current.op == "call_method" and current.target in _VIEW_METHODS) or (
            current.op == "call_function" and (current.target is operator.getitem or current.target in _VIEW_FUNCTIONS))
        if not viewing or len(sources) != 1:
            return None
        current = sources[0]
    return current


def _available(gm: torch.fx.GraphModule, node: torch.fx.Node, producer: set[torch.fx.Node]) -> bool:
    """Whether ``node`` may be an extra input of the chain of the convolution ``producer``: computed before the
    convolution, or after it from no convolution after it (an FPN's upsampled top-down value, a diffusion block's
    projected time embedding). The fused call comes after the chain's last node, where either is computed; a value
    read from a later convolution is that convolution's chain's to take, with this chain's value as its input
    (a residual's shortcut and main path: the one computed second takes the add), so that one chain takes it."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    start = min(order[p] for p in producer)
    if order[node] < start:
        return True
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current in seen or order[current] < start:
            continue
        seen.add(current)
        if current in producer or _is_convolution(gm, current):
            return False
        if not _is_shape_read(current):  # a size read off a value: fixed at the traced shapes (Chain.sizes)
            todo.extend(current.all_input_nodes)
    return True
