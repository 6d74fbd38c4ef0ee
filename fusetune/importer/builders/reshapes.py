"""Builders of reshapes after the batch dim: flatten, a view or reshape that is a flatten or an unflatten at the traced
shapes, squeeze and unsqueeze; and the pixel shuffle, which moves values between the channels and the positions.
"""
from __future__ import annotations

import math
from typing import Any

from fusetune.importer.graph import Entry
from fusetune.importer.matching import Builder, Mapped, Site, Stop, _one, bind_op, module_input


def flatten(default_start: int) -> Builder:
    def build(site: Site) -> Mapped:
        a = bind_op(site, ["start_dim", "end_dim"], {"start_dim": default_start, "end_dim": -1})
        return _one(site, _flatten_entry(site, int(a["start_dim"]), int(a["end_dim"])))
    return build


def _flatten_entry(site: Site, start: int, end: int) -> Entry:
    rank = len(site.shape_in or ())
    if rank and start % rank == 0:
        raise Stop("it flattens the batch dim into the others")
    return {"op": "flatten", "start_dim": start, "end_dim": end}


def view(site: Site) -> Mapped:
    """x.view(...) / x.reshape(...) / torch.reshape: a flatten where the output merges a run of the
    input's dims after the batch dim (x.view(x.size(0), -1) is flatten(1)); an unflatten where it splits one
    of them into several (x.view(b, c, d, h, w) after x.view(b, c, -1)), its sizes the example's."""
    shape_in, shape_out = site.shape_in, site.shape_out
    if not site.is_x(site.node.args[0]) if site.node.args else True:
        raise Stop("it reads the chain's value as an argument other than its input")
    if shape_in is None or shape_out is None:
        raise Stop("its shapes are unknown")
    if tuple(shape_in) == tuple(shape_out):  # x.view(x.size(0), 1) on an (N, 1) value: the identity
        return Mapped(entries=[], out=site.node)
    for start in range(1, len(shape_in)):
        for end in range(start + 1, len(shape_in)):
            merged = shape_in[:start] + (math.prod(shape_in[start:end + 1]),) + shape_in[end + 1:]
            if merged == shape_out:
                return _one(site, {"op": "flatten", "start_dim": start, "end_dim": end if end + 1 < len(shape_in) else -1})
    split = len(shape_out) - len(shape_in) + 1
    for dim in range(1, len(shape_in)) if split >= 2 else ():
        sizes = shape_out[dim:dim + split]
        if shape_out[:dim] == shape_in[:dim] and shape_out[dim + split:] == shape_in[dim + 1:] and \
                math.prod(sizes) == shape_in[dim]:
            return _one(site, {"op": "unflatten", "dim": dim, "sizes": [int(v) for v in sizes]})
    raise Stop(f"a reshape from {list(shape_in)} to {list(shape_out)} that is not a flatten after the batch dim")


def squeeze(site: Site) -> Mapped:
    a = bind_op(site, ["dim"], {"dim": None})
    entry: Entry = {"op": "squeeze"}
    if a["dim"] is not None:
        entry["dim"] = [int(d) for d in a["dim"]] if isinstance(a["dim"], (list, tuple)) else int(a["dim"])
    return _one(site, entry)


def unsqueeze(site: Site) -> Mapped:
    a = bind_op(site, ["dim"], {})
    return _one(site, {"op": "unsqueeze", "dim": int(a["dim"])})


def _pixel_shuffle_entry(site: Site, factor: Any) -> Entry:
    """The pixel_shuffle op (fusetune/ops/shuffle.py) of an (N, C, H, W) value; a shuffle of another rank (PyTorch's
    takes the last three dims of any) is none of a chain's."""
    rank = len(site.shape_in or ())
    if rank != 4:
        raise Stop(f"a pixel shuffle of a rank-{rank} value: the op takes (N, C, H, W), a 2-D convolution's output")
    return {"op": "pixel_shuffle", "upscale_factor": int(factor)}


def pixel_shuffle_fn(site: Site) -> Mapped:
    """F.pixel_shuffle(x, upscale_factor), torch.pixel_shuffle."""
    a = bind_op(site, ["upscale_factor"], {})
    return _one(site, _pixel_shuffle_entry(site, a["upscale_factor"]))


def pixel_shuffle_module(site: Site) -> Mapped:
    """nn.PixelShuffle(upscale_factor)."""
    module_input(site)
    return _one(site, _pixel_shuffle_entry(site, site.module.upscale_factor))
