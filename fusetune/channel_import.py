"""The importer's patterns for the norms over the channels (fusetune/ops/channel.py), in the forms real models
write them after a convolution:

  * ``F.normalize(x, p, dim, eps)``: one call (``normalize``, a row of importer.table.TABLE);
  * a layer norm over the channels, permuted around one over the last dim: ``x.permute(0, 2, 3, 1)`` ->
    ``nn.LayerNorm(C)`` or ``F.layer_norm(x, (C,), w, b, eps)`` -> ``.permute(0, 3, 1, 2)`` (1-D to 3-D), which
    timm's and torchvision's ``LayerNorm2d`` (nn.LayerNorm subclasses, traced through) compute too;
  * ConvNeXt's by hand: ``u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True); x = (x - u) /
    torch.sqrt(s + eps); x = w[:, None, None] * x + b[:, None, None]`` (the affine optional);
  * a patch embedding's layer norm over the channels of tokens: ``x.flatten(2).transpose(1, 2)`` (ViT, PVT,
    SegFormer) or ``x.permute(0, 2, 3, 1)`` left channels-last (Swin) -> LayerNorm(C): norm_tokens_last, run on the
    trace, computes it before the views (the permuted form above, the model's views after it).

Each matcher takes the subgraph exactly (the biased variance, eps inside the square root, the permutes' dims, a
normalized_shape of the channels alone); a near miss (``x.var(1)``, ``sqrt(s) + eps``, a mean over other dims)
matches nothing, and the chain stops there as before, rather than become an op that computes something else.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.importer import (Mapped, ParamRef, Site, Stop, _is_shape_read, _shape, bind_all, bind_op, fetch,
                                has_node, reduction)
from fusetune.importer.graph import _call_input

#: The config keys of a layer norm over the channels that name parameters (importer.chain_config declares them).
PARAM_KEYS = ("weight", "bias")

_PERMUTES = (("call_method", "permute"), ("call_function", torch.permute))
_MEANS = (("call_function", torch.mean), ("call_method", "mean"))
_SUBS = (("call_function", operator.sub), ("call_function", torch.sub), ("call_method", "sub"))
_ADDS = (("call_function", operator.add), ("call_function", torch.add), ("call_method", "add"))
_MULS = (("call_function", operator.mul), ("call_function", torch.mul), ("call_method", "mul"))
_DIVS = (("call_function", operator.truediv), ("call_function", torch.div), ("call_method", "div"))
_SQRTS = (("call_function", torch.sqrt), ("call_method", "sqrt"))
_RSQRTS = (("call_function", torch.rsqrt), ("call_method", "rsqrt"))
_POWS = (("call_function", operator.pow), ("call_function", torch.pow), ("call_method", "pow"))
_SQUARES = (("call_function", torch.square), ("call_method", "square"))


def normalize(site: Site) -> Mapped:
    """F.normalize(x, p=2.0, dim=1, eps=1e-12): the config's normalize (the kernels take p = 2 over dim 1)."""
    a = bind_op(site, ["p", "dim", "eps", "out"], {"p": 2.0, "dim": 1, "eps": 1e-12, "out": None})
    if a["out"] is not None:
        raise Stop("F.normalize(out=...) is not in the vocabulary")
    if isinstance(a["p"], bool) or not isinstance(a["p"], (int, float)) or not 0 < a["p"] < math.inf:
        raise Stop(f"F.normalize with p={a['p']!r}: the vocabulary takes a positive finite p")
    return Mapped([{"op": "normalize", "p": float(a["p"]), "dim": int(a["dim"]), "eps": float(a["eps"])}], site.node)


def _is(node: Any, targets: Sequence[tuple[str, Any]]) -> bool:
    return isinstance(node, torch.fx.Node) and (node.op, node.target) in targets


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def match_channel_norm(site: Site, readers: Sequence[torch.fx.Node]
                       ) -> tuple[list[torch.fx.Node], dict[str, Any], torch.fx.Node] | None:
    """A layer norm over the channels where ``readers`` (every reader of the chain's value) are its first nodes:
    (the nodes it covers, in graph order; the config's entry, its weight and bias ParamRefs; the node holding its
    output), or None."""
    found = _permuted(site, readers) or _by_hand(site, readers)
    if found is None:
        return None
    nodes, entry, out = found
    order = {n: i for i, n in enumerate(site.gm.graph.nodes)}
    return sorted(set(nodes), key=order.__getitem__), entry, out


def _rank(site: Site) -> int | None:
    shape = site.shape_in
    return len(shape) if shape is not None and 3 <= len(shape) <= 5 and shape[1] == site.channels else None


def _permute_dims(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The dims of ``x.permute(0, 2, 3, 1)``, ``x.permute((0, 2, 3, 1))`` or ``torch.permute(x, (0, 2, 3, 1))``."""
    args = list(node.args[1:]) + ([node.kwargs["dims"]] if "dims" in node.kwargs else [])
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = list(args[0])
    if not args or any(isinstance(a, bool) or not isinstance(a, int) for a in args):
        return None
    return tuple(args)


def _permuted(site: Site, readers: Sequence[torch.fx.Node]):
    """x.permute(0, 2, ..., 1) -> nn.LayerNorm(C) or F.layer_norm over (C,) -> .permute(0, r - 1, 1, ..., r - 2)."""
    rank = _rank(site)
    if rank is None or len(readers) != 1 or not _is(readers[0], _PERMUTES) or not site.is_x(readers[0].args[0]):
        return None
    first = readers[0]
    last_dim = lambda d: d % rank  # noqa: E731 - dims as PyTorch normalises them
    if tuple(map(last_dim, _permute_dims(first) or ())) != (0, *range(2, rank), 1):
        return None
    norm = _only_user(first)
    if norm is None:
        return None
    found = _layer_norm_call(site, norm, first)
    if found is None:
        return None
    entry = found
    back = _only_user(norm)
    if back is None or not _is(back, _PERMUTES) or back.args[0] is not norm:
        return None
    if tuple(map(last_dim, _permute_dims(back) or ())) != (0, rank - 1, *range(1, rank - 1)):
        return None
    return [first, norm, back], entry, back


def _layer_norm_call(site: Site, node: torch.fx.Node, value: torch.fx.Node) -> dict[str, Any] | None:
    """The entry of nn.LayerNorm(C) or F.layer_norm(value, (C,), weight, bias, eps) at ``node``, over the
    channels alone (normalized_shape exactly (C,)); None for any other call or shape."""
    channels = site.channels
    found = _layer_norm_over(site.gm, node, value, channels)
    if found is None:
        return None
    if isinstance(found, nn.LayerNorm):
        target = str(node.target)
        weight = ParamRef(f"{target}.weight", (channels,)) if found.weight is not None else None
        bias = ParamRef(f"{target}.bias", (channels,)) if found.bias is not None else None
        return _entry(weight, bias, float(found.eps))
    a = found
    if has_node(a["eps"]):
        return None
    refs = []
    for key in PARAM_KEYS:
        arg = a[key]
        if arg is None:
            refs.append(None)
            continue
        tensor = fetch(site.gm, arg.target) if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" else None
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tuple(tensor.shape) != (channels,):
            return None
        refs.append(ParamRef(str(arg.target), (channels,)))
    eps = _number(a["eps"])
    return _entry(refs[0], refs[1], eps) if eps is not None and eps > 0 else None


def _entry(weight: ParamRef | None, bias: ParamRef | None, eps: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"op": "channel_layer_norm"}
    if weight is not None:
        entry["weight"] = weight
    if bias is not None:
        entry["bias"] = bias
    entry["eps"] = eps
    return entry


def _over_channels(site: Site, mean: torch.fx.Node, of: torch.fx.Node) -> bool:
    """``of.mean(1, keepdim=True)`` (or dim -rank, (1,), [1]; torch.mean alike), of the chain's shape."""
    if not _is(mean, _MEANS) or _call_input(mean) is not of:
        return False
    try:
        (entry,) = reduction("mean")(_at(site, mean, of)).entries
    except (Stop, TypeError, ValueError):
        return False
    rank = len(site.shape_in)
    dims = entry["dim"] if isinstance(entry["dim"], list) else [entry["dim"]]
    return entry["keepdim"] is True and [d % rank for d in dims] == [1]


def _at(site: Site, node: torch.fx.Node, value: torch.fx.Node) -> Site:
    return Site(site.gm, node, {value}, site.producer, site.channels, site.spatial_dims)


def _binary(node: torch.fx.Node, targets: Sequence[tuple[str, Any]]) -> tuple[Any, Any] | None:
    """(a, b) of ``a op b`` without alpha or other keywords."""
    if not _is(node, targets) or len(node.args) != 2 or node.kwargs:
        return None
    return node.args[0], node.args[1]


def _squared(node: torch.fx.Node, d: torch.fx.Node) -> bool:
    """``d.pow(2)``, ``d ** 2``, ``torch.square(d)`` or ``d * d``."""
    if _is(node, _SQUARES) and len(node.args) == 1 and not node.kwargs:
        return node.args[0] is d
    pair = _binary(node, _POWS)
    if pair is not None:
        return pair[0] is d and _number(pair[1]) == 2.0
    pair = _binary(node, _MULS)
    return pair is not None and pair[0] is d and pair[1] is d


def _by_hand(site: Site, readers: Sequence[torch.fx.Node]):
    """ConvNeXt's LayerNorm2d written out (module docstring); the difference x - u computed once or twice."""
    rank = _rank(site)
    if rank is None or len(readers) not in (2, 3):
        return None
    means = [r for r in readers if site.is_x(_call_input(r)) and _over_channels(site, r, _call_input(r))]
    if len(means) != 1:
        return None
    u = means[0]
    subs = [r for r in readers if r is not u]
    if sorted(map(id, u.users)) != sorted(map(id, subs)):
        return None
    for sub in subs:
        pair = _binary(sub, _SUBS)
        if pair is None or not site.is_x(pair[0]) or pair[1] is not u:
            return None
    # the variance: (x - u) squared, its mean over the channels; the normalised value: (x - u) over its root
    for var_sub in subs:
        users = list(var_sub.users)
        squares = [n for n in users if _squared(n, var_sub)]
        if len(squares) != 1:
            continue
        square = squares[0]
        s = _only_user(square)
        if s is None or not _over_channels(site, s, square):
            continue
        plus = _only_user(s)
        pair = _binary(plus, _ADDS) if plus is not None else None
        if pair is None:
            return None
        eps = _number(pair[1]) if pair[0] is s else _number(pair[0]) if pair[1] is s else None
        if eps is None or eps <= 0:
            return None
        root = _only_user(plus)
        if root is None:
            return None
        others = [n for n in subs if n is not var_sub] or [var_sub]
        out = _normalised(root, plus, others[0])
        if out is None:
            return None
        expected = {square} | ({out} if others[0] is var_sub else set())
        if set(var_sub.users) != expected or (others[0] is not var_sub and list(others[0].users) != [out]):
            return None
        nodes = [u, *subs, square, s, plus, root, out]
        weight, bias, last, views = _affine(site, out)
        return nodes + views, _entry(weight, bias, eps), last
    return None


def _normalised(root: torch.fx.Node, plus: torch.fx.Node, d: torch.fx.Node) -> torch.fx.Node | None:
    """``d / torch.sqrt(plus)`` or ``d * torch.rsqrt(plus)``: the node, else None."""
    if len(root.args) != 1 or root.kwargs or root.args[0] is not plus:
        return None
    out = _only_user(root)
    if out is None:
        return None
    if _is(root, _SQRTS):
        pair = _binary(out, _DIVS)
        return out if pair == (d, root) else None
    if _is(root, _RSQRTS):
        pair = _binary(out, _MULS)
        return out if pair in ((d, root), (root, d)) else None
    return None


def _affine(site: Site, value: torch.fx.Node):
    """``w * value + b`` (either order of each; b or both absent) with per-channel tensors of the model of C
    values (``w[:, None, None]``, ``w.view(1, -1, 1, 1)``): (weight, bias, the output node, the nodes it covers:
    the multiply and add and the parameters' views)."""
    weight = bias = None
    views: list[torch.fx.Node] = []
    names = {n.name: n for n in site.gm.graph.nodes}
    out = value
    for key, targets in (("weight", _MULS), ("bias", _ADDS)):
        user = _only_user(out)
        pair = _binary(user, targets) if user is not None else None
        if pair is None or out not in pair:
            break
        other = pair[1] if pair[0] is out else pair[0]
        ref = _at(site, user, out).operand(other)
        if not isinstance(ref, ParamRef) or math.prod(ref.shape) != site.channels:
            break
        if key == "weight":
            weight = ref
        else:
            bias = ref
        views += [names[v] for v in ref.views] + [user]
        out = user
    return weight, bias, out, views


# -- a layer norm over the channels of tokens --------------------------------------------------------------------
# Patch embeddings (ViT, Swin, PVT, SegFormer) normalise a convolution's output after laying its channels last:
# ``x.flatten(2).transpose(1, 2)`` (tokens [N, H*W, C]) or ``x.permute(0, 2, 3, 1)`` (NHWC), then LayerNorm(C).
# A layer norm over the last dim of such a view is the one over the channels before it, with the view taken after:
# norm_tokens_last rewrites the graph so (its values exactly, each node's shape recorded again), and the chain's walk
# then meets the permuted form above (permute -> LayerNorm(C) -> permute back), the model's own view ops after it.

_FLATTENS = (("call_method", "flatten"), ("call_function", torch.flatten))
_TRANSPOSES = (("call_method", "transpose"), ("call_function", torch.transpose), ("call_method", "swapaxes"),
               ("call_function", torch.swapaxes))
_LAYER_NORMS = (("call_function", F.layer_norm), ("call_function", torch.layer_norm))
#: Readers of the tokens that take any strides and make a new tensor of their own: a fused chain's tokens (a view
#: of its NCHW output) need no copy before them, nor before a view laying the channels back at dim 1 (wav2vec2's
#: transpose back, SegFormer's ``transpose(1, 2).reshape(N, C, H, W)``: then a contiguous one). Any other reader gets
#: ``.contiguous()`` first (a no-op where the chain runs its own ops), as a ``.view()`` after it may need the layout
#: eager's layer norm gave.
_TAKE_ANY_STRIDES = (("call_function", F.linear), ("call_function", torch.matmul), ("call_function", operator.matmul),
                     *_LAYER_NORMS)
_TAKE_ANY_STRIDES_MODULES = (nn.Linear, nn.LayerNorm)

Layout = tuple[tuple[int, ...], ...]  # each dim of a view as the dims of the original value it holds, in order


def _constant_args(node: torch.fx.Node, names: Sequence[str], defaults: dict[str, Any]) -> dict[str, Any] | None:
    a = bind_all(node, ["input", *names], defaults)
    if isinstance(a, str) or has_node([a[k] for k in names]):
        return None
    return a


def _dim(d: Any, rank: int) -> int | None:
    if isinstance(d, bool) or not isinstance(d, int) or not -rank <= d < rank:
        return None
    return d % rank


def _moved(node: torch.fx.Node, layout: Layout) -> Layout | None:
    """The layout after ``node`` (a flatten, transpose or permute reading the value of ``layout``), or None where
    it is none of them, or its arguments are computed or out of range."""
    rank = len(layout)
    if _is(node, _FLATTENS):
        a = _constant_args(node, ["start_dim", "end_dim"], {"start_dim": 0, "end_dim": -1})
        start, end = (_dim(a["start_dim"], rank), _dim(a["end_dim"], rank)) if a else (None, None)
        if start is None or end is None or start > end:
            return None
        return (*layout[:start], tuple(d for group in layout[start:end + 1] for d in group), *layout[end + 1:])
    if _is(node, _TRANSPOSES):
        a = _constant_args(node, ["dim0", "dim1"], {})
        d0, d1 = (_dim(a["dim0"], rank), _dim(a["dim1"], rank)) if a else (None, None)
        if d0 is None or d1 is None:
            return None
        out = list(layout)
        out[d0], out[d1] = layout[d1], layout[d0]
        return tuple(out)
    if _is(node, _PERMUTES):
        dims = [_dim(d, rank) for d in _permute_dims(node) or ()]
        if sorted(d for d in dims if d is not None) != list(range(rank)) or len(dims) != rank:
            return None
        return tuple(layout[d] for d in dims)
    return None


def _tokens_norm(gm: torch.fx.GraphModule, norm: torch.fx.Node
                 ) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """(the value, the views from it to ``norm``'s input) where ``norm`` is a layer norm over the last dim of a view
    of the value that lays its channels (dim 1) last, alone, its batch dim first and its spatial dims between in
    their order (merged or not): ``flatten(2).transpose(1, 2)``, ``permute(0, 2, 3, 1)``; every value between read
    by the next view alone, the value by the first alone (and reads of its shape). None for anything else."""
    views: list[torch.fx.Node] = []
    value = norm.args[0] if norm.args else None
    while isinstance(value, torch.fx.Node) and (_is(value, _FLATTENS) or _is(value, _TRANSPOSES)
                                                 or _is(value, _PERMUTES)) and len(views) < 4:
        if len(value.users) != 1 or not value.args:
            return None
        views.insert(0, value)
        value = value.args[0]
    shape = _shape(value)
    if not views or not isinstance(value, torch.fx.Node) or shape is None:
        return None
    if any(u is not views[0] and not _is_shape_read(u) for u in value.users):  # SegFormer's _, _, H, W = x.shape
        return None
    if not 3 <= len(shape) <= 5:
        return None
    layout = _layout(views, len(shape))
    if layout is None or not _ordered(layout, channel_at=len(layout) - 1, rank=len(shape)):
        return None
    if _layer_norm_over(gm, norm, views[-1], shape[1]) is None:
        return None
    return value, views


def _layout(views: Sequence[torch.fx.Node], rank: int, start: Layout | None = None) -> Layout | None:
    """The layout after ``views`` of a value of ``rank`` dims (from ``start``, else the value's own)."""
    layout: Layout | None = start or tuple((d,) for d in range(rank))
    for view in views:
        layout = _moved(view, layout) if layout is not None else None
    return layout


def _ordered(layout: Layout, channel_at: int, rank: int) -> bool:
    """The batch dim first, the channels (dim 1) alone at ``channel_at`` (1 or the last), the spatial dims in the
    others in their order, merged or not."""
    if len(layout) < 3 or layout[0] != (0,) or layout[channel_at] != (1,):
        return False
    return tuple(d for i, group in enumerate(layout[1:], 1) if i != channel_at for d in group) == tuple(range(2, rank))


def _layer_norm_over(gm: torch.fx.GraphModule, node: torch.fx.Node, value: torch.fx.Node, channels: int
                     ) -> nn.LayerNorm | dict[str, Any] | None:
    """Where ``node`` normalizes ``value`` over (channels,) alone: its nn.LayerNorm module, or F.layer_norm's bound
    arguments (input, normalized_shape, weight, bias, eps); None for any other call or shape."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return module if (type(module) is nn.LayerNorm and len(node.args) == 1 and not node.kwargs
                          and node.args[0] is value and tuple(module.normalized_shape) == (channels,)) else None
    if not _is(node, _LAYER_NORMS):
        return None
    a = bind_all(node, ["input", "normalized_shape", "weight", "bias", "eps"],
                 {"weight": None, "bias": None, "eps": 1e-5})
    if isinstance(a, str) or a["input"] is not value or has_node(a["normalized_shape"]):
        return None
    shape = a["normalized_shape"]
    return a if (list(shape) if isinstance(shape, (tuple, list, torch.Size)) else [shape]) == [channels] else None


def _already_permuted(views: list[torch.fx.Node], norm: torch.fx.Node, rank: int) -> bool:
    """The form the walk takes as it is: one permute(0, 2, .., 1), the norm's one reader its permute back."""
    back = _only_user(norm)
    if len(views) != 1 or not _is(views[0], _PERMUTES) or back is None or not _is(back, _PERMUTES):
        return False
    return tuple(d % rank for d in _permute_dims(back) or ()) == (0, rank - 1, *range(1, rank - 1))


def _takes_any_strides(gm: torch.fx.GraphModule, node: torch.fx.Node, tokens: torch.fx.Node, layout: Layout,
                       rank: int) -> bool:
    """``node`` reading ``tokens`` (of ``layout``) needs no copy of them first (_TAKE_ANY_STRIDES)."""
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)) in _TAKE_ANY_STRIDES_MODULES
    if _is(node, _TRANSPOSES + _PERMUTES) and node.args and node.args[0] is tokens:
        back = _moved(node, layout)
        return back is not None and _ordered(back, channel_at=1, rank=rank)
    return _is(node, _TAKE_ANY_STRIDES)


def norm_tokens_last(gm: torch.fx.GraphModule) -> None:
    """Every layer norm over the channels of a value's tokens (_tokens_norm) computed before the views instead:
    ``value.permute(0, 2, .., 1)`` -> the same norm node -> ``.permute(0, r - 1, 1, .., r - 2)`` -> the model's
    views (Swin's permute kept as a permute of the NCHW value) -> ``.contiguous()`` unless every reader takes any
    strides -> the norm's readers. The same values, and the same layout of the tokens where the chain runs its own
    ops; the node names the user's but for the permutes added. Run on a traced graph with its shapes recorded."""
    changed = False
    for norm in list(gm.graph.nodes):
        if norm.op not in ("call_module", "call_function"):
            continue
        found = _tokens_norm(gm, norm)
        if found is None:
            continue
        value, views = found
        rank = len(_shape(value))
        if _already_permuted(views, norm, rank):
            continue
        last = (0, *range(2, rank), 1)
        back = (0, rank - 1, *range(1, rank - 1))
        readers = list(norm.users)
        graph = gm.graph
        swin = len(views) == 1 and _is(views[0], _PERMUTES) and tuple(
            d % rank for d in _permute_dims(views[0])) == last
        if swin:
            first = views[0]
        else:
            with graph.inserting_before(norm):
                first = graph.create_node("call_method", "permute", (value, last), name=f"{norm.name}_input")
            norm.replace_input_with(views[-1], first)
        with graph.inserting_after(norm):
            nchw = graph.create_node("call_method", "permute", (norm, back), name=f"{norm.name}_nchw")
        if swin:
            with graph.inserting_after(nchw):
                views = [graph.create_node("call_method", "permute", (nchw, last), name=f"{norm.name}_nhwc")]
        else:
            views[0].replace_input_with(value, nchw)
            at = nchw
            for view in views:
                at.append(view)
                at = view
        tokens = views[-1]
        layout = _layout(views, rank)
        if not all(_takes_any_strides(gm, r, norm, layout, rank) for r in readers):
            with graph.inserting_after(tokens):
                tokens = graph.call_method("contiguous", (tokens,))
        for reader in readers:
            reader.replace_input_with(norm, tokens)
        _record_shapes(value, [first, norm, nchw, *views] + ([tokens] if tokens is not views[-1] else []))
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _record_shapes(value: torch.fx.Node, nodes: Sequence[torch.fx.Node]) -> None:
    """Each rewritten node's ``tensor_meta`` from running it on meta tensors (the layer norm as F.layer_norm over
    the last dim: its parameters change no shape)."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    meta = value.meta["tensor_meta"]
    env = {value: torch.empty_strided(tuple(meta.shape), tuple(meta.stride), dtype=meta.dtype, device="meta")}
    for node in nodes:
        x = env[node.args[0]]
        if node.op == "call_method":
            out = getattr(x, node.target)(*node.args[1:], **node.kwargs)
        elif _is(node, _FLATTENS + _TRANSPOSES + _PERMUTES):
            out = node.target(x, *node.args[1:], **node.kwargs)
        else:
            out = F.layer_norm(x, (x.shape[-1],))
        env[node] = out
        node.meta["tensor_meta"] = _extract_tensor_metadata(out)
