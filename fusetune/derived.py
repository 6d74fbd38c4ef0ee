"""Operands a chain computes from the model's tensors alone (a batch norm folded by hand, ``self.scale.exp()``,
``torch.sigmoid(self.gate).view(1, -1, 1, 1)``): a ``Derivation``.

The importer takes a binary op's other operand as a per-channel or scalar parameter of the config where the
forward computes it from parameters, buffers and constants only (no input, no value of the chain), by ops that
write nothing and draw nothing. Its value must follow the model's tensors (an optimizer step, ``load_state_dict``,
an in-place edit), so it is never a constant of the import: the derivation is kept as data (the trace's ops, by
their names in torch, torch.nn.functional, operator or as Tensor methods, and the user's tensors by their
attribute paths), which ``compute`` replays on the model's tensors as they are now, at every call of the fused
chain (fusetune/optimizer.py) and when ``load_tuned`` binds a model (fusetune/deploy.py). A derivation is JSON
(``to_json``/``from_json``): the map beside the configs holds it, and replaying it resolves names in those
namespaces alone, never evaluating text.
"""
from __future__ import annotations

import dataclasses
import inspect
import operator
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

#: Where a derivation's functions are looked up, by the prefix the JSON names them with.
NAMESPACES: dict[str, Any] = {"torch": torch, "torch.nn.functional": F, "operator": operator}
#: Ops whose value is not a function of their arguments, never part of a derivation (replayed, it would draw other
#: values, or read uninitialised memory): by these prefixes, substrings (every dropout) and exact names.
UNSTABLE_PREFIXES = ("rand", "empty", "new_empty")
UNSTABLE_SUBSTRINGS = ("dropout",)
UNSTABLE_NAMES = frozenset({"bernoulli", "normal", "log_normal", "poisson", "multinomial", "uniform", "exponential",
                            "cauchy", "geometric", "gumbel_softmax", "rrelu", "new_empty_strided"})
#: The operator module's functions a derivation may call (not its in-place forms, iadd..., nor setitem).
OPERATORS = frozenset(f"operator.{n}" for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos",
                                                "abs", "getitem", "matmul"))
#: The most values a constant of the trace may hold, stored in the JSON.
MAX_CONSTANT = 4096


@dataclasses.dataclass(frozen=True)
class Derivation:
    """How an operand is computed from the model's tensors: ``ops`` in order, each a JSON dict (``tensor``: a
    user tensor by attribute path; ``constant``: a trace constant's values; ``function``/``method``: a call,
    its arguments with ``{"node": name}`` for earlier ops' values), the last one the operand; ``shape`` the shape
    the config declares it in ((C, 1, ..., 1) per channel, () a single value)."""

    ops: tuple[dict[str, Any], ...]
    shape: tuple[int, ...]

    @property
    def node(self) -> str:
        """The trace's node holding the operand (the last op)."""
        return str(self.ops[-1]["name"])

    @property
    def reads(self) -> tuple[str, ...]:
        """The user's tensors it reads, by attribute path."""
        return tuple(op["tensor"] for op in self.ops if "tensor" in op)

    def compute(self, tensor: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """The operand now, in its declared shape, from ``tensor(path)`` (the user's tensor of that path)."""
        env: dict[str, Any] = {}
        device = None
        for op in self.ops:
            if "tensor" in op:
                env[op["name"]] = value = tensor(op["tensor"])
                device = device or value.device
        for op in self.ops:
            if "constant" in op:
                env[op["name"]] = torch.tensor(op["constant"], dtype=getattr(torch, op["dtype"]), device=device)
            elif "function" in op or "method" in op:
                args = _decode(op["args"], env)
                kwargs = {k: _decode(v, env) for k, v in op["kwargs"].items()}
                if "function" in op:
                    prefix, _, name = op["function"].rpartition(".")
                    env[op["name"]] = getattr(NAMESPACES[prefix], name)(*args, **kwargs)
                else:
                    env[op["name"]] = getattr(args[0], op["method"])(*args[1:], **kwargs)
        value = env[self.ops[-1]["name"]]
        return value.reshape(self.shape)

    def describe(self) -> str:
        """The derivation as a line of Python-like text, for the configs' headers and the map."""
        text: dict[str, str] = {}
        for op in self.ops:
            if "tensor" in op:
                text[op["name"]] = op["tensor"]
            elif "constant" in op:
                text[op["name"]] = f"tensor({op['constant']})"
            else:
                args = [_show(a, text) for a in op["args"]] + [f"{k}={_show(v, text)}" for k, v in op["kwargs"].items()]
                text[op["name"]] = (f"{op['function']}({', '.join(args)})" if "function" in op
                                    else f"{args[0]}.{op['method']}({', '.join(args[1:])})")
        return text[self.ops[-1]["name"]]

    def to_json(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "shape": list(self.shape)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Derivation":
        return cls(tuple(doc["ops"]), tuple(int(s) for s in doc["shape"]))


def derivation(gm: torch.fx.GraphModule, node: torch.fx.Node, shape: tuple[int, ...],
               user_tensor: Callable[[torch.fx.Node], bool]) -> tuple[Derivation, list[torch.fx.Node]] | None:
    """The derivation of ``node``'s value (its ops, and the call nodes among them in graph order), where it is
    computed from get_attr nodes alone (``user_tensor(n)``: a tensor of the user's model; else a trace constant of
    at most MAX_CONSTANT values) by calls of NAMESPACES' functions and Tensor methods that write nothing and draw
    nothing; None where it is not (an input or a module call among its sources, an in-place or random op)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    nodes: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current in nodes:
            continue
        if current.op not in ("get_attr", "call_function", "call_method"):
            return None
        nodes.add(current)
        todo.extend(current.all_input_nodes)
    written = written_in_place(gm)
    if any(n.op == "get_attr" and str(n.target) in written for n in nodes):
        return None  # replayed at the fused call, it would read the tensor as the forward's write left it
    ops: list[dict[str, Any]] = []
    calls: list[torch.fx.Node] = []
    for current in sorted(nodes, key=order.__getitem__):
        op = _op(gm, current, user_tensor)
        if op is None:
            return None
        ops.append(op)
        if current.op != "get_attr":
            calls.append(current)
    if not calls:
        return None
    return Derivation(tuple(ops), tuple(shape)), calls


#: Reshapes that keep a tensor's values in their order (a per-channel tensor viewed as (1, C, 1, 1) in the forward):
#: through these the importer reads a model tensor or an input as the values it is (importer.operands._VIEW_METHODS).
RESHAPE_METHODS = frozenset({"view", "reshape", "flatten", "squeeze", "unsqueeze"})
#: Views of a tensor, through which an in-place op writes the tensor itself (``self.u.view(-1).copy_(u)``): the
#: reshapes, and the views that reorder, select or broadcast its values.
VIEW_METHODS = RESHAPE_METHODS | {"view_as", "t", "transpose", "permute", "narrow", "select", "expand", "expand_as",
                                  "detach", "unflatten", "as_strided"}


def written_in_place(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The model's tensors (get_attr targets) that an op of the trace writes in place, directly or through a view:
    ``self.u.copy_(u)`` (a spectral norm's power iteration), ``torch.mul(v, 2, out=self.u)``,
    ``F.relu(self.u, inplace=True)``, ``nn.ReLU(inplace=True)(self.u)``, ``self.u[:2].zero_()``,
    ``torch.flatten(self.u).mul_(2)``. A derivation reading one would be replayed at the fused call on the written
    values, not the ones the forward read before its write.
    (``self.count += 1`` writes nothing in the trace: torch.fx records it as an add and rebinds the attribute;
    ``self.u[0] = 0`` does not trace with the buffer a node, and a trace reading buffers as values has none.)"""
    written: set[str] = set()
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            for target in _written_operands(gm, node):
                base = _viewed(target)
                if isinstance(base, torch.fx.Node) and base.op == "get_attr":
                    written.add(str(base.target))
    return frozenset(written)


def overwrites_input(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether the op overwrites its first operand: PyTorch's in-place forms (a name ending in ``_``: ``x.relu_()``,
    ``F.elu_(x)``, an aten overload's ``copy_.default``) and ``inplace=True`` of the call, by keyword or position
    (``F.relu(x, True)``), or of its module (``nn.ReLU(inplace=True)``)."""
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    name = str(node.target) if node.op == "call_method" else str(getattr(node.target, "__name__", ""))
    name = name.split(".")[0]
    if name.endswith("_") and not name.startswith("_"):
        return True
    if node.op != "call_function":
        return False
    try:
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):
        return bool(node.kwargs.get("inplace", False))
    return bool(bound.arguments.get("inplace", False))


def _written_operands(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[Any, ...]:
    """What a call writes in place: its ``out=`` tensors where it has them, else its first operand where it
    overwrites it (overwrites_input) or is a setitem (``x[i] = v``)."""
    out = node.kwargs.get("out") if node.op != "call_module" else None
    if out is not None:
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    in_place = overwrites_input(gm, node) or node.target is operator.setitem
    return (node.args[0],) if in_place and node.args else ()


def _viewed(value: Any) -> Any:
    """The tensor a view (VIEW_METHODS, as a method or a torch function, an index, an attribute) is of."""
    while isinstance(value, torch.fx.Node) and value.op != "get_attr" and value.args and (
            (value.op in ("call_method", "call_function")
             and (value.target if value.op == "call_method" else getattr(value.target, "__name__", None))
             in VIEW_METHODS)
            or (value.op == "call_function" and value.target in (operator.getitem, getattr))):
        value = value.args[0]
    return value


def _op(gm: torch.fx.GraphModule, node: torch.fx.Node, user_tensor: Callable[[torch.fx.Node], bool]
        ) -> dict[str, Any] | None:
    """One node as a derivation's op, None where it cannot be one."""
    if node.op == "get_attr":
        value = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            return None
        if user_tensor(node):
            return {"name": node.name, "tensor": str(node.target)}
        if value.numel() > MAX_CONSTANT:
            return None
        return {"name": node.name, "constant": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    args = _encode(list(node.args))
    kwargs = {str(k): _encode(v) for k, v in node.kwargs.items()}
    if args is _REFUSED or _REFUSED in kwargs.values():
        return None
    if node.op == "call_method":
        name = str(node.target)
        if name.startswith("_") or not _pure(name) or not callable(getattr(torch.Tensor, name, None)):
            return None
        return {"name": node.name, "method": name, "args": args, "kwargs": kwargs}
    function = _function_name(node.target)
    if function is None or not _pure(function.rpartition(".")[2]) or kwargs.get("inplace") \
            or kwargs.get("out") is not None:
        return None
    if function.startswith("operator.") and function not in OPERATORS:
        return None
    return {"name": node.name, "function": function, "args": args, "kwargs": kwargs}


def _pure(name: str) -> bool:
    """Whether an op of this name writes nothing (PyTorch's in-place forms end with "_") and is a function of its
    arguments (not random, not uninitialised)."""
    if name.endswith("_") and not name.startswith("_"):
        return False
    lowered = name.lower()
    return not (lowered.startswith(UNSTABLE_PREFIXES) or any(w in lowered for w in UNSTABLE_SUBSTRINGS)
                or lowered in UNSTABLE_NAMES)


def _function_name(target: Any) -> str | None:
    """``prefix.name`` of a function of NAMESPACES, None where it is none of theirs."""
    name = getattr(target, "__name__", None)
    for prefix, namespace in NAMESPACES.items():
        if isinstance(name, str) and getattr(namespace, name, None) is target:
            return f"{prefix}.{name}"
    return None


_REFUSED = object()


def _encode(value: Any) -> Any:
    """An fx argument as JSON: nodes by name, slices, Ellipsis, tuples and dtypes tagged; _REFUSED where it
    holds anything else (a device, a memory format)."""
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, slice):
        parts = [_encode(p) for p in (value.start, value.stop, value.step)]
        return _REFUSED if _REFUSED in parts else {"slice": parts}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, (tuple, list)):
        items = [_encode(v) for v in value]
        if any(i is _REFUSED for i in items):
            return _REFUSED
        return {"tuple": items} if isinstance(value, tuple) else items
    return _REFUSED


def _decode(value: Any, env: Mapping[str, Any]) -> Any:
    if isinstance(value, list):
        return [_decode(v, env) for v in value]
    if isinstance(value, dict):
        if "node" in value and len(value) == 1:
            return env[value["node"]]
        if "ellipsis" in value and len(value) == 1:
            return Ellipsis
        if "slice" in value and len(value) == 1:
            return slice(*(_decode(v, env) for v in value["slice"]))
        if "dtype" in value and len(value) == 1:
            return getattr(torch, value["dtype"])
        if "tuple" in value and len(value) == 1:
            return tuple(_decode(v, env) for v in value["tuple"])
        raise ValueError(f"a derivation's argument {value!r} is none of the tagged forms")
    return value


def _show(value: Any, text: Mapping[str, str]) -> str:
    if isinstance(value, dict) and len(value) == 1:
        if "node" in value:
            return text[value["node"]]
        if "ellipsis" in value:
            return "..."
        if "slice" in value:
            return ":".join("" if v is None else _show(v, text) for v in value["slice"][:2]) + (
                f":{value['slice'][2]}" if value["slice"][2] is not None else "")
        if "dtype" in value:
            return f"torch.{value['dtype']}"
        if "tuple" in value:
            return "(" + ", ".join(_show(v, text) for v in value["tuple"]) + ("," if len(value["tuple"]) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v, text) for v in value) + "]"
    return repr(value)
