"""Builders of pools: F.max_pool*d and F.avg_pool*d and their modules, and the adaptive pools, as the config's pool
entries, a max pool's dilation and an average's divisor_override with them; what the pools do not take
(return_indices) stops the chain.
"""
from __future__ import annotations

from typing import Any, Mapping

from fusetune.importer.graph import Entry
from fusetune.importer.matching import Builder, Mapped, Site, Stop, _as_list, _one, bind_op, module_input
from fusetune.importer.producers import _window


def pool_fn(kind: str, dims: int) -> Builder:
    """F.max_pool*d / F.avg_pool*d."""
    def build(site: Site) -> Mapped:
        if kind == "max_pool":
            a = bind_op(site, ["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"],
                      {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False})
        else:
            names = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"]
            names += ["divisor_override"] if dims > 1 else []
            a = bind_op(site, names, {"stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True,
                                    "divisor_override": None})
        return _one(site, _pool_entry(kind, dims, a))
    return build


def pool_module(kind: str) -> Builder:
    def build(site: Site) -> Mapped:
        module_input(site)
        m = site.module
        dims = int(type(m).__name__[-2])
        a = {key: getattr(m, key) for key in ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                               "return_indices", "count_include_pad", "divisor_override")
             if hasattr(m, key)}
        return _one(site, _pool_entry(kind, dims, a))
    return build


def _pool_entry(kind: str, dims: int, a: Mapping[str, Any]) -> Entry:
    padding = _as_list(_window(a.get("padding", 0), dims), dims)
    # ceil_mode as the user wrote it: where it adds no window at the config's shapes the planner takes the pool as
    # floor mode there, and the model runs PyTorch's forward at any other shape (regions.ceil_adds_no_window)
    ceil = bool(a.get("ceil_mode"))
    if a.get("return_indices"):
        raise Stop("return_indices=True is not in the vocabulary")
    entry: Entry = {"op": kind, "kernel_size": _window(a["kernel_size"], dims)}
    stride = a.get("stride")
    if stride not in (None, [], ()) and _window(stride, dims) != entry["kernel_size"]:
        entry["stride"] = _window(stride, dims)
    if _window(a.get("padding", 0), dims) != 0:
        entry["padding"] = _window(a["padding"], dims)
    if ceil:
        entry["ceil_mode"] = True
    if not a.get("count_include_pad", True) and any(padding):  # (without padding the two divisors are one)
        entry["count_include_pad"] = False
    if _window(a.get("dilation", 1), dims) != 1:  # (a max pool's: the average pools have none)
        entry["dilation"] = _window(a["dilation"], dims)
    if a.get("divisor_override") is not None:  # (an average's, 2-D and 3-D: F.avg_pool1d has none)
        entry["divisor_override"] = int(a["divisor_override"])
    return entry


def adaptive(kind: str, module: bool) -> Builder:
    def build(site: Site) -> Mapped:
        if module:
            module_input(site)
            size, indices = site.module.output_size, getattr(site.module, "return_indices", False)
        else:
            names = ["output_size"] + (["return_indices"] if kind == "adaptive_max_pool" else [])
            a = bind_op(site, names, {"return_indices": False})
            size, indices = a["output_size"], a.get("return_indices", False)
        if indices:
            raise Stop("return_indices=True is not in the vocabulary")
        sizes = list(size) if isinstance(size, (list, tuple)) else [size]
        if any(s is None for s in sizes):
            raise Stop(f"output_size {size!r} keeps a dim's size (None), not in the vocabulary")
        return _one(site, {"op": kind, "output_size": int(sizes[0]) if len(set(sizes)) == 1 else [int(s) for s in sizes]})
    return build
