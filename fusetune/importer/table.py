"""The vocabulary table, ``TABLE``: (fx node op, target: a module class, a function or a method name) -> the builder of
that op (fusetune/importer/builders/). The one place the importer's vocabulary lives; the config's op names and
arguments are PyTorch's. PyTorch's other names of the ops (ops.TORCH_ALIASES, ops.SPECIAL_NAMES) and their in-place
forms are rows derived from it; the modules and functions of other packages that the trace keeps as calls
(NAMED_MODULES, NAMED_FUNCTIONS) are matched by module and name without importing the package. ``lookup`` gives a node's
builder, refusing a module with forward hooks.
"""
from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.computed_weights import hook_derivations
from fusetune.importer.builders.binary import _method_or_fn_binary, binary
from fusetune.importer.builders.identities import (CAST_METHODS, _DROPOUT_FUNCTIONS, _DROPOUT_MODULES, cast, dropout_fn,
                                                   dropout_module, identity_module, stochastic_depth)
from fusetune.importer.builders.norms import (batch_norm, batch_norm_fn, frozen_batch_norm, group_norm, group_norm_fn,
                                              instance_norm, instance_norm_fn, layer_norm, layer_norm_fn,
                                              sync_batch_norm)
from fusetune.importer.builders.pointwise import (_pow_form, clamp, module_op, nan_to_num, prelu_fn, prelu_module,
                                                  round_op, threshold_fn, threshold_module, unary)
from fusetune.importer.builders.pools import adaptive, pool_fn, pool_module
from fusetune.importer.builders.reductions import extremum, reduction, softmax, spread
from fusetune.importer.builders.reshapes import (flatten, pixel_shuffle_fn, pixel_shuffle_module, squeeze, unsqueeze,
                                                 view)
from fusetune.importer.graph import _hooked, _is_convolution
from fusetune.importer.matching import Builder, Mapped, Site, Stop, _channel_import, _gate_import, _slice_import
from fusetune.ops import SPECIAL_NAMES, TORCH_ALIASES


def _pointwise(kind: str, fn_names: Sequence[str] = (), fn_defaults: Mapping[str, Any] | None = None,
               module_attrs: Sequence[str] = (), functions: Sequence[Any] = (), methods: Sequence[str] = (),
               modules: Sequence[type] = ()) -> dict[tuple[str, Any], Builder]:
    """Rows for one pointwise op: its functions, methods and modules."""
    rows: dict[tuple[str, Any], Builder] = {}
    fn = unary(kind, fn_names, fn_defaults)
    for f in functions:
        rows[("call_function", f)] = fn
    for name in methods:
        rows[("call_method", name)] = fn
    for cls in modules:
        rows[("call_module", cls)] = module_op(kind, lambda m, attrs=tuple(module_attrs): {
            a: (getattr(m, a) if isinstance(getattr(m, a), str) else float(getattr(m, a))) for a in attrs})
    return rows


def _max_pool_fns() -> dict[tuple[str, Any], Builder]:
    rows: dict[tuple[str, Any], Builder] = {}
    for d in (1, 2, 3):
        rows[("call_function", getattr(F, f"max_pool{d}d"))] = pool_fn("max_pool", d)
        rows[("call_function", getattr(F, f"avg_pool{d}d"))] = pool_fn("avg_pool", d)
        rows[("call_function", getattr(F, f"adaptive_avg_pool{d}d"))] = adaptive("adaptive_avg_pool", False)
        rows[("call_function", getattr(F, f"adaptive_max_pool{d}d"))] = adaptive("adaptive_max_pool", False)
        rows[("call_module", getattr(nn, f"MaxPool{d}d"))] = pool_module("max_pool")
        rows[("call_module", getattr(nn, f"AvgPool{d}d"))] = pool_module("avg_pool")
        rows[("call_module", getattr(nn, f"AdaptiveAvgPool{d}d"))] = adaptive("adaptive_avg_pool", True)
        rows[("call_module", getattr(nn, f"AdaptiveMaxPool{d}d"))] = adaptive("adaptive_max_pool", True)
        rows[("call_module", getattr(nn, f"BatchNorm{d}d"))] = batch_norm
        rows[("call_module", getattr(nn, f"InstanceNorm{d}d"))] = instance_norm
    return rows


def _reductions() -> dict[tuple[str, Any], Builder]:
    rows: dict[tuple[str, Any], Builder] = {}
    for kind in ("sum", "mean", "amax", "amin", "logsumexp"):
        rows[("call_function", getattr(torch, kind))] = reduction(kind)
        rows[("call_method", kind)] = reduction(kind)
    for kind in ("max", "min"):
        rows[("call_function", getattr(torch, kind))] = extremum(kind)
        rows[("call_method", kind)] = extremum(kind)
    for kind in ("var", "std"):
        rows[("call_function", getattr(torch, kind))] = spread(kind)
        rows[("call_method", kind)] = spread(kind)
    return rows


def _binaries() -> dict[tuple[str, Any], Builder]:
    rows: dict[tuple[str, Any], Builder] = {}
    for kind, op_fn, torch_fn, method in (("mul", operator.mul, torch.mul, "mul"), ("add", operator.add, torch.add, "add"),
                                          ("sub", operator.sub, torch.sub, "sub"),
                                          ("div", operator.truediv, torch.div, "div"),
                                          ("pow", operator.pow, torch.pow, "pow")):
        rows[("call_function", op_fn)] = binary(kind)
        rows[("call_function", torch_fn)] = _method_or_fn_binary(kind)
        rows[("call_method", method)] = _method_or_fn_binary(kind)
    for kind in ("minimum", "maximum"):
        rows[("call_function", getattr(torch, kind))] = binary(kind)
        rows[("call_method", kind)] = binary(kind)
    return rows


#: Powers PyTorch names as functions and methods: name -> the exponent (x.square() is x ** 2). The config has these
#: names as ops too (the same values); the import writes pow, the one form of x * x, x ** 2 and x.square() alike.
POW_FORMS: dict[str, float] = {"square": 2.0, "rsqrt": -0.5, "reciprocal": -1.0}

#: torch's pointwise functions that are ops of the same name, each a function and a method (torch.erf(x), x.erf());
#: round has a row of its own (round_op: its decimals).
MATH_FUNCTIONS = ("exp", "log", "abs", "sqrt", "erf", "erfc", "log1p", "expm1", "log2", "log10", "exp2", "sin", "cos",
                  "sign", "floor", "ceil", "trunc")


def _pow_forms() -> dict[tuple[str, Any], Builder]:
    rows: dict[tuple[str, Any], Builder] = {}
    for name, exponent in POW_FORMS.items():
        build = _pow_form(exponent)
        rows[("call_function", getattr(torch, name))] = build
        rows[("call_method", name)] = build
    return rows


#: (fx node op, target: a module class, a function or a method name) -> builder. The one place the
#: importer's vocabulary lives; the config's op names and arguments are PyTorch's (README, Ops).
TABLE: dict[tuple[str, Any], Builder] = {
    **_pointwise("relu", functions=(F.relu, torch.relu), methods=("relu",), modules=(nn.ReLU,)),
    **_pointwise("relu6", functions=(F.relu6,), modules=(nn.ReLU6,)),
    **_pointwise("leaky_relu", ["negative_slope"], {"negative_slope": 0.01}, ["negative_slope"],
                 functions=(F.leaky_relu,), modules=(nn.LeakyReLU,)),
    **_pointwise("gelu", ["approximate"], {"approximate": "none"}, ["approximate"], functions=(F.gelu,),
                 modules=(nn.GELU,)),
    **_pointwise("hardtanh", ["min_val", "max_val"], {"min_val": -1.0, "max_val": 1.0}, ["min_val", "max_val"],
                 functions=(F.hardtanh,), modules=(nn.Hardtanh,)),
    **_pointwise("softplus", ["beta", "threshold"], {"beta": 1.0, "threshold": 20.0}, ["beta", "threshold"],
                 functions=(F.softplus,), modules=(nn.Softplus,)),
    **_pointwise("elu", ["alpha"], {"alpha": 1.0}, ["alpha"], functions=(F.elu,), modules=(nn.ELU,)),
    **_pointwise("celu", ["alpha"], {"alpha": 1.0}, ["alpha"], functions=(F.celu,), modules=(nn.CELU,)),
    **_pointwise("selu", functions=(F.selu, torch.selu), modules=(nn.SELU,)),
    **_pointwise("silu", functions=(F.silu,), modules=(nn.SiLU,)),
    **_pointwise("mish", functions=(F.mish,), modules=(nn.Mish,)),
    **_pointwise("sigmoid", functions=(torch.sigmoid, F.sigmoid), methods=("sigmoid",), modules=(nn.Sigmoid,)),
    **_pointwise("hardsigmoid", functions=(F.hardsigmoid,), modules=(nn.Hardsigmoid,)),
    **_pointwise("hardswish", functions=(F.hardswish,), modules=(nn.Hardswish,)),
    **_pointwise("tanh", functions=(torch.tanh, F.tanh), methods=("tanh",), modules=(nn.Tanh,)),
    **_pointwise("logsigmoid", functions=(F.logsigmoid,), modules=(nn.LogSigmoid,)),
    **_pointwise("softsign", functions=(F.softsign,), modules=(nn.Softsign,)),
    **_pointwise("tanhshrink", functions=(F.tanhshrink,), modules=(nn.Tanhshrink,)),
    **_pointwise("hardshrink", ["lambd"], {"lambd": 0.5}, ["lambd"], functions=(F.hardshrink,), methods=("hardshrink",),
                 modules=(nn.Hardshrink,)),  # F.hardshrink is torch.hardshrink
    **_pointwise("softshrink", ["lambd"], {"lambd": 0.5}, ["lambd"], functions=(F.softshrink,),
                 modules=(nn.Softshrink,)),
    **{key: row for kind in MATH_FUNCTIONS
       for key, row in _pointwise(kind, functions=(getattr(torch, kind),), methods=(kind,)).items()},
    **{row: round_op for row in (("call_function", torch.round), ("call_method", "round"),
                                 ("call_function", torch.special.round))},
    **_pointwise("neg", functions=(torch.neg, operator.neg), methods=("neg",)),
    ("call_function", torch.nan_to_num): nan_to_num,
    ("call_method", "nan_to_num"): nan_to_num,
    ("call_function", torch.clamp): clamp(),
    ("call_method", "clamp"): clamp(),
    ("call_function", torch.clamp_min): clamp(only="min"),
    ("call_method", "clamp_min"): clamp(only="min"),
    ("call_function", torch.clamp_max): clamp(only="max"),
    ("call_method", "clamp_max"): clamp(only="max"),
    ("call_function", F.threshold): threshold_fn,
    ("call_function", torch.threshold): threshold_fn,
    ("call_module", nn.Threshold): threshold_module,
    **_binaries(),
    **_reductions(),
    ("call_function", torch.softmax): softmax("softmax"),
    ("call_function", F.softmax): softmax("softmax", ("dim", "_stacklevel")),
    ("call_method", "softmax"): softmax("softmax"),
    ("call_function", torch.log_softmax): softmax("log_softmax"),
    ("call_function", F.log_softmax): softmax("log_softmax", ("dim", "_stacklevel")),
    ("call_method", "log_softmax"): softmax("log_softmax"),
    ("call_module", nn.Softmax): module_op("softmax", lambda m: {"dim": m.dim}),
    ("call_module", nn.LogSoftmax): module_op("log_softmax", lambda m: {"dim": m.dim}),
    ("call_module", nn.Softmax2d): module_op("softmax", lambda m: {"dim": -3}),  # over dim -3 of a 3-D or 4-D input
    ("call_function", torch.flatten): flatten(0),
    ("call_method", "flatten"): flatten(0),
    ("call_module", nn.Flatten): module_op("flatten", lambda m: {"start_dim": m.start_dim, "end_dim": m.end_dim}),
    ("call_method", "view"): view,
    ("call_method", "reshape"): view,
    ("call_function", torch.reshape): view,
    ("call_function", torch.unflatten): view,
    ("call_method", "unflatten"): view,
    ("call_module", nn.Unflatten): view,
    ("call_function", F.pixel_shuffle): pixel_shuffle_fn,
    ("call_function", torch.pixel_shuffle): pixel_shuffle_fn,
    ("call_module", nn.PixelShuffle): pixel_shuffle_module,
    ("call_function", torch.squeeze): squeeze,
    ("call_method", "squeeze"): squeeze,
    ("call_function", torch.unsqueeze): unsqueeze,
    ("call_method", "unsqueeze"): unsqueeze,
    **_max_pool_fns(),
    ("call_module", nn.GroupNorm): group_norm,
    ("call_module", nn.SyncBatchNorm): sync_batch_norm,
    ("call_module", nn.LayerNorm): layer_norm,
    ("call_function", F.group_norm): group_norm_fn,
    ("call_function", F.instance_norm): instance_norm_fn,
    ("call_function", F.layer_norm): layer_norm_fn,
    ("call_function", F.normalize): lambda site: _channel_import().normalize(site),
    ("call_function", F.glu): lambda site: _gate_import().glu_function(site),
    ("call_module", nn.GLU): lambda site: _gate_import().glu_module(site),
    ("call_function", operator.getitem): lambda site: _slice_import().getitem(site),
    ("call_method", "narrow"): lambda site: _slice_import().narrow(site),
    ("call_function", torch.narrow): lambda site: _slice_import().narrow(site),
    ("call_function", F.batch_norm): batch_norm_fn,
    **{("call_function", fn): dropout_fn(training) for fn, training in _DROPOUT_FUNCTIONS},
    **{("call_module", cls): dropout_module for cls in _DROPOUT_MODULES},
    **{("call_method", name): cast for name in CAST_METHODS},
    **_pow_forms(),
    ("call_module", nn.Identity): identity_module,
    ("call_module", nn.PReLU): prelu_module,
    ("call_function", F.prelu): prelu_fn,
    ("call_function", torch.prelu): prelu_fn,
}


def _alias_rows(table: Mapping[tuple[str, Any], Builder]) -> dict[tuple[str, Any], Builder]:
    """Rows for PyTorch's other names of the ops (ops.TORCH_ALIASES, ops.SPECIAL_NAMES: torch.fix, x.sgn(),
    torch.special.expit), derived from the table: each reads as its op's own torch function or method does."""
    rows: dict[tuple[str, Any], Builder] = {}
    for alias, kind in TORCH_ALIASES.items():
        rows[("call_function", getattr(torch, alias))] = table[("call_function", getattr(torch, kind))]
        rows[("call_method", alias)] = table[("call_method", kind)]
    for name, kind in SPECIAL_NAMES.items():
        rows[("call_function", getattr(torch.special, name))] = table[("call_function", getattr(torch, kind))]
    return rows


def in_place(builder: Builder) -> Builder:
    """An op's in-place form (``x.relu_()``, ``y.mul_(s)``, ``F.elu_(x)``): its out-of-place op where it writes the
    chain's value, which the walk has read only there (a convolution's output that another op also reads is a
    NoChain: derived.overwrites_input); not where it writes another tensor, whose later readers would miss the write."""
    def build(site: Site) -> Mapped:
        if not site.node.args or not site.is_x(site.node.args[0]):
            raise Stop("it writes in place a tensor other than the chain's value")
        return builder(site)
    return build


def _in_place_rows(table: Mapping[tuple[str, Any], Builder]) -> dict[tuple[str, Any], Builder]:
    """The in-place forms of the table's methods and functions (``name_`` of Tensor, torch and torch.nn.functional),
    derived from it: each is its op where it writes the chain's value (in_place)."""
    rows: dict[tuple[str, Any], Builder] = {}
    for (kind, target), builder in table.items():
        if kind == "call_method" and hasattr(torch.Tensor, f"{target}_"):
            rows[("call_method", f"{target}_")] = in_place(builder)
        elif kind == "call_function" and callable(target):
            name = f"{getattr(target, '__name__', '')}_"
            for namespace in (torch, F):
                fn = getattr(namespace, name, None)
                if fn is not None and getattr(namespace, name[:-1], None) is target:
                    rows[("call_function", fn)] = in_place(builder)
    return rows


TABLE.update(_alias_rows(TABLE))
TABLE.update(_in_place_rows(TABLE))


#: Functions of other packages that torch.fx keeps as calls of their own (``torch.fx.wrap``), by module and name:
#: matched without importing the package (a model that uses one has imported it).
NAMED_FUNCTIONS: dict[tuple[str, str], Builder] = {
    ("torchvision.ops.stochastic_depth", "stochastic_depth"): stochastic_depth,
}


#: Modules of other packages the vocabulary takes whole, by module and class name: the trace keeps them as calls
#: (_Tracer), matched without importing the package.
NAMED_MODULES: dict[tuple[str, str], Builder] = {
    ("torchvision.ops.misc", "FrozenBatchNorm2d"): frozen_batch_norm,
    ("detectron2.layers.batch_norm", "FrozenBatchNorm2d"): frozen_batch_norm,
}


def _named_module(module: nn.Module) -> Builder | None:
    cls = type(module)
    return NAMED_MODULES.get((cls.__module__, cls.__qualname__))


def lookup(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Builder | None:
    """The table's builder for a node, None where it is not in the vocabulary; a module with forward hooks has
    a builder that refuses it (_hooked)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        why = _hooked(module)
        if why is not None and not (_is_convolution(gm, node) and hook_derivations(module, str(node.target))):
            return lambda site: why
        for cls in type(module).__mro__:
            if ("call_module", cls) in TABLE:
                return TABLE[("call_module", cls)]
        return _named_module(module)
    if node.op in ("call_function", "call_method"):
        try:
            row = TABLE.get((node.op, node.target))
        except TypeError:  # an unhashable target
            return None
        if row is None and node.op == "call_function":
            key = (getattr(node.target, "__module__", None), getattr(node.target, "__name__", None))
            row = NAMED_FUNCTIONS.get(key)
        return row
    return None
