"""Builders of pointwise ops: an activation or math function called as a function, a method or a module (unary,
module_op, with its arguments read off the call or the module), clamps (bounds that are tensors become maximum and
minimum), threshold, round, nan_to_num, prelu (its weight a parameter of the model) and the named powers (square, rsqrt, reciprocal:
pow).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from fusetune.errors import count
from fusetune.importer.builders.binary import _binary_entry
from fusetune.importer.graph import Entry, fetch
from fusetune.importer.matching import (Builder, Mapped, Site, Stop, _constant_tensor_nodes, _ignore, _num, _one,
                                        bind_all, bind_op, module_input)
from fusetune.importer.operands import ParamRef


def unary(kind: str, names: Sequence[str] = (), defaults: Mapping[str, Any] | None = None,
          ignored: Mapping[str, Any] | None = None) -> Builder:
    """A functional or method op: ``kind(x, *names)``; ``ignored`` arguments must keep their default
    (inplace: the value is the same either way; the chain reads the op's result)."""
    defaults = dict(defaults or {})
    ignored = dict(ignored or {"inplace": False})

    def build(site: Site) -> Mapped:
        a = bind_op(site, [*names, *ignored], {**defaults, **{k: v for k, v in ignored.items()}})
        entry: Entry = {"op": kind}
        for key in names:
            value = a[key]
            entry[key] = value if isinstance(value, str) else _num(value)
        return _one(site, entry)
    return build


def module_op(kind: str, read: Callable[[nn.Module], Mapping[str, Any]] = lambda m: {}) -> Builder:
    """A module called on the chain's value: its arguments read off its attributes."""
    def build(site: Site) -> Mapped:
        module_input(site)
        return _one(site, {"op": kind, **read(site.module)})
    return build


def clamp(lo_key: str = "min", hi_key: str = "max", only: str | None = None) -> Builder:
    """torch.clamp(x, min, max), x.clamp(...), clamp_min / clamp_max. A bound that is a tensor (a 0-dim buffer,
    torch.tensor(c), a parameter) is read as a binary op's operand: a number where it is one, else the clamp is
    maximum by min then minimum by max, as PyTorch defines a clamp by tensors."""
    def build(site: Site) -> Mapped:
        names = [only] if only else [lo_key, hi_key]
        a = bind_all(site.node, ["input", *names], {k: None for k in names})
        if isinstance(a, str):
            raise Stop(a)
        if not site.is_x(a["input"]):
            raise Stop("it reads the chain's value as an argument other than its input")
        bounds = {key: _num(a[key]) if not isinstance(a[key], torch.fx.Node) else site.operand(a[key])
                  for key in names if a[key] is not None}
        if not bounds:
            raise Stop("clamp without bounds")
        extra = [n for key in bounds for n in (_constant_tensor_nodes(site, a[key]) or [])]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds.values()):
            return Mapped([{"op": "clamp", **{key: _num(v) for key, v in bounds.items()}}], site.node, extra)
        kinds = {lo_key: "maximum", hi_key: "minimum"}
        return Mapped([_binary_entry(kinds[key], v) for key, v in bounds.items()], site.node, extra)
    return build


def threshold_fn(site: Site) -> Mapped:
    """F.threshold(x, threshold, value) / torch.threshold: x where x > threshold, else value."""
    a = bind_op(site, ["threshold", "value", "inplace"], {"inplace": False})
    return _threshold(site, a["threshold"], a["value"])


def threshold_module(site: Site) -> Mapped:
    module_input(site)
    return _threshold(site, site.module.threshold, site.module.value)


def _threshold(site: Site, threshold: Any, value: Any) -> Mapped:
    """x where x > threshold, else value: max(x, threshold), a clamp, where value is the threshold (relu at 0),
    the forms the planner knows best; else the op threshold (a jump at the threshold)."""
    if _num(threshold) != _num(value):
        return _one(site, {"op": "threshold", "threshold": _num(threshold), "value": _num(value)})
    if _num(threshold) == 0.0:
        return _one(site, {"op": "relu"})
    return _one(site, {"op": "clamp", "min": _num(threshold)})


def round_op(site: Site) -> Mapped:
    """torch.round(x), x.round(), torch.special.round(x): half to even. Another number of decimals scales by a power of
    ten around the rounding, which the op does not."""
    a = bind_op(site, ["decimals"], {"decimals": 0})
    _ignore(a["decimals"], "decimals", 0)
    return _one(site, {"op": "round"})


def nan_to_num(site: Site) -> Mapped:
    """torch.nan_to_num(x, nan, posinf, neginf), x.nan_to_num(...): the numbers given (None, PyTorch's default for
    an infinity, is left out: the config resolves it at its dtype)."""
    a = bind_op(site, ["nan", "posinf", "neginf"], {"nan": 0.0, "posinf": None, "neginf": None})
    entry: Entry = {"op": "nan_to_num"}
    for key in ("nan", "posinf", "neginf"):
        if a[key] is not None:
            entry[key] = _num(a[key])
    return _one(site, entry)


def prelu_module(site: Site) -> Mapped:
    """nn.PReLU: its weight, one value or one per channel, is the op's parameter (``by``), under the user's name."""
    module_input(site)
    return _prelu(site, f"{site.node.target}.weight", site.module.weight)


def prelu_fn(site: Site) -> Mapped:
    """F.prelu(x, weight), torch.prelu: the weight a tensor of the model (a parameter, a buffer)."""
    bound = bind_all(site.node, ["input", "weight"], {})
    if isinstance(bound, str):
        raise Stop(bound)
    if not site.is_x(bound["input"]):
        raise Stop("it reads the chain's value as an argument other than its input")
    weight = bound["weight"]
    if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr"):
        raise Stop("its weight is computed in the forward, not a tensor of the model")
    return _prelu(site, str(weight.target), fetch(site.gm, weight.target))


def _prelu(site: Site, target: str, weight: Any) -> Mapped:
    """PReLU's weight applies along dim 1 whatever its rank (torch's rule, not broadcasting's): one value, or
    one per channel of the chain's value."""
    shape = site.shape_in or ()
    channels = shape[1] if len(shape) > 1 else 1
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.numel() not in (1, channels):
        size = list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise Stop(f"its weight {target} of shape {size} is neither one value nor one per channel ({channels})")
    if weight.numel() > 1 and channels != site.channels:
        raise Stop(f"its weight has {channels} values, one per channel of a value that is no longer the "
                    f"convolution's {count(site.channels, 'channel')}")
    return _one(site, {"op": "prelu", "by": ParamRef(target, tuple(int(s) for s in weight.shape))})


def _pow_form(exponent: float) -> Builder:
    def build(site: Site) -> Mapped:
        bind_op(site, [], {})
        return _one(site, {"op": "pow", "by": exponent})
    return build
