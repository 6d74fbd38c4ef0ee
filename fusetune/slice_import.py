"""The importer's forms of the slice op (fusetune/ops/slicing.py): ``x[:, :, a:b:s]``, ``x[..., 2:-2, 2:-2]`` (a
slice entry per sliced dim, the batch's whole; None and integers are other ops) and ``x.narrow(dim, start,
length)`` / ``torch.narrow`` (a non-negative start: ``start:start + length``). Bounds and sizes computed from the value's shape
(``x[:, :, :x.shape[2] - p]``) are read at the traced shape; a number in the model (a TCN's ``self.chomp_size``)
is the config's, so a chomp ``x[:, :, :-p]`` is ``end: -p`` at any length.
"""
from __future__ import annotations

from typing import Any

import torch

from fusetune.importer import Mapped, Site, bind_all, shape_number, Stop


def getitem(site: Site) -> Mapped:
    """``x[index]`` with ``index`` slices (and at most one Ellipsis, which stands for whole dims), the batch's
    whole: one slice entry per sliced dim, in order (slicing one dim after another is slicing them at once)."""
    node = site.node
    if not site.is_x(node.args[0]):
        raise Stop("it indexes a tensor other than the chain's value")
    shape = site.shape_in
    index = node.args[1]
    index = index if isinstance(index, tuple) else (index,)
    if shape is None or any(not isinstance(i, slice) and i is not Ellipsis for i in index):
        raise Stop("an index of None, an integer or a tensor is not in the vocabulary (slices only)")
    if index.count(Ellipsis) > 1 or len(index) - index.count(Ellipsis) > len(shape):
        raise Stop("an index with more slices than dims, or two Ellipses")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (len(shape) - len(index) + 1) + index[at + 1:]
    cut = [d for d, i in enumerate(index) if i != slice(None, None, None)]
    if not cut or cut[0] == 0:
        raise Stop("the vocabulary slices dims after the batch's")
    entries = []
    for d in cut:
        piece = index[d]
        start, end, step = (_bound(site, b) for b in (piece.start, piece.stop, piece.step))
        if step is not None and step < 1:
            raise Stop(f"a slice step of {step} (PyTorch takes positive steps)")
        entry: dict[str, Any] = {"op": "slice", "dim": d}
        if start:
            entry["start"] = start
        if end is not None:
            entry["end"] = end
        if step not in (None, 1):
            entry["step"] = step
        entries.append(entry)
    return Mapped(entries, node)


def narrow(site: Site) -> Mapped:
    """``x.narrow(dim, start, length)``, ``torch.narrow(x, dim, start, length)``."""
    bound = bind_all(site.node, ["input", "dim", "start", "length"], {})
    if isinstance(bound, str) or not site.is_x(bound["input"]):
        raise Stop(bound if isinstance(bound, str) else "it narrows a tensor other than the chain's value")
    dim, start, length = (_bound(site, bound[k]) for k in ("dim", "start", "length"))
    shape = site.shape_in
    if shape is None or None in (dim, start, length):
        raise Stop("narrow's dim, start and length must be integers")
    if dim % len(shape) == 0 or start < 0:
        raise Stop("the vocabulary slices a dim after the batch's from a non-negative start")
    return Mapped([{"op": "slice", "dim": dim % len(shape), "start": start, "end": start + length}], site.node)


def _bound(site: Site, value: Any) -> int | None:
    if isinstance(value, torch.fx.Node):
        value = shape_number(site, value)
        if value is None:
            raise Stop("a slice bound computed in the forward from something other than the value's shape")
    if value is None:
        return None
    if isinstance(value, bool) or not float(value).is_integer():
        raise Stop(f"a slice bound {value!r} that is not an integer")
    return int(value)
