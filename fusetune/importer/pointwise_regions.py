"""Pointwise regions: elementwise ops on the chain's value that join in one node (an erf GELU, ``torch.where(x > 0, x, x
* s)``), evaluated in float64 on a probe and compared with the vocabulary's activations (REGION_CANDIDATES); where none
matches, the region as an ``expression`` (fusetune/ops/expression.py), accepted where it computes the region's own
values on the probe.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from fusetune.derived import overwrites_input
from fusetune.importer.graph import Entry, _constant, _shape, fetch
from fusetune.importer.idioms import match_idiom
from fusetune.importer.matching import Site
from fusetune.ops import SPECIAL_NAMES, TORCH_ALIASES


#: torch's elementwise functions a user writes an activation with (x * 0.5 * (1 + torch.erf(x / sqrt(2))),
#: torch.where(x > 0, x, x * 0.2)), by name: what ``match_pointwise_region`` may evaluate.
_REGION_TORCH_NAMES: tuple[str, ...] = (
    "add", "sub", "mul", "div", "multiply", "subtract", "divide", "true_divide", "pow", "neg", "erf", "erfc", "tanh",
    "sigmoid", "exp", "expm1", "log", "log1p", "abs", "sqrt", "rsqrt", "square", "where", "clamp", "clamp_min",
    "clamp_max", "relu", "maximum", "minimum", "gt", "ge", "lt", "le",
    # torch.where(x < 0, torch.zeros_like(x), x): a tensor of x's shape, of constants
    "zeros_like", "ones_like", "full_like",
    # x.masked_fill(x < 0, 0.0): a where with a constant
    "masked_fill")
#: Elementwise functions and methods a user writes an activation with: what ``match_pointwise_region`` may evaluate.
#: None reads a shape or a state.
REGION_FUNCTIONS: frozenset[Any] = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.neg, operator.gt,
    operator.ge, operator.lt, operator.le,
    *(getattr(torch, n) for n in _REGION_TORCH_NAMES),
    # torch.special's names of those (an erf GELU written with torch.special.erf)
    *(getattr(torch.special, n) for n, kind in SPECIAL_NAMES.items() if kind in _REGION_TORCH_NAMES),
    *(getattr(F, n) for n in ("relu", "relu6", "softplus", "hardtanh", "sigmoid", "tanh", "silu", "gelu", "elu",
                              "leaky_relu", "hardsigmoid")),
})
REGION_METHODS: frozenset[str] = frozenset({
    "add", "sub", "mul", "div", "multiply", "subtract", "divide", "true_divide", "pow", "neg", "erf", "tanh",
    "sigmoid", "exp", "log", "abs", "sqrt", "rsqrt", "square", "clamp", "clamp_min", "clamp_max", "relu", "gt", "ge",
    "lt", "le", "masked_fill"})
#: What a region of elementwise ops on one value may compute, as the vocabulary writes it: each is checked
#: against the region's own values in float64 (``match_pointwise_region``); leaky_relu's slope is read off
#: the region's value at -1.
REGION_CANDIDATES: tuple[tuple[Entry, Callable[[torch.Tensor], torch.Tensor]], ...] = (
    ({"op": "gelu", "approximate": "none"}, lambda t: F.gelu(t)),
    ({"op": "gelu", "approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
    ({"op": "silu"}, F.silu),
    ({"op": "mish"}, F.mish),
    ({"op": "hardswish"}, F.hardswish),
    ({"op": "relu"}, torch.relu),
    ({"op": "relu6"}, F.relu6),
    ({"op": "elu", "alpha": 1.0}, F.elu),
    ({"op": "selu"}, torch.selu),
    ({"op": "softplus", "beta": 1.0, "threshold": 20.0}, F.softplus),
    ({"op": "sigmoid"}, torch.sigmoid),
    ({"op": "hardsigmoid"}, F.hardsigmoid),
    ({"op": "tanh"}, torch.tanh),
    ({"op": "abs"}, torch.abs),
    ({"op": "softsign"}, F.softsign),  # x / (1 + x.abs()), as torch.export spells F.softsign
    ({"op": "tanhshrink"}, F.tanhshrink),  # x - x.tanh()
)
#: The float64 values a region is compared on: both signs, the kinks (0, +-3, 6), and beyond softplus's
#: threshold.
_PROBE = torch.cat([torch.linspace(-12.0, 12.0, 2401, dtype=torch.float64),
                    torch.tensor([-1.0, 0.0, -3.0, 3.0, 6.0, 1e-4, -1e-4, 25.0, -25.0], dtype=torch.float64)])


_MINUS_ONE = 2401  # _PROBE's index of -1.0


def _region_node(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_function":
        try:
            return node.target in REGION_FUNCTIONS
        except TypeError:
            return False
    return node.op == "call_method" and node.target in REGION_METHODS


def match_pointwise_region(site: Site, readers: Sequence[torch.fx.Node]
                           ) -> tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None:
    """The region of ``_match_region`` over all of x's readers. Where x is the convolution's output, its first
    readers alone (the longest run, in graph order, of two or more) may be the region instead, the others the
    convolution's readers outside it (a residual ``r + gelu(y)`` written out), which the walk reads by name (``by:
    producer``) as it reads them after any op of the table: an op of the vocabulary over fewer readers is taken before
    an expression over all of them (as a value's first join that is one op ends its region), and an expression
    over fewer where none is over all."""
    found = _match_region(site, readers)
    if not site.cur & site.producer or (found is not None and found[1]["op"] != "expression"):
        return found
    order = {n: i for i, n in enumerate(site.gm.graph.nodes)}
    ordered = sorted(readers, key=order.__getitem__)
    fewer = [r for k in range(len(ordered) - 1, 1, -1) if (r := _match_region(site, ordered[:k])) is not None]
    named = [r for r in fewer if r[1]["op"] != "expression"]
    return next(iter(named), found or next(iter(fewer), None))


def _match_region(site: Site, readers: Sequence[torch.fx.Node]
                  ) -> tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None:
    """Elementwise ops on the chain's value x, all of ``readers`` among them, that join in one node J and
    compute one op of the vocabulary however written (an erf GELU, ``torch.where(x > 0, x, x * s)``): every
    node between x and J reads only x, nodes of the region and constants, has x's shape and no reader
    outside the region. The region is evaluated in float64 on ``_PROBE`` and compared with each of
    ``REGION_CANDIDATES`` (leaky_relu's slope read off its value at -1); where none matches at any join, the largest
    region an ``expression`` computes (``_region_expression``: a custom form such as ``x * torch.sigmoid(x + 3) /
    6``): the walk goes on past each join while the ops stay pointwise, so that the value's whole pointwise run is one
    expression, and a join whose expression fails the float64 check leaves the last one that passed. Unless the
    vocabulary's own ops take the readers otherwise (``_expression_fallback``). Returns (the region's nodes, J last;
    the op's entry; J), or None."""
    gm, shape = site.gm, site.shape_in
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    region: list[torch.fx.Node] = []
    frontier = sorted(readers, key=order.__getitem__)
    seen: set[torch.fx.Node] = set()
    fallback: tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None = None  # the largest region an expression takes
    while frontier and len(region) < 16:
        node = frontier.pop(0)
        if node in seen:
            continue
        if not _region_node(gm, node) or overwrites_input(gm, node) or _shape(node) != shape:
            # in place: its input's other readers read the new values
            return _expression_fallback(site, readers, fallback)
        for arg in node.all_input_nodes:
            if not (site.is_x(arg) or arg in seen or arg in frontier or _constant(gm, arg)):
                if arg.op == "get_attr" or order[arg] > order[node]:
                    return _expression_fallback(site, readers, fallback)
                if arg not in region and not any(arg is r for r in readers):
                    return _expression_fallback(site, readers, fallback)  # an input computed outside the region
        seen.add(node)
        region.append(node)
        region.sort(key=order.__getitem__)
        open_ends = [n for n in region if any(u not in seen for u in n.users) or not n.users]
        if len(open_ends) == 1 and open_ends[0] is region[-1] and all(r in seen for r in readers) and all(
                a in seen or site.is_x(a) or _constant(gm, a) for n in region for a in n.all_input_nodes):
            join = region[-1]
            entry = _region_op(gm, site, region, join)
            if entry is not None:
                return region, entry, join
            if (expression := _region_expression(gm, site, region, join)) is not None:
                fallback = list(region), expression, join
        frontier.extend(u for u in node.users if u not in seen and u not in frontier)
        frontier.sort(key=order.__getitem__)
    return _expression_fallback(site, readers, fallback)


def _region_value(gm: torch.fx.GraphModule, site: Site, region: list[torch.fx.Node],
                  join: torch.fx.Node) -> torch.Tensor | None:
    """The region's value at J on ``_PROBE`` (float64), or None where it does not take a 1-D float64 probe."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    env: dict[torch.fx.Node, torch.fx.Node] = {a: x for a in site.cur}
    for node in region:
        env[node] = graph.node_copy(node, lambda a: env[a] if a in env else graph.get_attr(a.target))
    graph.output(env[join])
    try:
        with torch.no_grad():
            value = torch.fx.GraphModule(gm, graph)(_PROBE.clone())
    except Exception:  # noqa: BLE001 - an op that does not take a 1-D float64 probe: no region
        return None
    if not isinstance(value, torch.Tensor) or value.shape != _PROBE.shape or value.dtype != torch.float64:
        return None
    return value


def _region_op(gm: torch.fx.GraphModule, site: Site, region: list[torch.fx.Node], join: torch.fx.Node) -> Entry | None:
    """The candidate op the region computes on ``_PROBE``, or None."""
    value = _region_value(gm, site, region, join)
    if value is None:
        return None
    for entry, fn in REGION_CANDIDATES:
        if torch.allclose(value, fn(_PROBE), rtol=1e-10, atol=1e-12):
            return dict(entry)
    slope = -float(value[_MINUS_ONE])
    if math.isfinite(slope) and torch.allclose(value, F.leaky_relu(_PROBE, slope), rtol=1e-10, atol=1e-12):
        return {"op": "leaky_relu", "negative_slope": slope}
    return None


#: The expression's operator of each arithmetic op of the vocabulary.
_EXPRESSION_SYMBOLS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
#: The region's arithmetic an ``expression`` writes (fusetune/ops/expression.py), by function or method name: the
#: ops' own names and their PyTorch aliases (ops.TORCH_ALIASES: torch.multiply, x.true_divide(...)).
_EXPRESSION_ARITHMETIC: dict[Any, str] = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    **{key: _EXPRESSION_SYMBOLS[op]
       for name, op in [*((n, n) for n in _EXPRESSION_SYMBOLS), *TORCH_ALIASES.items()] if op in _EXPRESSION_SYMBOLS
       for key in (getattr(torch, name), name)}}
#: The torch functions of one value a region's expression calls by their own names.
_EXPRESSION_TORCH_NAMES = ("erf", "erfc", "tanh", "sigmoid", "exp", "expm1", "log", "log1p", "abs", "sqrt", "rsqrt",
                           "square", "relu", "neg")
#: The region's functions of one value an expression calls, by function or method name -> the expression's name
#: (torch.special's names of those functions from ops.SPECIAL_NAMES).
_EXPRESSION_FUNCTIONS: dict[Any, str] = {
    **{getattr(torch, n): n for n in _EXPRESSION_TORCH_NAMES},
    **{getattr(torch.special, n): op for n, op in SPECIAL_NAMES.items() if op in _EXPRESSION_TORCH_NAMES},
    **{getattr(F, n): n for n in ("relu", "relu6", "sigmoid", "tanh", "silu", "hardsigmoid")}, operator.neg: "neg",
    **{n: n for n in ("erf", "tanh", "sigmoid", "exp", "log", "abs", "sqrt", "rsqrt", "square", "relu", "neg")}}
#: The region's extrema and clamps: minimum(a, b), maximum(a, b); a clamp against numbers is their composition.
_EXPRESSION_EXTREMA: dict[Any, str] = {torch.minimum: "minimum", torch.maximum: "maximum"}
_EXPRESSION_CLAMPS: dict[Any, tuple[str, ...]] = {torch.clamp: ("min", "max"), "clamp": ("min", "max"),
                                                   torch.clamp_min: ("min",), "clamp_min": ("min",),
                                                   torch.clamp_max: ("max",), "clamp_max": ("max",)}


def _expression_operand(gm: torch.fx.GraphModule, site: Site, written: Mapping[torch.fx.Node, str],
                        arg: Any) -> str | None:
    """An argument as an expression's text: x, a region node's text, a number (a one-value constant's too)."""
    if site.is_x(arg):
        return "x"
    if isinstance(arg, torch.fx.Node):
        if arg in written:
            return f"({written[arg]})"
        if not _constant(gm, arg):
            return None
        arg = float(fetch(gm, arg.target).item())
    if isinstance(arg, bool) or not isinstance(arg, (int, float)) or not math.isfinite(arg):
        return None
    return f"({float(arg)!r})"


def _expression_node(gm: torch.fx.GraphModule, site: Site, written: Mapping[torch.fx.Node, str],
                     node: torch.fx.Node) -> str | None:
    """One region node as an expression's text over its arguments' texts, or None where the grammar has no form for
    it (a comparison, torch.where, an argument the grammar does not take)."""
    key = node.target
    try:
        known = key in _EXPRESSION_ARITHMETIC or key in _EXPRESSION_FUNCTIONS or key in _EXPRESSION_EXTREMA \
            or key in _EXPRESSION_CLAMPS or key in (operator.pow, torch.pow, "pow")
    except TypeError:  # an unhashable target
        return None
    if not known:
        return None
    kwargs = dict(node.kwargs)
    if kwargs.pop("inplace", False):
        return None
    names = _EXPRESSION_CLAMPS.get(key, ())
    bounds = {name: kwargs.pop(name) for name in names if name in kwargs}
    alpha = kwargs.pop("alpha", 1)
    args = [_expression_operand(gm, site, written, a) for a in node.args]
    if kwargs or None in args:
        return None
    if key in _EXPRESSION_CLAMPS:
        value, *positional = args
        bounds.update(zip(names, node.args[1:]))
        if len(positional) > len(names):
            return None
        out = value
        for name, function in (("min", "maximum"), ("max", "minimum")):
            if bounds.get(name) is not None:
                bound = _expression_operand(gm, site, written, bounds[name])
                if bound is None:
                    return None
                out = f"{function}({out}, {bound})"
        return out
    if alpha != 1 and key not in _EXPRESSION_ARITHMETIC:
        return None
    if key in _EXPRESSION_FUNCTIONS and len(args) == 1:
        return f"{_EXPRESSION_FUNCTIONS[key]}({args[0]})"
    if len(args) != 2:
        return None
    a, b = args
    if key in _EXPRESSION_EXTREMA:
        return f"{_EXPRESSION_EXTREMA[key]}({a}, {b})"
    if key in (operator.pow, torch.pow, "pow"):
        return f"{a} ** {b}"
    symbol = _EXPRESSION_ARITHMETIC[key]
    if alpha != 1:
        scale = _expression_operand(gm, site, written, alpha)
        if symbol not in "+-" or scale is None:
            return None
        b = f"({scale} * {b})"
    return f"{a} {symbol} {b}"


#: The most reads of x an imported expression makes. The grammar has no names: a node read twice is written twice,
#: so a run of x * f(x) forms doubles the text at each; past this the run ends at the last join within it.
EXPRESSION_MAX_READS = 8


def _region_expression(gm: torch.fx.GraphModule, site: Site, region: list[torch.fx.Node],
                       join: torch.fx.Node) -> Entry | None:
    """The region as an ``expression`` entry (x, numbers, arithmetic and the vocabulary's parameter-free functions),
    accepted where it computes the region's own values on ``_PROBE`` in float64; None where a node has no form in
    the grammar, the values differ or x is read more than EXPRESSION_MAX_READS times."""
    from fusetune.ops.expression import ExpressionError, canonical_text, evaluate, parse_expression, reads

    written: dict[torch.fx.Node, str] = {}
    for node in region:
        text = _expression_node(gm, site, written, node)
        if text is None:
            return None
        written[node] = text
    try:
        tree = parse_expression(written[join])
    except ExpressionError:
        return None
    if reads(tree) > EXPRESSION_MAX_READS:
        return None
    value = _region_value(gm, site, region, join)
    with torch.no_grad():
        mine = evaluate(tree, _PROBE.clone())
    if value is None or not isinstance(mine, torch.Tensor) or mine.shape != value.shape or not torch.allclose(
            mine, value, rtol=1e-10, atol=1e-12, equal_nan=True):
        return None
    return {"op": "expression", "expr": canonical_text(written[join])}


def _expression_fallback(site: Site, readers: Sequence[torch.fx.Node],
                         fallback: tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None
                         ) -> tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None:
    """The region an expression computes, where no candidate matched, unless the vocabulary's own ops take the value's
    readers: the convolution's output read again by arithmetic is read by name there (``by: producer``), and
    walk_chain tries an idiom (match_idiom, x * f(x) as silu, mish, hardswish) after the regions. A convolution's
    output that a second function reads (``sigmoid(y) * tanh(y)``) has no such reading: the expression takes it."""
    if fallback is None or match_idiom(site, readers) is not None:
        return None
    if site.cur & site.producer and _read_by_name(site, fallback[0]):
        return None
    return fallback


def _read_by_name(site: Site, region: Sequence[torch.fx.Node]) -> bool:
    """Whether each node of the region that reads x, but the first, is arithmetic (``f(x) * x``): an op the walk
    takes with x read by name (``by: producer``)."""
    readers = [n for n in region if any(site.is_x(a) for a in n.all_input_nodes)]
    return all(_arithmetic(n) for n in readers[1:])


def _arithmetic(node: torch.fx.Node) -> bool:
    try:
        return node.target in _EXPRESSION_ARITHMETIC
    except TypeError:  # an unhashable target
        return False
