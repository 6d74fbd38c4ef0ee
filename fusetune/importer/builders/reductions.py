"""Builders of reductions over dims: sum, mean, amax, amin and logsumexp, max and min over a dim (only its values read;
with another tensor they are maximum and minimum), var and std, softmax and log_softmax. A reduction over every dim, the batch dim
included, stops the chain.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from fusetune.importer.builders.binary import binary
from fusetune.importer.matching import Builder, Mapped, Site, Stop, _call_args, _dims, _ignore, _one, bind_op


def extremum(kind: str) -> Builder:
    """torch.max/min: with another tensor (maximum/minimum), or over a dim ([0] or .values)."""
    def build(site: Site) -> Mapped:
        args, kwargs = _call_args(site)
        other = kwargs.get("other", args[1] if len(args) > 1 else None)
        if isinstance(other, torch.fx.Node) and "dim" not in kwargs:
            if kwargs.keys() - {"other"}:
                raise Stop(f"arguments {sorted(kwargs)} are not in the vocabulary")
            saved = (site.node.args, site.node.kwargs)
            try:
                site.node.args, site.node.kwargs = (args[0], other), {}
                return binary("maximum" if kind == "max" else "minimum")(site)
            finally:
                site.node.args, site.node.kwargs = saved
        a = bind_op(site, ["dim", "keepdim"], {"dim": None, "keepdim": False})
        if a["dim"] is None:
            raise Stop(f"torch.{kind}(x) without a dim reduces every value, the batch dim included")
        users = list(site.node.users)
        values = [u for u in users if (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0)
                  or (u.op == "call_function" and u.target is getattr and u.args[1] == "values")]
        if len(values) != 1 or len(users) != 1:
            raise Stop(f"torch.{kind}(x, dim)'s indices are used (only [0] or .values is in the vocabulary)")
        return Mapped(entries=[{"op": kind, "dim": _dims(a["dim"]), "keepdim": bool(a["keepdim"])}],
                      out=values[0], extra=[values[0]])
    return build


def reduction(kind: str, dim_default: Any = None) -> Builder:
    """torch.sum/mean/amax/amin/logsumexp(x, dim, keepdim), and the methods."""
    def build(site: Site) -> Mapped:
        a = bind_op(site, ["dim", "keepdim", "dtype"], {"dim": dim_default, "keepdim": False, "dtype": None})
        _ignore(a["dtype"], "dtype", None)
        return _one(site, {"op": kind, "dim": _dims(a["dim"]), "keepdim": bool(a["keepdim"])})
    return build


def spread(kind: str) -> Builder:
    """torch.var/std(x, dim, unbiased, keepdim, *, correction), and the methods: the correction (or unbiased, its
    older spelling) as given; a dim is required (without one, every dim is reduced, the batch's too)."""
    def build(site: Site) -> Mapped:
        a = bind_op(site, ["dim", "unbiased", "keepdim", "correction"],
                    {"dim": None, "unbiased": None, "keepdim": False, "correction": None})
        if isinstance(a["dim"], bool):  # torch.var(x, False): unbiased, over every dim
            raise Stop(f"torch.{kind}(x, unbiased) reduces every dim, the batch dim included")
        entry: dict[str, Any] = {"op": kind, "dim": _dims(a["dim"]), "keepdim": bool(a["keepdim"])}
        correction = a["correction"]
        if correction is not None:
            if isinstance(correction, bool) or not isinstance(correction, int) or correction < 0:
                raise Stop(f"correction={correction!r} is not in the vocabulary (an integer >= 0)")
            entry["correction"] = correction
        elif a["unbiased"] is not None:
            entry["unbiased"] = bool(a["unbiased"])
        return _one(site, entry)
    return build


def softmax(kind: str, names: Sequence[str] = ("dim",)) -> Builder:
    """torch.softmax(x, dim, dtype), F.softmax(x, dim, _stacklevel, dtype), x.softmax(dim, dtype): a dtype by its
    config name (the config says whether it widens, the planner where it runs)."""
    def build(site: Site) -> Mapped:
        from fusetune.dtypes import DTYPES

        a = bind_op(site, [*names, "dtype"], {**{n: None for n in names}, "_stacklevel": 3, "dtype": None})
        if a["dim"] is None:
            raise Stop(f"{kind} without dim (PyTorch's implicit choice) is not in the vocabulary")
        entry: dict[str, Any] = {"op": kind, "dim": int(a["dim"])}
        if a["dtype"] is not None:
            name = next((n for n, d in DTYPES.items() if getattr(torch, d.torch) == a["dtype"]), None)
            if name is None:
                raise Stop(f"dtype={a['dtype']!r} is not in the vocabulary ({', '.join(DTYPES)})")
            entry["dtype"] = name
        return _one(site, entry)
    return build
