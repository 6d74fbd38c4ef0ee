"""What the importer asks of a traced graph's nodes at every stage: a value's traced shape and dtype, the model tensor a
``get_attr`` reads, whether an argument holds a node, the one argument a module is called with, whether a node is a
convolution (a producer) or a module with forward hooks, a read of a shape or size arithmetic on one, a trace constant
or a user's tensor, and how a message names a node. Kept below the stages that ask (tracing, producers, the matchers,
the walk, the map), so that each imports them from here and never from a later stage. ``Entry`` is a config entry as the
importer builds it.
"""
from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.computed_weights import parametrized_convolution
from fusetune.ops import Shape
from fusetune.producers import KINDS


Entry = dict[str, Any]


def _shape(node: Any) -> Shape | None:
    meta = getattr(node, "meta", {}).get("tensor_meta") if isinstance(node, torch.fx.Node) else None
    return tuple(int(s) for s in meta.shape) if hasattr(meta, "shape") else None


def fetch(gm: nn.Module, target: str) -> Any:
    return functools.reduce(getattr, target.split("."), gm)


def _fetch_or_none(gm: nn.Module, target: str) -> Any:
    try:
        return fetch(gm, target)
    except AttributeError:
        return None


_CONV_MODULES: dict[type, str] = {getattr(nn, kind.module): op for op, kind in KINDS.items()}
_CONV_FUNCTIONS: dict[Any, str] = {getattr(F, op): op for op in KINDS}


def _module_argument(node: torch.fx.Node) -> Any:
    """The one argument a module is called with, positional or as ``input=`` (``self.conv(input=x)``); None where
    it is called with more (a transposed convolution's output_size)."""
    if len(node.args) == 1 and not node.kwargs:
        return node.args[0]
    if not node.args and set(node.kwargs) == {"input"}:
        return node.kwargs["input"]
    return None


def _call_input(node: torch.fx.Node) -> Any:
    """A call's first argument, positional or ``input=`` (``torch.sigmoid(input=x)``); None where it has none."""
    return node.args[0] if node.args else node.kwargs.get("input")


def has_node(value: Any) -> bool:
    found: list[bool] = []
    torch.fx.node.map_arg(value, lambda n: found.append(True))
    return bool(found)


def _user_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether a get_attr node reads a tensor of the user's model (a parameter or a buffer), not a constant the
    trace made of a tensor built in the forward."""
    target = str(node.target)
    return not target.split(".")[-1].startswith("_tensor_constant") and isinstance(_fetch_or_none(gm, target),
                                                                                    torch.Tensor)


def _depends_on(node: torch.fx.Node, sources: set[torch.fx.Node], through_shapes: bool = True) -> bool:
    """Whether ``node``'s value is computed from any of ``sources`` (through any path of the graph); with
    ``through_shapes`` False, not through reads of their shapes (``F.interpolate(top, size=lateral.shape[-2:])``
    reads no value of ``lateral``)."""
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current in sources:
            return True
        if current not in seen:
            seen.add(current)
            if through_shapes or not _is_shape_read(current):
                todo.extend(current.all_input_nodes)
    return False


def _constant(gm: torch.fx.GraphModule, arg: Any) -> bool:
    """A number, or a one-value constant of the trace (torch.tensor(2.0) in the forward); not a parameter."""
    if isinstance(arg, torch.fx.Node):
        if arg.op != "get_attr":
            return False
        value = fetch(gm, arg.target)
        return isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.numel() == 1 \
            and str(arg.target).startswith("_tensor_constant")
    return isinstance(arg, (int, float, bool)) or arg is None


#: Reads of a tensor's metadata, not its values (x.size(0) in x.view(x.size(0), -1)).
SHAPE_METHODS = ("size", "dim")
SHAPE_ATTRIBUTES = ("shape", "ndim", "dtype", "device")


def _hooked(module: nn.Module) -> str | None:
    """Why a module called whole cannot be a chain's op: forward hooks or pre-hooks on it (or global ones) run
    around its call, and a fused chain never calls it. torch.nn.utils.weight_norm and spectral_norm are such hooks:
    they recompute ``module.weight`` at each call, so a kernel bound to that attribute would read a stale weight
    once the user's weight_g / weight_orig change, and a user's hook that records or edits the output would never
    run. None where the call is the module's forward alone."""
    from torch.nn.modules import module as torch_module

    hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values(),
             *torch_module._global_forward_pre_hooks.values(), *torch_module._global_forward_hooks.values()]
    if not hooks:
        return None
    names = sorted({getattr(h, "__qualname__", type(h).__name__) for h in hooks})
    return f"{type(module).__name__} has forward hooks ({', '.join(names)}) that a fused chain would not run"


def _is_convolution(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return type(module) in _CONV_MODULES or parametrized_convolution(module, _CONV_MODULES)
    return node.op == "call_function" and node.target in _CONV_FUNCTIONS


def _dtype(node: Any) -> torch.dtype | None:
    """The traced dtype of a node's value (None where it is not a tensor or was not traced)."""
    meta = getattr(node, "meta", {}).get("tensor_meta") if isinstance(node, torch.fx.Node) else None
    return getattr(meta, "dtype", None)


def _is_shape_read(node: torch.fx.Node) -> bool:
    if node.op == "call_method" and node.target in SHAPE_METHODS:
        return True
    return node.op == "call_function" and node.target is getattr and node.args[1] in SHAPE_ATTRIBUTES


def _is_size_arithmetic(node: torch.fx.Node) -> bool:
    """``x.shape[2] * x.shape[3]``, ``b.shape[1:]``: a number or a size computed from shape reads and numbers alone."""
    if node.op != "call_function" or node.target not in _METADATA_FUNCTIONS or _shape(node) is not None:
        return False
    return bool(node.all_input_nodes) and all(_is_shape_read(n) or _is_size_arithmetic(n) for n in node.all_input_nodes)


def _read_what(node: torch.fx.Node) -> str:
    """What a metadata read reads: x.shape, x.dtype, x.size(2), x.dim()."""
    if node.op == "call_function":
        return str(node.args[1])
    return {"size": "shape", "dim": "rank"}.get(str(node.target), "metadata")


def _describe(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"{type(gm.get_submodule(node.target)).__name__} ({node.target})"
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):  # torch.export's ATen level (fusetune/exported.py)
            return f"torch.ops.{target.name().replace('::', '.')}"
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__name__", str(target))
        module = {"torch._C._nn": "torch.nn.functional", "_operator": "operator",
                  "torch._C._VariableFunctions": "torch"}.get(module, module)
        return f"{module}.{name}" if module else name
    return node.op


#: What the forward computes from a shape (b, c, d, h, w = x.shape; x.size(2) * x.size(3)): its parts and sizes.
_METADATA_FUNCTIONS = (operator.getitem, operator.mul, operator.floordiv, operator.add, operator.sub)
