"""The importer's patterns for the norms over the channels (fusetune/ops/channel.py), in the forms real models
write them after a convolution:

  * ``F.normalize(x, p, dim, eps)``: one call (``normalize``, a row of importer.TABLE);
  * a layer norm over the channels, permuted around one over the last dim: ``x.permute(0, 2, 3, 1)`` ->
    ``nn.LayerNorm(C)`` or ``F.layer_norm(x, (C,), w, b, eps)`` -> ``.permute(0, 3, 1, 2)`` (1-D to 3-D), which
    timm's and torchvision's ``LayerNorm2d`` (nn.LayerNorm subclasses, traced through) compute too;
  * ConvNeXt's by hand: ``u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True); x = (x - u) /
    torch.sqrt(s + eps); x = w[:, None, None] * x + b[:, None, None]`` (the affine optional).

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

from fusetune.importer import Mapped, ParamRef, Site, bind_op, bind_all, fetch, has_node, Stop, reduction

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
    if node.op == "call_module":
        module = site.gm.get_submodule(node.target)
        if type(module) is not nn.LayerNorm or len(node.args) != 1 or node.kwargs or node.args[0] is not value:
            return None
        if tuple(module.normalized_shape) != (channels,):
            return None
        target = str(node.target)
        weight = ParamRef(f"{target}.weight", (channels,)) if module.weight is not None else None
        bias = ParamRef(f"{target}.bias", (channels,)) if module.bias is not None else None
        return _entry(weight, bias, float(module.eps))
    if not _is(node, (("call_function", F.layer_norm), ("call_function", torch.layer_norm))):
        return None
    a = bind_all(node, ["input", "normalized_shape", "weight", "bias", "eps"],
                  {"weight": None, "bias": None, "eps": 1e-5})
    if isinstance(a, str) or a["input"] is not value or has_node(a["normalized_shape"]) or has_node(a["eps"]):
        return None
    shape = a["normalized_shape"]
    if (list(shape) if isinstance(shape, (tuple, list, torch.Size)) else [shape]) != [channels]:
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
    if not _is(mean, _MEANS) or mean.args[0] is not of:
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
    means = [r for r in readers if _over_channels(site, r, r.args[0]) and site.is_x(r.args[0])]
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
