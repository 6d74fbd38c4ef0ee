"""The importer's second way in: a model torch.fx cannot trace, traced by ``torch.export`` instead.

``torch.fx.symbolic_trace`` runs the forward on proxies, so Python control flow on a shape (``for i in
range(x.shape[1])``, ``if x.size(0) > 1``) or a call it cannot proxy stops it; ``torch.export`` runs it on
fake tensors of the example's shapes and specializes such code to them. Its graph is ATen-level
(``aten.conv2d.default``, ``aten.relu.default``), with parameters read by ``get_attr`` under the user's names.
The importer's vocabulary (``importer.table.TABLE``) is written for the torch level that fx records, so this
module lifts the exported graph back to it: each call of a leaf module of the vocabulary (its ATen nodes,
a batch norm's counter update included) becomes one ``call_module`` of the user's module, and each ATen op
whose torch function takes the same positional arguments becomes that function (``ATEN``). Anything else
stays an ATen node, which the importer reports as not in the vocabulary: a chain ends before it.

The graph is specialized to the example's shapes (its guards stay in it as ``_guards_fn``), and a value that
is not a module's state is fixed as traced: ``F.dropout(x, training=self.training)`` keeps the mode the
model was exported in, as torch.fx fixes it too.
"""
from __future__ import annotations

import contextlib
import io
import logging
import operator
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusetune.ops import SPECIAL_NAMES

aten = torch.ops.aten

def _overload(name: str, overload: str) -> Any:
    """``aten.<name>.<overload>``, or None where this torch has no such overload (the table is the same data
    on every torch; an overload it lacks is never in an exported graph)."""
    packet = getattr(aten, name, None)
    try:
        return getattr(packet, overload) if packet is not None else None
    except AttributeError:
        return None


#: (ATen op, overload, the torch-level function the importer's table knows), where both take the same
#: positional arguments in the same order. An ATen op not listed stays as it is: not in the vocabulary.
_ATEN_ROWS: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    *((name, "default", getattr(torch, name))
      for name in ("relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "neg", "selu", "clamp", "clamp_min",
                   "clamp_max", "clone", "square", "rsqrt", "reciprocal", "erf", "erfc", "log1p", "expm1", "log2",
                   "log10", "exp2", "sin", "cos", "sign", "sgn", "floor", "ceil", "round", "trunc", "fix")),
    *((f"special_{name}", "default", getattr(torch.special, name)) for name in SPECIAL_NAMES),
    ("log_sigmoid", "default", F.logsigmoid),
    *((name, "default", getattr(F, name))
      for name in ("relu6", "hardtanh", "leaky_relu", "gelu", "softplus", "celu", "silu", "mish", "hardsigmoid",
                   "hardswish", "hardshrink", "softshrink", "threshold", "dropout", "adaptive_avg_pool1d",
                   "max_pool1d", "avg_pool1d", "max_pool2d", "max_pool3d", "avg_pool2d", "avg_pool3d",
                   "adaptive_avg_pool2d", "adaptive_avg_pool3d")),
    ("mul", "Tensor", torch.mul), ("mul", "Scalar", torch.mul), ("add", "Tensor", torch.add),
    ("add", "Scalar", torch.add), ("sub", "Tensor", torch.sub), ("sub", "Scalar", torch.sub),
    ("div", "Tensor", torch.div), ("div", "Scalar", torch.div), ("pow", "Tensor_Scalar", torch.pow),
    ("minimum", "default", torch.minimum), ("maximum", "default", torch.maximum),
    ("min", "other", torch.minimum), ("max", "other", torch.maximum),
    ("sum", "dim_IntList", torch.sum), ("mean", "dim", torch.mean), ("amax", "default", torch.amax),
    ("amin", "default", torch.amin), ("logsumexp", "default", torch.logsumexp),
    ("var", "correction", torch.var), ("std", "correction", torch.std), ("var", "dim", torch.var),
    ("std", "dim", torch.std), ("nan_to_num", "default", torch.nan_to_num),
    ("max", "dim", torch.max), ("min", "dim", torch.min),
    ("softmax", "int", torch.softmax), ("log_softmax", "int", torch.log_softmax),
    ("flatten", "using_ints", torch.flatten),
    ("view", "default", torch.reshape), ("reshape", "default", torch.reshape),
    ("_unsafe_view", "default", torch.reshape),
    ("squeeze", "dim", torch.squeeze), ("squeeze", "dims", torch.squeeze), ("squeeze", "default", torch.squeeze),
    ("unsqueeze", "default", torch.unsqueeze),
    ("elu", "default", F.elu),  # only as elu(x[, alpha]): see _positional_ok
    ("glu", "default", F.glu),
    ("pixel_shuffle", "default", F.pixel_shuffle),
    ("pad", "default", F.pad),  # a pad a convolution takes as its padding (importer.producers._fold_pad), as F.pad's call
    # weight norm's computation (a parametrized convolution's weight: fusetune/computed_weights.py)
    ("_weight_norm", "default", torch._weight_norm),
    # functional convolutions (F.conv2d(x, self.weight, ...)): a module's are lifted whole (_lift_modules)
    *((f"conv{d}d", overload, getattr(F, f"conv{d}d")) for d in (1, 2, 3) for overload in ("default", "padding")),
    *((f"conv_transpose{d}d", overload, getattr(F, f"conv_transpose{d}d")) for d in (1, 2, 3)
      for overload in ("default", "input")),
)
ATEN: dict[Any, Callable[..., Any]] = {op: fn for name, overload, fn in _ATEN_ROWS
                                       if (op := _overload(name, overload)) is not None}

#: ATen ops returning (values, indices) where the torch function returns the values: lifted where only
#: ``[0]`` is read.
_WITH_INDICES: dict[Any, Callable[..., Any]] = {
    op: getattr(F, f"adaptive_max_pool{d}d") for d in (1, 2, 3)
    if (op := _overload(f"adaptive_max_pool{d}d", "default")) is not None}

#: ATen casts, which become the method ``x.to(dtype)`` (a cast that keeps the dtype is an identity to the importer), and
#: the checks export puts before them (``_assert_tensor_metadata``: a read of the value's metadata, no value), dropped.
_CASTS = {op for op in (_overload("to", "dtype"),) if op is not None}
_CHECKS = {op for op in (_overload("_assert_tensor_metadata", "default"),) if op is not None}

#: ATen ops whose trailing positional arguments the torch function does not take: (op, how many it takes).
_AT_MOST: dict[Any, int] = {aten.elu.default: 2}


def _in_place_rows() -> dict[Any, tuple[Any, str, Any]]:
    """The in-place forms of ``ATEN``'s ops (``aten.mul_.Tensor``: ``x *= 3`` on a tensor another name holds too, which
    torch.export records as the write it is), derived from it: the in-place overload of each op of the same overload
    name (the same arguments), as the torch-level form the importer's table reads as that op written in place (its
    _in_place_rows): the function ``name_`` beside the op's own in torch or torch.nn.functional (``torch.relu_``,
    ``F.leaky_relu_``), else the Tensor method (``x.mul_(3)``). (its op, the node's op kind, its target), by in-place
    op; an in-place op without such a form stays as it is: not in the vocabulary."""
    rows: dict[Any, tuple[Any, str, Any]] = {}
    for name, overload, fn in _ATEN_ROWS:
        op, written = _overload(name, overload), _overload(f"{name}_", overload)
        if op is None or written is None:
            continue
        short = f"{getattr(fn, '__name__', '')}_"
        function = next((getattr(ns, short) for ns in (torch, F)
                         if getattr(ns, short[:-1], None) is fn and hasattr(ns, short)), None)
        if function is not None:
            rows[written] = (op, "call_function", function)
        elif hasattr(torch.Tensor, short):
            rows[written] = (op, "call_method", short)
    return rows


#: ATen in-place op -> (its out-of-place op, the torch-level node's kind, its target): _in_place_rows.
IN_PLACE = _in_place_rows()



#: The key of a GraphModule's ``meta`` that says which tracer made it, where torch.export did.
TRACED_BY = "fusetune_traced_by"


def export_graph(model: nn.Module, inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """The model as a torch-level GraphModule, by ``torch.export`` (non-strict), sharing the model's modules
    and tensors. Raises what torch.export raises where it cannot trace either (data-dependent control flow)."""
    quiet = io.StringIO()
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:  # export prints the failing graph and warnings on its own: the importer says why, once
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own deprecations inside export, not the user's business
            program = torch.export.export(model, tuple(inputs), strict=False)
            gm = program.module()
    finally:
        logger.setLevel(level)
    for name, child in model.named_children():  # the user's modules themselves (export's are containers)
        setattr(gm, name, child)
    gm.graph.eliminate_dead_code()  # the indices of x.max(dim) and of the pools, where unread
    _constants(gm)
    _lift_modules(gm, model)
    _lift_functions(gm)
    gm.graph.eliminate_dead_code()
    _lift_in_place(gm)
    gm.graph.lint()
    gm.recompile()
    gm.meta[TRACED_BY] = "torch.export"  # specialised to the example's shapes: optimize.ExportedShapes
    return gm


def _leaf_type(model: nn.Module, path: str) -> nn.Module | None:
    """The user's module at ``path`` where it is a leaf of the importer's vocabulary (or a convolution)."""
    from fusetune.importer import _CONV_MODULES, TABLE, _named_module

    try:
        module = model.get_submodule(path) if path else model
    except AttributeError:
        return None
    if type(module) in _CONV_MODULES or any(("call_module", cls) in TABLE for cls in type(module).__mro__) or (
            _named_module(module) is not None):
        return module
    return None


def _innermost(node: torch.fx.Node) -> tuple[str, str] | None:
    """(the call's key, the module's path) of the innermost module call a node belongs to."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    key, (path, _) = list(stack.items())[-1]
    return str(key), str(path)


def _lift_modules(gm: torch.fx.GraphModule, model: nn.Module) -> None:
    """Each call of a vocabulary leaf module, a run of ATen nodes with one outside input (besides the module's
    tensors) and one value read outside, becomes ``call_module`` of the user's module on that input."""
    runs: list[tuple[str, list[torch.fx.Node]]] = []
    last: str | None = None
    for node in gm.graph.nodes:
        if node.op != "call_function":
            if node.op != "call_module":  # _guards_fn, which export puts in the first module's call
                last = None
            continue
        inner = _innermost(node)
        if inner is None or _leaf_type(model, inner[1]) is None:
            last = None
            continue
        if inner[0] == last:
            runs[-1][1].append(node)
        else:
            runs.append((inner[1], [node]))
        last = inner[0]
    for path, nodes in runs:
        inside = set(nodes)
        outer = {a for n in nodes for a in n.all_input_nodes if a not in inside and a.op != "get_attr"}
        read_outside = [n for n in nodes if any(u not in inside for u in n.users)]
        if len(outer) != 1 or len(read_outside) > 1 or (read_outside and read_outside[0] is not nodes[-1]):
            continue
        (source,) = outer
        if any(source in n.all_input_nodes and n.args[:1] != (source,) for n in nodes):
            continue  # the module reads its input other than as its ops' first argument: left as ATen ops
        with gm.graph.inserting_after(nodes[-1]):
            new = gm.graph.call_module(path, (source,))
        new.meta = dict(nodes[-1].meta)
        nodes[-1].replace_all_uses_with(new)
        for node in reversed(nodes):
            gm.graph.erase_node(node)


def _constants(gm: torch.fx.GraphModule) -> None:
    """A tensor made in the forward (``torch.tensor(0.5)``) is exported as ``detach_(lift_fresh_copy(c))`` of
    a lifted attribute: read it directly, under torch.fx's name for such constants (``_tensor_constant*``),
    which the importer reads as a number where it holds one value."""
    wrappers = {op for op in (_overload("lift_fresh_copy", "default"), _overload("detach_", "default"),
                              _overload("detach", "default")) if op is not None}
    renamed: dict[str, str] = {}
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and str(node.target).startswith("lifted_tensor"):
            name = renamed.setdefault(str(node.target), f"_tensor_constant_export{len(renamed)}")
            setattr(gm, name, getattr(gm, str(node.target)))
            node.target = name
        elif node.op == "call_function" and node.target in wrappers and len(node.args) == 1:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and (source.op == "get_attr" or source.target in wrappers):
                node.replace_all_uses_with(source)
                gm.graph.erase_node(node)


def _positional_ok(node: torch.fx.Node, op: Any = None) -> bool:
    """Whether the torch-level form takes the node's positional arguments (``op``: the ATen op whose form it is)."""
    return len(node.args) <= _AT_MOST.get(node.target if op is None else op, len(node.args))


def _lift_in_place(gm: torch.fx.GraphModule) -> None:
    """The in-place forms of ``ATEN``'s ops become their torch-level forms (``IN_PLACE``), after the graph's last dead
    code elimination: torch.fx takes a method call or a torch function for pure, so a write no node reads (``F.relu(
    a[:, :2], inplace=True)`` as a statement) would be dropped, where its ATen op is known to write."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in IN_PLACE and _positional_ok(node, IN_PLACE[node.target][0]):
            node.op, node.target = IN_PLACE[node.target][1:]


def _lift_functions(gm: torch.fx.GraphModule) -> None:
    """ATen ops of ``ATEN`` become their torch functions (the same arguments); ``aten.max.dim``'s tuple, read
    by ``getitem``, stays a tuple (torch.max returns one too)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in ATEN and _positional_ok(node):
            node.target = ATEN[node.target]
        elif node.target in _CASTS:
            node.op, node.target = "call_method", "to"
        elif node.target in _CHECKS and not node.users:
            gm.graph.erase_node(node)
        elif node.target in _WITH_INDICES:
            users = list(node.users)
            if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
                node.target = _WITH_INDICES[node.target]
                users[0].replace_all_uses_with(node)
                gm.graph.erase_node(users[0])
