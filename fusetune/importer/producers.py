"""Producers: the convolution a chain starts at (ProducerMatch), a Conv/ConvTranspose module or ``F.conv*d`` on the
model's tensors, as the config's producer entry and its weights' names. A weight the model computes at every call
(weight norm, pruning, a parametrization, ``F.conv2d(x, self.weight * self.mask)``) is a derivation
(fusetune/computed_weights.py); a transposed convolution called with an output size holds at the traced shapes alone. A
pad that only an unpadded convolution reads is that convolution's padding and padding_mode (_fold_pad); an uneven zero
pad is taken evenly, the chain starting with the crop that makes it exact.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.computed_weights import (hook_derivations, owners_refusal, parametrization_refusal,
                                       parametrized_convolution)
from fusetune.derived import Derivation, derivation, written_in_place
from fusetune.importer.graph import (_CONV_FUNCTIONS, _CONV_MODULES, Entry, _dtype, _hooked, _is_convolution,
                                     _module_argument, _shape, _user_tensor, fetch, has_node)
from fusetune.importer.matching import bind_all
from fusetune.producers import KINDS


@dataclasses.dataclass(frozen=True)
class ProducerMatch:
    entry: Entry  # the config's producer
    weights: dict[str, str]  # generated Model's state key -> the user's name
    input: torch.fx.Node
    before: tuple[torch.fx.Node, ...] = ()  # nodes between the input and the convolution it takes (a pad: _fold_pad)
    #: The convolution's tensors the model computes at every call (weight norm, a pruning mask, a parametrization,
    #: F.conv2d(x, self.weight * self.mask)): generated Model's state key -> how (fusetune/computed_weights.py)
    derived: dict[str, Derivation] = dataclasses.field(default_factory=dict)
    #: The trace's nodes computing them that nothing but the convolution reads (the chain's; the others stay the
    #: model's, and the chain computes its weight again from the model's tensors)
    computes: tuple[torch.fx.Node, ...] = ()
    #: Why its config holds at the traced input shapes alone (a transposed convolution's output_padding, from the
    #: output size the forward asked there), None where it holds at any
    at_example: str | None = None
    #: The slices the chain starts with where the convolution takes an uneven pad evenly (a causal convolution's
    #: F.pad(x, (k - 1, 0)): padding k - 1 on both sides, the last k - 1 outputs cropped; _fold_pad)
    crop: tuple[Entry, ...] = ()


def _window(values: Any, dims: int) -> Any:
    values = tuple(values) if isinstance(values, (tuple, list)) else (values,) * dims
    return int(values[0]) if len(set(values)) == 1 else [int(v) for v in values]


def match_producer(gm: torch.fx.GraphModule, node: torch.fx.Node) -> ProducerMatch | str | None:
    """The producer a node is, None where it is no convolution, a reason where it is one fusetune cannot take."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        kind = next((op for cls, op in _CONV_MODULES.items() if type(module) is cls), None)
        if kind is None:
            return parametrization_refusal(module) if parametrized_convolution(module, _CONV_MODULES) else None
        derived = hook_derivations(module, str(node.target)) or {}  # weight norm, pruning: known pre-hooks
        hooked = _hooked(module) if not derived else None
        if hooked is not None:
            return hooked
        dims = KINDS[kind].spatial_dims
        source, output_padding = _module_argument(node), module.output_padding if KINDS[kind].transposed else 0
        at_example = None
        if source is None and KINDS[kind].transposed:  # self.up(x, output_size=skip.size()): at the traced shapes
            sized = _output_size_padding(node, module, dims)
            if isinstance(sized, str):
                return sized
            source, output_padding = sized
            at_example = (f"{type(module).__name__} ({node.target}) is called with an output size, whose output_padding "
                          "is the traced shapes'")
        if source is None:
            return f"{type(module).__name__} is called with more than its input"
        entry: Entry = {"op": kind, "in_channels": module.in_channels, "out_channels": module.out_channels,
                        "kernel_size": _window(module.kernel_size, dims)}
        _conv_options(entry, dims, module.stride, module.padding, module.dilation, module.groups,
                      output_padding, module.bias is not None)
        if module.padding_mode != "zeros":  # reflect, replicate, circular: the config takes it as nn.Conv*d does
            entry["padding_mode"] = module.padding_mode
        weights = {"producer.weight": f"{node.target}.weight"}
        if module.bias is not None:
            weights["producer.bias"] = f"{node.target}.bias"
        weights = {k: v for k, v in weights.items() if k not in derived}
        return _fold_pad(gm, ProducerMatch(entry, weights, source, derived=derived, at_example=at_example))
    if node.op == "call_function" and node.target in _CONV_FUNCTIONS:
        kind = _CONV_FUNCTIONS[node.target]
        transposed, dims = KINDS[kind].transposed, KINDS[kind].spatial_dims
        names = (["input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"] if transposed
                 else ["input", "weight", "bias", "stride", "padding", "dilation", "groups"])
        args = bind_all(node, names, {"bias": None, "stride": 1, "padding": 0, "output_padding": 0, "groups": 1,
                                       "dilation": 1})
        if isinstance(args, str):
            return args
        weight, bias = args["weight"], args["bias"]
        for key in ("stride", "padding", "output_padding", "groups", "dilation"):
            if has_node(args[key]):
                return f"F.{kind}'s {key} is computed in the forward"
        weights: dict[str, str] = {}
        derived: dict[str, Derivation] = {}
        calls: list[torch.fx.Node] = []
        for name, tensor in (("weight", weight), ("bias", bias)):
            if tensor is None:
                continue
            if isinstance(tensor, torch.fx.Node) and tensor.op == "get_attr":
                weights[f"producer.{name}"] = str(tensor.target)
                continue
            refused = owners_refusal(gm, _attributes_read(tensor))  # torch.export traces through spectral_norm's
            if refused is not None:
                return refused
            found = _computed_tensor(gm, tensor)
            if found is None:
                written = sorted(set(_attributes_read(tensor)) & written_in_place(gm))
                if written:
                    return (f"F.{kind}'s {name} is computed in the forward from {', '.join(written)}, which the "
                            "forward writes in place (a fused call would compute it from the written values)")
                return (f"F.{kind}'s {name} is computed in the forward from more than the model's tensors (an input, "
                        "a module call, an in-place or random op), not a module's parameter nor a derivation of them")
            derived[f"producer.{name}"], nodes = found
            calls += nodes
        shape = fetch(gm, weight.target).shape if "producer.weight" in weights else derived["producer.weight"].shape
        groups = int(args["groups"])
        cin, cout = (shape[0], shape[1] * groups) if transposed else (shape[1] * groups, shape[0])
        if "producer.bias" in derived and derived["producer.bias"].shape != (cout,):
            return f"F.{kind}'s bias is computed of shape {list(derived['producer.bias'].shape)}, not ({cout},)"
        entry = {"op": kind, "in_channels": int(cin), "out_channels": int(cout),
                 "kernel_size": _window(tuple(shape[2:]), dims)}
        _conv_options(entry, dims, args["stride"], args["padding"], args["dilation"], groups,
                      args["output_padding"], bias is not None)
        return _fold_pad(gm, ProducerMatch(entry, weights, args["input"], derived=derived,
                                           computes=_read_by_alone(gm, node, calls)))
    return None


def _computed_tensor(gm: torch.fx.GraphModule, node: Any) -> tuple[Derivation, list[torch.fx.Node]] | None:
    """A convolution's weight or bias the forward computes from the model's tensors alone (a parametrization's
    traced subgraph, ``self.weight * self.mask``), as a derivation of its own shape and its call nodes; None where
    it is computed otherwise (fusetune/derived.py's rules) or of unknown shape."""
    shape, dtype = _shape(node), _dtype(node)
    if not isinstance(node, torch.fx.Node) or shape is None or dtype is None or not dtype.is_floating_point:
        return None
    return derivation(gm, node, shape, lambda n: _user_tensor(gm, n))


def _attributes_read(node: Any) -> tuple[str, ...]:
    """The targets of the get_attr nodes ``node``'s value is computed from (through any path of the graph)."""
    seen: set[torch.fx.Node] = set()
    todo = [node] if isinstance(node, torch.fx.Node) else []
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(current.all_input_nodes)
    return tuple(sorted(str(n.target) for n in seen if n.op == "get_attr"))


def _read_by_alone(gm: torch.fx.GraphModule, reader: torch.fx.Node,
                   nodes: Sequence[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
    """Those of ``nodes`` whose value nothing reads but ``reader`` and the others kept (the chain's, cut out with
    it), in graph order; the rest stay the model's."""
    kept = set(nodes)
    changed = True
    while changed:
        changed = False
        for n in list(kept):
            if any(user is not reader and user not in kept for user in n.users):
                kept.discard(n)
                changed = True
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return tuple(sorted(kept, key=order.__getitem__))


#: Padding modules -> the padding_mode of a convolution that pads alike (a ConstantPad only with the value 0).
_PAD_MODULES: dict[type, str] = {
    **{getattr(nn, f"ReflectionPad{d}d"): "reflect" for d in (1, 2, 3)},
    **{getattr(nn, f"ReplicationPad{d}d"): "replicate" for d in (1, 2, 3)},
    **{getattr(nn, f"CircularPad{d}d"): "circular" for d in (1, 2, 3) if hasattr(nn, f"CircularPad{d}d")},
    **{getattr(nn, f"ZeroPad{d}d"): "zeros" for d in (1, 2, 3) if hasattr(nn, f"ZeroPad{d}d")},
    **{getattr(nn, f"ConstantPad{d}d"): "zeros" for d in (1, 2, 3)},
}
#: F.pad's modes -> the padding_mode (mode="constant" only with the value 0).
_PAD_MODES = {"constant": "zeros", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}


def _fold_pad(gm: torch.fx.GraphModule, match: ProducerMatch) -> ProducerMatch:
    """An unpadded convolution whose input is a pad read by it alone (CycleGAN's and fast style transfer's
    ``nn.ReflectionPad2d(p)`` then ``nn.Conv2d(..., padding=0)``, F.pad(x, pads, mode)) is the convolution with
    that padding and padding_mode, on the pad's input: nn.Conv2d(padding_mode="reflect") pads with F.pad alike.
    The pad joins the chain; where it pads unevenly, pads the batch or the channels, or with a value other than 0,
    the match is left as it is (the pad stays in PyTorch)."""
    entry, pad = match.entry, match.input
    dims = KINDS[entry["op"]].spatial_dims
    if (KINDS[entry["op"]].transposed or entry.get("padding", 0) not in (0, "valid") or "padding_mode" in entry
            or not isinstance(pad, torch.fx.Node) or len(pad.users) != 1):
        return match
    found = _pad_of(gm, pad)
    if found is None:
        return match
    source, pads, mode = found
    if len(pads) % 2 or len(pads) > 2 * dims or any(p < 0 for p in pads):
        return match
    pairs = [(0, 0)] * (dims - len(pads) // 2) + [(int(pads[i]), int(pads[i + 1])) for i in range(len(pads) - 2, -1, -2)]
    stride = entry.get("stride", 1)
    crop = _crop(pairs, list(stride) if isinstance(stride, (list, tuple)) else [int(stride)] * dims, mode)
    if crop is None:
        return match
    per_dim = [max(pair) for pair in pairs]
    folded = {k: v for k, v in entry.items() if k != "padding"}
    window = _window(per_dim, dims)
    if window != 0:
        folded["padding"] = window
    if mode != "zeros":
        folded["padding_mode"] = mode
    return dataclasses.replace(match, entry=folded, input=source, before=(pad, *match.before), crop=crop)


def _crop(pairs: Sequence[tuple[int, int]], stride: Sequence[int], mode: str) -> tuple[Entry, ...] | None:
    """The slices that make a convolution padded max(left, right) on both sides of each spatial dim compute the
    one on the unevenly padded input (F.pad(x, (left, right))): its outputs from the (max - left)-th, less the last
    (max - right); () where every pad is even, None where that is not exact (a stride other than 1 on an uneven
    dim: the windows would not line up; a pad of another mode than zeros)."""
    entries: list[Entry] = []
    for d, (left, right) in enumerate(pairs):
        if left == right:
            continue
        if stride[d] != 1 or mode != "zeros":
            return None
        high = max(left, right)
        entry: Entry = {"op": "slice", "dim": 2 + d}
        if high > left:
            entry["start"] = high - left
        if high > right:
            entry["end"] = right - high
        entries.append(entry)
    return tuple(entries)


#: Why a pad before a convolution stays in PyTorch (a chain's end there, the map's word for the pad).
_PAD_NOT_TAKEN = ("pads a convolution's input, which that convolution does not take as its padding (it takes one of "
                  "the spatial dims read by it alone: an even pad, or an uneven zero pad before a stride-1 convolution)")


def _pads_a_convolution(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether ``node`` is a pad (_pad_of) that a convolution reads."""
    return _pad_of(gm, node) is not None and any(_is_convolution(gm, u) for u in node.users)


def _folded_pad(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether ``node`` is a pad that the convolution reading it takes as its padding (_fold_pad)."""
    if len(node.users) != 1:
        return False
    match = match_producer(gm, next(iter(node.users)))
    return isinstance(match, ProducerMatch) and node in match.before


def _pad_of(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...], str] | None:
    """(the padded tensor, F.pad's pads, the padding_mode) of a pad module or F.pad call without hooks, padding
    with zeros where it pads a constant; None for anything else."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        mode = _PAD_MODULES.get(type(module))
        source = _module_argument(node)
        if mode is None or source is None or _hooked(module) is not None or float(getattr(module, "value", 0)) != 0:
            return None
        return source, tuple(module.padding), mode
    if node.op == "call_function" and node.target is F.pad:
        a = bind_all(node, ["input", "pad", "mode", "value"], {"mode": "constant", "value": None})
        if isinstance(a, str) or has_node(a["pad"]) or a["mode"] not in _PAD_MODES or a["value"] not in (None, 0, 0.0):
            return None
        if not all(isinstance(p, int) for p in a["pad"]):
            return None
        return a["input"], tuple(a["pad"]), _PAD_MODES[a["mode"]]
    return None


def _output_size_padding(node: torch.fx.Node, module: nn.Module, dims: int) -> tuple[Any, tuple[int, ...]] | str:
    """A transposed convolution called with its output size (``self.up(x, output_size=skip.size())``, U-Net's
    decoders): its input, and the output_padding that size is at the traced shapes, as PyTorch derives it
    (the size less the smallest output, below the stride or the dilation); a reason where it is not that call.
    The fused chain runs its kernels at the tuned input shapes alone, where the forward asks the same size."""
    args, kwargs = list(node.args), dict(node.kwargs)
    source = kwargs.pop("input", args.pop(0) if args else None)
    size = kwargs.pop("output_size", args.pop(0) if args else None)
    if source is None or size is None or args or kwargs:
        return f"{type(module).__name__} is called with more than its input and output_size"
    shape_in, shape_out = _shape(source), _shape(node)
    if shape_in is None or shape_out is None:
        return f"{type(module).__name__}'s output_size: its input or output shape was not traced"
    padding = []
    for d in range(dims):
        smallest = ((shape_in[2 + d] - 1) * module.stride[d] - 2 * module.padding[d]
                    + module.dilation[d] * (module.kernel_size[d] - 1) + 1)
        extra = shape_out[2 + d] - smallest
        if not 0 <= extra < max(module.stride[d], module.dilation[d]):
            return f"{type(module).__name__}'s output_size gives output_padding {extra} on dim {2 + d}"
        padding.append(extra)
    return source, tuple(padding)


def _conv_options(entry: Entry, dims: int, stride: Any, padding: Any, dilation: Any, groups: int,
                  output_padding: Any, bias: bool) -> None:
    """The producer's arguments beside the defaults: left out where PyTorch's default."""
    for key, value, default in (("stride", stride, 1), ("dilation", dilation, 1),
                                ("output_padding", output_padding, 0)):
        window = _window(value, dims)
        if window != default:
            entry[key] = window
    pad = padding if isinstance(padding, str) else _window(padding, dims)
    if pad != 0:
        entry["padding"] = pad
    if groups != 1:
        entry["groups"] = int(groups)
    entry["bias"] = bool(bias)
