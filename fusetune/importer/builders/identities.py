"""Ops that pass the chain's value on: the dropouts (the identity in eval mode or at p = 0), nn.Identity, torchvision's
stochastic depth, and the aliases the walk follows without a step (_is_identity: clone, detach, contiguous, a cast that
keeps the dtype and reads it off the chain); a cast reached as an op ends the chain.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.importer.graph import Entry, _dtype, _is_convolution, _is_shape_read, _shape
from fusetune.importer.matching import Builder, Mapped, Site, Stop, _num, _one, bind_op, module_input


def dropout_fn(training_default: bool) -> Builder:
    """F.dropout and its kin (F.dropout2d, F.alpha_dropout, ...), whose ``training`` defaults differ: each is
    the identity where p = 0 or not training, whatever mask it would draw in training."""
    def build(site: Site) -> Mapped:
        a = bind_op(site, ["p", "training", "inplace"], {"p": 0.5, "training": training_default, "inplace": False})
        return _one(site, _dropout_entry(_num(a["p"]), bool(a["training"])))
    return build


def dropout_module(site: Site) -> Mapped:
    module_input(site)
    return _one(site, _dropout_entry(float(site.module.p), site.module.training))


def _dropout_entry(p: float, training: bool) -> Entry:
    if training and p > 0:
        raise Stop(f"dropout in training mode with p = {p} draws random masks (no tuned kernel reproduces "
                    "them); import the model in eval mode for inference")
    return {"op": "dropout", "p": p, "training": training}


def identity_module(site: Site) -> Mapped:
    module_input(site)
    return Mapped(entries=[], out=site.node)


#: The dropouts (element, channel and alpha), functional with their ``training`` default, and as modules: the
#: identity in eval mode or where p = 0; in training mode with p > 0 they draw masks no kernel reproduces.
_DROPOUT_FUNCTIONS: tuple[tuple[Any, bool], ...] = (
    (F.dropout, True), (F.dropout1d, True), (F.dropout2d, True), (F.dropout3d, True),
    (F.alpha_dropout, False), (F.feature_alpha_dropout, False))
_DROPOUT_MODULES: tuple[type, ...] = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                                      nn.FeatureAlphaDropout)

#: Casts (``x.float()``, ``h.to(x.dtype)``, ``.type_as(x)``, as mixed-precision code writes them around a norm): the
#: identity where the traced value keeps its dtype and shape, else the end of the chain (cast).
CAST_METHODS = ("to", "float", "double", "half", "bfloat16", "type", "type_as")


def cast(site: Site) -> Mapped:
    """A cast reached as an op: one that changes the dtype, or reads its dtype off a tensor outside the chain (one
    that keeps it otherwise is an identity, _is_identity)."""
    to, now = _dtype(site.node), _dtype(next(iter(site.cur)))
    if to is not None and to == now:
        raise Stop(f"it keeps the dtype ({to}) but reads it off a tensor outside the chain, which stays in PyTorch")
    raise Stop(f"it casts the value to {to or 'another type'}; the chain computes in {now}, as traced")


#: Ops that return their input's value: the chain's value under another name (``r = x.clone()``).
IDENTITY_METHODS = ("clone", "detach", "contiguous")
IDENTITY_FUNCTIONS = (torch.clone, torch.detach)


def stochastic_depth(site: Site) -> Mapped:
    """torchvision.ops.stochastic_depth(input, p, mode, training): torch.fx.wrap'ed, so a call of its own in the
    trace (torchvision's EfficientNet, ConvNeXt, Swin before their residual add); the identity in eval mode or at
    p = 0, as a dropout."""
    a = bind_op(site, ["p", "mode", "training"], {"training": True})
    return _one(site, _dropout_entry(_num(a["p"]), bool(a["training"])))


def _is_identity(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_method" and node.target in IDENTITY_METHODS:
        return node.target != "clone" or not node.kwargs
    if node.op == "call_function" and node.target in IDENTITY_FUNCTIONS:
        return True
    if node.op == "call_method" and node.target in CAST_METHODS and node.args:
        source = node.args[0]
        return (isinstance(source, torch.fx.Node) and _dtype(node) is not None and _dtype(node) == _dtype(source)
                and _shape(node) == _shape(source) and _reads_chain_only(gm, node))
    return False


def _reads_chain_only(gm: torch.fx.GraphModule, cast: torch.fx.Node) -> bool:
    """Whether a cast's dtype comes from a number or from the chain it is in: ``h.to(h.dtype)``, ``.type_as(y)``, with
    h and y its value or an earlier one back to the convolution. A dtype read off another tensor (the model's input:
    ``.to(x.dtype)``) stays in PyTorch, and the cast with it: cut out with the chain, the cast would read it."""
    chain: set[torch.fx.Node] = set()
    node: Any = cast.args[0]
    while isinstance(node, torch.fx.Node) and len(chain) < 256:
        chain.add(node)
        if _is_convolution(gm, node):
            break
        node = node.args[0] if node.args else None
    for arg in (*cast.args[1:], *cast.kwargs.values()):
        if not isinstance(arg, torch.fx.Node):
            continue
        read = arg.args[0] if _is_shape_read(arg) and arg.args else arg
        if read not in chain:
            return False
    return True
