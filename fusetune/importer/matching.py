"""The matcher API: what every builder of the vocabulary (fusetune/importer/builders/) and each op's own import module
(fusetune/channel_import.py, gate_import.py, slice_import.py) builds its matchers on. A Site is a candidate next op with
what the chain knows (its value and aliases, the convolution's output, the channels); a builder returns Mapped (the
config entries and the nodes it covers) or raises Stop (the chain stops before the op, for that reason). bind_op and
bind_all bind a call's arguments by name, module_input checks that a module reads the chain's value, shape_number reads
a size off the chain's values at the traced shape, and a one-value tensor the forward makes (``torch.tensor(c,
device=x.device)``) is read as its number. The op modules import this package, so it reaches them lazily
(_channel_import, _gate_import, _slice_import).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from fusetune import broadcast
from fusetune.derived import derivation
from fusetune.errors import count
from fusetune.importer.graph import (_METADATA_FUNCTIONS, Entry, _constant, _depends_on, _dtype, _is_shape_read,
                                     _module_argument, _shape, _user_tensor, fetch, has_node)
from fusetune.importer.operands import (DerivedRef, InputRef, ParamRef, _available, _viewed_argument, _viewed_tensor,
                                        per_channel_form)
from fusetune.ops import Shape


@dataclasses.dataclass
class Mapped:
    """What one user op becomes: config entries (in order) and the nodes it covers."""

    entries: list[Entry]
    out: torch.fx.Node  # the node whose value the chain goes on from
    extra: list[torch.fx.Node] = dataclasses.field(default_factory=list)  # e.g. the getitem after torch.max
    module: str | None = None  # the user's module holding state (a norm's weights, running statistics)
    weights: dict[str, str] | None = None  # a functional norm's: its tensor's name (weight, bias) -> the user's


@dataclasses.dataclass
class Site:
    """A candidate next op, with what the builders need to know about the chain."""

    gm: torch.fx.GraphModule
    node: torch.fx.Node
    cur: set[torch.fx.Node]  # the chain's value and its identity aliases
    producer: set[torch.fx.Node]  # the convolution's output and its aliases
    channels: int
    spatial_dims: int

    @property
    def module(self) -> nn.Module:
        return self.gm.get_submodule(self.node.target)

    @property
    def shape_in(self) -> Shape | None:
        return _shape(next(iter(self.cur)))

    @property
    def shape_out(self) -> Shape | None:
        return _shape(self.node)

    def is_x(self, arg: Any) -> bool:
        return isinstance(arg, torch.fx.Node) and arg in self.cur

    def operand(self, arg: Any) -> Any:
        """A binary op's other operand as the config writes it (a number, 'producer', a ParamRef),
        or a reason string."""
        if isinstance(arg, bool):
            return "a boolean operand is not in the vocabulary"
        if isinstance(arg, (int, float)):
            return float(arg) if math.isfinite(arg) else f"a non-finite operand {arg!r}"
        if not isinstance(arg, torch.fx.Node):
            return f"an operand of type {type(arg).__name__} is not in the vocabulary"
        if arg in self.producer:
            return "producer"
        if arg.op == "get_attr":
            value = fetch(self.gm, arg.target)
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() <= 1 and (
                    arg.target.startswith("_tensor_constant") or value.dim() == 0) and not isinstance(value, nn.Parameter):
                return float(value.item())
            per_channel = (self.channels,) + (1,) * self.spatial_dims
            value_shape = self.shape_in or ()
            if isinstance(value, torch.Tensor) and value.is_floating_point() and per_channel_form(
                    value.shape, value_shape, self.channels) is not None:
                return ParamRef(arg.target, tuple(int(s) for s in value.shape))
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            against = (f"the input now has {count(value_shape[1], 'channel')}" if len(value_shape) > 1
                       and value_shape[1] != self.channels else f"the chain's value {list(value_shape)}")
            return (f"the operand {arg.target} has shape {shape}: not one value per channel nor a single value "
                    f"against {against} (a per-channel parameter is {list(per_channel)}, (1, C, 1, ...) or 0-dim)")
        constant = _constant_tensor(self, arg)
        if constant is not None:  # torch.tensor(0.5, device=x.device): a number
            return constant
        size = shape_number(self, arg)
        if size is not None:  # x.sum(2) / x.shape[-1]: the size at the traced shape
            return size
        viewed = _viewed_tensor(self.gm, arg)
        if viewed is not None:  # self.bias.view(1, -1, 1, 1), self.scale[None, :, None, None]
            target, nodes = viewed
            value = fetch(self.gm, target)
            if per_channel_form(_shape(arg) or (), self.shape_in or (), self.channels) is not None:
                return ParamRef(target, tuple(int(s) for s in value.shape), tuple(n.name for n in nodes))
        shape = _shape(arg)
        derived = self._derived(arg, shape)
        if derived is not None:
            return derived
        before = _available(self.gm, arg, self.producer)
        if shape is not None and shape == self.shape_in and before:
            return InputRef(arg.name, str(arg.target) if arg.op == "placeholder" else arg.name)
        kind = broadcast.kind_of_shape(shape, self.shape_in) if shape is not None and self.shape_in else None
        argument = _viewed_argument(arg)
        if kind not in (None, broadcast.FULL) and (before or argument is not None) and not _depends_on(
                arg, self.producer, through_shapes=False):
            # temb[:, :, None, None], t.view(N, C, 1, 1), a forward argument of shape (N, C, 1, 1) or (1, C, 1, 1),
            # a diffusion block's self.temb_proj(F.silu(temb))[:, :, None, None] (computed after the convolution
            # from no convolution after it: the fused call comes after the chain, where it is computed)
            return InputRef(arg.name, str(argument.target) if argument is not None else arg.name, kind)
        if shape is None and arg.op == "placeholder":
            return (f"the other operand ({arg.name}) is an argument of forward that is not a tensor of the example "
                    "inputs (a number given at each call): not a constant of the chain")
        what = (f"of shape {list(shape)}, not the chain value's {list(self.shape_in or ())}" if shape is not None
                else "of unknown shape")
        if shape is not None and shape == self.shape_in:
            # computed from a convolution after this one: another chain's value, which that chain's walk may take
            # with this one's as its input (a residual's main path takes the shortcut's, computed before its
            # convolution)
            what = ("computed from the convolution's output" if _depends_on(arg, self.producer, through_shapes=False)
                    else "computed after the convolution, from a later convolution")
        return (f"the other operand ({arg.name}) is a tensor of the forward {what}: not a number, the "
                "convolution's output, a per-channel parameter or an extra input of the chain's shape")


    def _derived(self, arg: torch.fx.Node, shape: Shape | None) -> DerivedRef | None:
        """The operand as a DerivedRef where the forward computes it from the model's tensors alone and it is one
        value per channel or a single value against the chain's value; else None."""
        if shape is None or _dtype(arg) is None or not _dtype(arg).is_floating_point:
            return None
        form = per_channel_form(shape, self.shape_in or (), self.channels)
        if form is None:
            return None
        declared = () if form == "scalar" else (self.channels,) + (1,) * self.spatial_dims
        found = derivation(self.gm, arg, declared, lambda n: _user_tensor(self.gm, n))
        if found is None:
            return None
        how, calls = found
        return DerivedRef(f"derived_{arg.name}", arg.name, how, tuple(n.name for n in calls))


Builder = Callable[[Site], "Mapped | str"]

#: Functions that make a one-value tensor of a number in the forward (``torch.tensor(c, device=x.device)``):
#: where the number is a constant and every other argument reads only the chain value's metadata, the
#: operand is that number (its value as the tensor holds it: ``dtype`` rounds it).
_CONSTANT_TENSOR_FUNCTIONS = (torch.tensor, torch.as_tensor, torch.scalar_tensor)
#: Their keyword arguments that do not change the value (dtype is applied to it).
_CONSTANT_TENSOR_KWARGS = ("device", "dtype", "requires_grad", "pin_memory", "layout")


def _constant_tensor(site: Site, node: Any) -> float | None:
    """The number a forward-made one-value tensor holds (torch.tensor(c, device=x.device, dtype=...), or a
    trace constant moved with ``.to(x.device)``), where it reads nothing but the chain value's metadata; else
    None. Its nodes join the chain (``_constant_tensor_nodes``), so no read of the chain's value leaves it."""
    nodes = _constant_tensor_nodes(site, node)
    if nodes is None:
        return None
    value = _evaluate_constant(site, node)
    return float(value) if value is not None and math.isfinite(value) else None


def _constant_tensor_nodes(site: Site, node: Any) -> list[torch.fx.Node] | None:
    """The nodes of a forward-made one-value tensor (the constructor and any ``.to``), or None where ``node``
    is not one: a number, the chain value's metadata (x.device, x.dtype) and trace constants are its only inputs."""
    if not isinstance(node, torch.fx.Node):
        return None
    out: list[torch.fx.Node] = []
    while node.op == "call_method" and node.target == "to" and node.args:
        out.append(node)
        node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            return None
    if node.op == "get_attr" and out:
        if not _constant(site.gm, node):
            return None
    elif node.op == "call_function" and node.target in _CONSTANT_TENSOR_FUNCTIONS:
        data = node.args[0] if node.args else node.kwargs.get("data", node.kwargs.get("s"))
        if isinstance(data, (list, tuple)) and len(data) == 1:  # torch.tensor([c]): one value, shape (1,)
            data = data[0]
        if isinstance(data, bool) or not isinstance(data, (int, float)) or len(node.args) > 1 or (
                node.kwargs.keys() - {"data", "s", *_CONSTANT_TENSOR_KWARGS}):
            return None
        out.append(node)
    else:
        return None
    for part in out:
        for arg in part.all_input_nodes:
            if arg in out or (arg.op == "get_attr" and _constant(site.gm, arg)):
                continue
            if not (_is_shape_read(arg) and arg.args and site.is_x(arg.args[0])):
                return None
    if any(len(part.users) != 1 for part in out):
        return None
    return out


def _evaluate_constant(site: Site, node: torch.fx.Node) -> float | None:
    """Run the constant's nodes on the CPU, the chain value's metadata as the trace recorded it (float32)."""
    env: dict[torch.fx.Node, Any] = {}

    def value(arg: Any) -> Any:
        if not isinstance(arg, torch.fx.Node):
            return arg
        if arg in env:
            return env[arg]
        if arg.op == "get_attr":
            return fetch(site.gm, arg.target)
        attribute = arg.args[1] if arg.target is getattr else None
        if attribute == "device":
            return torch.device("cpu")
        if attribute == "dtype":
            meta = arg.args[0].meta.get("tensor_meta")
            return getattr(meta, "dtype", torch.float32)
        raise Stop(f"{arg.name} is not a constant")
    try:
        for part in reversed(_constant_tensor_nodes(site, node) or []):
            args = torch.fx.node.map_aggregate(part.args, value)
            kwargs = torch.fx.node.map_aggregate(part.kwargs, value)
            if part.op == "call_method":
                env[part] = getattr(args[0], part.target)(*args[1:], **kwargs)
            else:
                env[part] = part.target(*args, **kwargs)
        result = env.get(node)
    except Exception:  # noqa: BLE001 - a constant that does not evaluate is no number
        return None
    if not isinstance(result, torch.Tensor) or result.numel() != 1 or result.dtype == torch.bool or result.is_complex():
        return None
    return float(result.item())


def shape_number(site: Site, node: Any) -> float | None:
    """The number a size read off the chain's values computes (``x.sum(2) / x.shape[-1]``, ``/ (h * w)`` with ``h, w
    = x.shape[2:]``, ``x.size(1)``), at the traced shape; None where ``node`` is not one or reads the shape of a
    tensor that is not the chain's (the model's input, another branch). Its nodes read a value of the chain and so
    go with it (``_metadata_closure``); the fused kernels run at the traced shapes alone, any other shape runs the
    chain's own ops, which read the size again."""
    if not isinstance(node, torch.fx.Node) or node.op == "placeholder" or _shape(node) is not None:
        return None
    if not (_is_shape_read(node) or (node.op == "call_function" and node.target in _METADATA_FUNCTIONS)):
        return None
    try:
        result = _size_value(site, node)
    except (Stop, IndexError, TypeError, ValueError, ZeroDivisionError):
        return None
    return float(result) if isinstance(result, (int, float)) and not isinstance(result, bool) else None


def _size_value(site: Site, arg: Any) -> Any:
    """What ``arg`` computes from sizes read off the chain's values and numbers, at the traced shape: a number or a
    tuple of them (``x.shape[1:]``, F.layer_norm's normalized_shape); raises Stop where it reads anything else."""
    if not isinstance(arg, torch.fx.Node):
        if isinstance(arg, (tuple, list)):
            return type(arg)(_size_value(site, a) for a in arg)
        return arg
    if _is_shape_read(arg):
        source = arg.args[0]
        if not (site.is_x(source) or (isinstance(source, torch.fx.Node) and source not in site.producer
                                      and _depends_on(source, site.producer))):
            raise Stop(f"{arg.name} reads the shape of {getattr(source, 'name', source)}, not a chain value")
        shape = _shape(source)
        if shape is None:
            raise Stop(f"{arg.name}: the shape of {source.name} was not traced")
        if arg.op == "call_method" and arg.target == "dim" or arg.op == "call_function" and arg.args[1] == "ndim":
            return len(shape)
        if arg.op == "call_function" and arg.args[1] != "shape":
            raise Stop(f"{arg.name} reads {arg.args[1]}, not a size")
        dims = [_size_value(site, a) for a in arg.args[1:]] if arg.op == "call_method" else []
        return shape[dims[0]] if dims else tuple(shape)
    if arg.op == "call_function" and arg.target in _METADATA_FUNCTIONS:
        return arg.target(*(_size_value(site, a) for a in arg.args))
    raise Stop(f"{arg.name} is not computed from sizes alone")




class Stop(Exception):
    """Raised inside a builder: the chain stops before this op, for this reason."""


def _call_args(site: Site) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return tuple(site.node.args), dict(site.node.kwargs)


def bind_all(node: torch.fx.Node, names: Sequence[str], defaults: Mapping[str, Any]) -> dict[str, Any] | str:
    """Positional and keyword arguments by name (the first is the input), defaults filled in."""
    args, kwargs = tuple(node.args), dict(node.kwargs)
    if len(args) > len(names):
        return f"called with {len(args)} positional arguments"
    out = dict(defaults)
    out.update(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            return f"argument {key}= is not in the vocabulary"
        out[key] = value
    missing = [n for n in names if n not in out]
    if missing:
        return f"missing argument {missing[0]}"
    return out


def bind_op(site: Site, names: Sequence[str], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``bind_all`` for the op at ``site``: its input must be the chain's value, its other arguments
    Python values (not computed in the forward)."""
    bound = bind_all(site.node, ["input", *names], defaults)
    if isinstance(bound, str):
        raise Stop(bound)
    if not site.is_x(bound["input"]):
        raise Stop("it reads the chain's value as an argument other than its input")
    for key in names:
        if has_node(bound[key]):
            raise Stop(f"its argument {key} is computed in the forward")
    return bound


def module_input(site: Site) -> None:
    if not site.is_x(_module_argument(site.node)):
        raise Stop("the module is called with more than the chain's value")


def _as_list(window: int | list[int], dims: int) -> list[int]:
    """A pool's window argument (one int for every dim, or one a dim) as one int a dim."""
    return list(window) if isinstance(window, list) else [int(window)] * dims


def _ignore(value: Any, key: str, default: Any) -> None:
    if value != default:
        raise Stop(f"{key}={value!r} is not in the vocabulary")


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Stop(f"a non-number argument {value!r}")
    return float(value)


def _dims(value: Any) -> int | list[int]:
    if isinstance(value, (tuple, list)):
        if not value:
            raise Stop("it reduces every dim, the batch dim included")
        return [int(v) for v in value] if len(value) > 1 else int(value[0])
    if value is None:
        raise Stop("it reduces every dim, the batch dim included (no dim given)")
    return int(value)


def _one(site: Site, *entries: Entry, out: torch.fx.Node | None = None, module: str | None = None) -> Mapped:
    return Mapped(entries=list(entries), out=out or site.node, module=module)


def _channel_import():
    """fusetune/channel_import.py: the norms over the channels' patterns (it imports this package's helpers)."""
    from fusetune import channel_import

    return channel_import


def _slice_import():
    """fusetune/slice_import.py: the slice op's forms (it imports this package's helpers)."""
    from fusetune import slice_import

    return slice_import


def _gate_import():
    """fusetune/gate_import.py: the gated activations' patterns (it imports this package's helpers)."""
    from fusetune import gate_import

    return gate_import
