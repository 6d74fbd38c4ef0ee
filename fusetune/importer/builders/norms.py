"""Builders of norms: batch norm (its modules, SyncBatchNorm in eval mode, F.batch_norm, the frozen batch norms of other
packages), group, instance and layer norm, as modules and as functional calls whose weight, bias and running statistics
must be the model's own tensors.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from fusetune.importer.graph import Entry, _fetch_or_none, fetch, has_node
from fusetune.importer.matching import Mapped, Site, Stop, _num, _one, _size_value, bind_all, module_input


def batch_norm(site: Site) -> Mapped:
    module_input(site)
    m = site.module
    if not m.track_running_stats:
        raise Stop("BatchNorm with track_running_stats=False (batch statistics in eval mode too, no running "
                    "statistics) is not in the vocabulary")
    if m.momentum is None and m.training:
        raise Stop("BatchNorm in training mode with momentum=None (a cumulative average) is not in the vocabulary")
    # eval mode reads the running statistics alone: its momentum (None too) changes nothing, and the config keeps
    # the default's (training mode runs the user's own module: fusetune/optimizer.py)
    momentum = {} if m.momentum is None else {"momentum": float(m.momentum)}
    return _one(site, {"op": "batch_norm", "eps": float(m.eps), **momentum, "affine": m.affine,
                       "training": m.training}, module=str(site.node.target))


def sync_batch_norm(site: Site) -> Mapped:
    """nn.SyncBatchNorm: in eval mode the batch norm of its running statistics; in training mode its statistics
    are summed over every process of the group, which one GPU's kernels do not see."""
    if site.module.training:
        raise Stop("SyncBatchNorm in training mode takes its statistics over every process of its group, which "
                    "one GPU's kernels do not see; import the model in eval mode for inference")
    return batch_norm(site)


def group_norm(site: Site) -> Mapped:
    module_input(site)
    m = site.module
    return _one(site, {"op": "group_norm", "num_groups": m.num_groups, "eps": float(m.eps), "affine": m.affine},
                module=str(site.node.target))


def instance_norm(site: Site) -> Mapped:
    module_input(site)
    m = site.module
    if m.track_running_stats and m.training:
        raise Stop("InstanceNorm in training mode with track_running_stats=True (each sample's statistics, the "
                    "running ones updated from them) is not in the vocabulary")
    if m.track_running_stats:  # eval mode normalizes by the running statistics: an eval-mode batch norm's map
        names = ["running_mean", "running_var", "num_batches_tracked"] + (["weight", "bias"] if m.affine else [])
        return Mapped([{"op": "batch_norm", "eps": float(m.eps), "affine": m.affine, "training": False}], site.node,
                      weights={n: f"{site.node.target}.{n}" for n in names})
    return _one(site, {"op": "instance_norm", "eps": float(m.eps), "affine": m.affine}, module=str(site.node.target))


def layer_norm(site: Site) -> Mapped:
    module_input(site)
    m = site.module
    if m.elementwise_affine and m.bias is None:
        raise Stop("LayerNorm(bias=False) is not in the vocabulary")
    return _one(site, {"op": "layer_norm", "normalized_shape": [int(s) for s in m.normalized_shape],
                       "eps": float(m.eps), "elementwise_affine": m.elementwise_affine}, module=str(site.node.target))


def _affine_tensors(site: Site, weight: Any, bias: Any, shape: Sequence[int]) -> dict[str, str]:
    """A functional norm's weight and bias: both absent (no affine), or both tensors of the user's model of
    ``shape`` (its parameters or buffers, by attribute path); else the chain stops there."""
    if weight is None and bias is None:
        return {}
    out: dict[str, str] = {}
    for key, value in (("weight", weight), ("bias", bias)):
        if value is None:
            raise Stop(f"a {key} of None beside the other's tensor is not in the vocabulary (both or neither)")
        tensor = fetch(site.gm, value.target) if isinstance(value, torch.fx.Node) and value.op == "get_attr" else None
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise Stop(f"its {key} is computed in the forward, not a tensor of the model")
        if tuple(tensor.shape) != tuple(shape):
            raise Stop(f"its {key} has shape {list(tensor.shape)}, expected {list(shape)}")
        out[key] = str(value.target)
    return out


def group_norm_fn(site: Site) -> Mapped:
    """F.group_norm(x, num_groups, weight, bias, eps): the weight and bias the model's own tensors."""
    a = bind_all(site.node, ["input", "num_groups", "weight", "bias", "eps"],
                  {"weight": None, "bias": None, "eps": 1e-5})
    if isinstance(a, str):
        raise Stop(a)
    if not site.is_x(a["input"]) or has_node(a["num_groups"]) or has_node(a["eps"]):
        raise Stop("its arguments other than the tensors are computed in the forward")
    weights = _affine_tensors(site, a["weight"], a["bias"], (site.channels,))
    return Mapped([{"op": "group_norm", "num_groups": int(a["num_groups"]), "eps": _num(a["eps"]),
                    "affine": bool(weights)}], site.node, weights=weights)


def instance_norm_fn(site: Site) -> Mapped:
    """F.instance_norm(x, weight=..., bias=..., eps=...): each sample's own statistics (no running ones)."""
    a = bind_all(site.node, ["input", "running_mean", "running_var", "weight", "bias", "use_input_stats",
                              "momentum", "eps"],
                  {"running_mean": None, "running_var": None, "weight": None, "bias": None, "use_input_stats": True,
                   "momentum": 0.1, "eps": 1e-5})
    if isinstance(a, str):
        raise Stop(a)
    if not site.is_x(a["input"]) or any(has_node(a[k]) for k in ("use_input_stats", "momentum", "eps")):
        raise Stop("its arguments other than the tensors are computed in the forward")
    if a["running_mean"] is not None or a["running_var"] is not None or a["use_input_stats"] is not True:
        raise Stop("F.instance_norm with running statistics is not in the vocabulary")
    weights = _affine_tensors(site, a["weight"], a["bias"], (site.channels,))
    return Mapped([{"op": "instance_norm", "eps": _num(a["eps"]), "affine": bool(weights)}], site.node,
                  weights=weights)


def batch_norm_fn(site: Site) -> Mapped:
    """F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps), as timm's BatchNormAct2d
    and hand-written norms call it: the running statistics, weight and bias the model's own tensors. Eval mode reads
    the running statistics alone (its momentum, 0 too, changes nothing); training mode updates them by momentum."""
    a = bind_all(site.node, ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"],
                  {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5})
    if isinstance(a, str):
        raise Stop(a)
    if not site.is_x(a["input"]) or any(has_node(a[k]) for k in ("training", "momentum", "eps")):
        raise Stop("its arguments other than the tensors are computed in the forward")
    channels = (site.channels,)
    stats: dict[str, str] = {}
    for key in ("running_mean", "running_var"):
        value = a[key]
        tensor = fetch(site.gm, value.target) if isinstance(value, torch.fx.Node) and value.op == "get_attr" else None
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != channels:
            raise Stop(f"its {key} is not a tensor of the model of shape {list(channels)} (F.batch_norm without "
                        "running statistics is not in the vocabulary)")
        stats[key] = str(value.target)
    owner = stats["running_mean"].rpartition(".")[0]  # a BatchNorm's own count (timm's BatchNormAct2d is one)
    count = f"{owner}.num_batches_tracked" if owner else "num_batches_tracked"
    if isinstance(_fetch_or_none(site.gm, count), torch.Tensor):
        stats["num_batches_tracked"] = count
    training, momentum = bool(a["training"]), _num(a["momentum"])
    if training and momentum <= 0:
        raise Stop(f"F.batch_norm in training mode with momentum {momentum} (running statistics that never move) "
                    "is not in the vocabulary")
    weights = _affine_tensors(site, a["weight"], a["bias"], channels)
    entry: Entry = {"op": "batch_norm", "eps": _num(a["eps"]), **({"momentum": momentum} if training else {}),
                    "affine": bool(weights), "training": training}
    return Mapped([entry], site.node, weights={**weights, **stats})


def layer_norm_fn(site: Site) -> Mapped:
    """F.layer_norm(x, normalized_shape, weight, bias, eps): the shape a list of numbers."""
    a = bind_all(site.node, ["input", "normalized_shape", "weight", "bias", "eps"],
                  {"weight": None, "bias": None, "eps": 1e-5})
    if isinstance(a, str):
        raise Stop(a)
    if not site.is_x(a["input"]) or has_node(a["eps"]):
        raise Stop("its input or eps is computed in the forward")
    shape = a["normalized_shape"]
    if has_node(shape):  # F.layer_norm(x, x.shape[1:]): the sizes at the traced shape, read off the chain's value
        try:
            shape = _size_value(site, shape)
        except (Stop, IndexError, TypeError, ValueError) as exc:
            raise Stop(f"its normalized_shape is computed in the forward from more than the chain's sizes ({exc})")
    shape = [int(shape)] if isinstance(shape, int) else [int(v) for v in shape]
    weights = _affine_tensors(site, a["weight"], a["bias"], shape)
    return Mapped([{"op": "layer_norm", "normalized_shape": shape, "eps": _num(a["eps"]),
                    "elementwise_affine": bool(weights)}], site.node, weights=weights)


def frozen_batch_norm(site: Site) -> Mapped:
    """A FrozenBatchNorm2d (torchvision's, detectron2's: the detection backbones'): an eval-mode batch norm of its
    buffers weight, bias, running_mean and running_var, which its forward folds into x * scale + bias."""
    module_input(site)
    names = ("weight", "bias", "running_mean", "running_var")
    return Mapped([{"op": "batch_norm", "eps": float(getattr(site.module, "eps", 1e-5)), "affine": True,
                    "training": False}], site.node, weights={n: f"{site.node.target}.{n}" for n in names})
