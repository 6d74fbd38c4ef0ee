"""Chains: the walk from a convolution through the ops of the vocabulary while each consumes the previous one's value
and nothing else reads it (walk_chain); the convolution's other readers become ``by: producer`` operands, or, outside
the chain after its end, read the convolution's output that the fused chain returns too (producer_outside; the chain is
cut short before one that reads it earlier: _cut_before_early_readers). At each
value the walk tries the subgraphs matched whole (a norm over the channels, a gate, a mean centring, a pointwise region,
an idiom) before the table. A Chain records its steps and the nodes each covers, why it ends, and the sizes and derived
operands that ops outside it read (settle_sizes, settle_derived: run again where fit_chain cuts it shorter).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import torch

from fusetune.derived import Derivation, overwrites_input
from fusetune.importer.builders.identities import _is_identity
from fusetune.importer.graph import (_METADATA_FUNCTIONS, Entry, _describe, _is_convolution, _is_shape_read,
                                     _is_size_arithmetic, _shape)
from fusetune.importer.idioms import match_centring, match_idiom
from fusetune.importer.matching import Site, Stop, _channel_import, _gate_import
from fusetune.importer.operands import DerivedRef, ParamRef
from fusetune.importer.pointwise_regions import match_pointwise_region
from fusetune.importer.producers import _PAD_NOT_TAKEN, ProducerMatch, _folded_pad, _pads_a_convolution, match_producer
from fusetune.importer.table import lookup
from fusetune.ops import Shape
from fusetune.producers import KINDS


@dataclasses.dataclass
class Step:
    entries: list[Entry]  # with ParamRef for per-channel parameters
    nodes: list[str]
    module: str | None  # the user's module holding the op's state
    weights: dict[str, str] | None = None  # a functional norm's tensors: name (weight, bias) -> the user's
    #: the node holding the step's value (its last identity alias): not always the last of ``nodes``, which
    #: also holds the reads of the value's shape that the forward makes after it (``return y, x.shape[-1]``)
    value: str | None = None


@dataclasses.dataclass
class Chain:
    producer_node: str
    producer: Entry
    weights: dict[str, str]  # generated Model state key -> the user's name
    input_shape: Shape
    steps: list[Step]
    producer_nodes: list[str]  # the convolution and its identity aliases
    end: str  # why the chain ends where it does
    end_node: str | None  # the node it ends before, if any
    output_node: str = ""
    producer_readers: list[str] = dataclasses.field(default_factory=list)  # ops reading the convolution's value
    #: The convolution's node and its identity aliases: what an op outside reads where the fused chain returns the
    #: convolution's output too (producer_outside)
    producer_values: list[str] = dataclasses.field(default_factory=list)
    #: The readers of each node of the chain's derived operands (DerivedRef), by name: settle_derived's
    derived_readers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: The convolution's tensors the model computes at every call (ProducerMatch.derived): state key -> how
    producer_derived: dict[str, Derivation] = dataclasses.field(default_factory=dict)
    #: Why its config holds at the traced input shapes alone (ProducerMatch.at_example), None where it holds at any
    at_example: str | None = None
    #: The sizes read off the chain's values that ops outside it read (an FPN's ``F.interpolate(top,
    #: size=lateral.shape[-2:])``), by node name: their values at the traced shapes (settle_sizes)
    sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Every size node of the chain (its reads of its values' shapes, what is computed from them): its value at
    #: the traced shapes and its readers, by name (what settle_sizes needs where the chain is cut shorter)
    size_nodes: dict[str, tuple[Any, list[str]]] = dataclasses.field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return self.producer_nodes + [n for s in self.steps for n in s.nodes]

    def example_only(self) -> str | None:
        """Why the fused chain holds at the traced input shapes alone, None where it holds at any: the
        convolution's (at_example), or the sizes outside ops read off its values, fixed where it is cut out."""
        if self.at_example or not self.sizes:
            return self.at_example
        inside = set(self.nodes)
        readers = sorted({r for name in self.sizes for r in self.size_nodes[name][1] if r not in inside})
        return (f"{', '.join(readers)} read{'s' if len(readers) == 1 else ''} the shape of a value of the chain at "
                f"{self.producer_node} ({', '.join(self.sizes)}), given its size at the traced shapes")


@dataclasses.dataclass
class NoChain:
    """A convolution no chain starts at, and why."""

    node: str
    reason: str


def _aliases(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.fx.Node]:
    out, todo = [node], [node]
    while todo:
        for user in todo.pop().users:
            if _is_identity(gm, user) and user not in out:
                out.append(user)
                todo.append(user)
    return out


def _metadata_closure(reads: Sequence[torch.fx.Node]) -> list[torch.fx.Node]:
    """Reads of a value's shape and the nodes computing only from them and numbers (the sizes a later
    x.view(b, c, d, h, w) takes, ``x.shape[2] * x.shape[3]``: two reads, one product): they go with the chain that
    reads that value, so that cutting the chain out leaves none of them reading a node that is gone."""
    out, todo = list(reads), list(reads)
    while todo:
        for user in todo.pop().users:
            if user in out or user.op != "call_function" or user.target not in _METADATA_FUNCTIONS:
                continue
            if all(arg in out for arg in user.all_input_nodes):
                out.append(user)
                todo.append(user)
    return out


def _readers(gm: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node]) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The nodes reading any of ``nodes``' values (not identity aliases), and those reading only their shape."""
    values: list[torch.fx.Node] = []
    reads: list[torch.fx.Node] = []
    for node in nodes:
        for user in node.users:
            if _is_identity(gm, user):
                continue
            if _is_shape_read(user):
                reads.append(user)
            else:
                values.append(user)
    shapes = _metadata_closure(reads)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return (sorted(dict.fromkeys(values), key=order.__getitem__), sorted(dict.fromkeys(shapes), key=order.__getitem__))


def _gate(gm: torch.fx.GraphModule, values: list[torch.fx.Node], cur: list[torch.fx.Node],
          producer: list[torch.fx.Node], channels: int, dims: int) -> Any:
    """A gated product of two halves of the chain's value whose first nodes are every reader of it (gate_import's
    match_gate; one op, taken as a layer norm over the channels is), or None. ``channels``: the chain's now."""
    if not values:
        return None
    site = Site(gm, values[0], set(cur), set(producer), channels, dims)
    return _gate_import().match_gate(site, values)


def _channel_norm(gm: torch.fx.GraphModule, values: list[torch.fx.Node], cur: list[torch.fx.Node],
                  producer: list[torch.fx.Node], channels: int, dims: int) -> Any:
    """A layer norm over the channels whose first nodes are every reader of the chain's value (channel_import's
    match_channel_norm), or None. ``channels``: the chain's now (half the convolution's after a glu)."""
    if not values:
        return None
    site = Site(gm, values[0], set(cur), set(producer), channels, dims)
    return _channel_import().match_channel_norm(site, values)


def _centring(gm: torch.fx.GraphModule, values: list[torch.fx.Node], cur: list[torch.fx.Node],
              producer: list[torch.fx.Node], channels: int, dims: int,
              first: bool) -> tuple[list[torch.fx.Node], Entry] | None:
    """A mean centring ``x - x.mean(dim, keepdim=True)`` (idioms.match_centring) whose mean and subtraction are every
    reader of the chain's value, or, on the convolution's output (``first``), two of its readers: the others read
    that output outside the chain, which the fused chain returns too (producer_outside: ``return tanh(x -
    x.mean(1, keepdim=True)), x``), or as a later op's operand (``by: producer``). (its nodes; its entry), or None."""
    if len(values) < 2 or (len(values) > 2 and not first):
        return None
    site = Site(gm, values[0], set(cur), set(producer), channels, dims)
    if len(values) == 2:
        return match_centring(site, values)
    for mean in values:  # a mean read by one subtraction among the readers: match_centring checks the rest
        sub = next(iter(mean.users)) if len(mean.users) == 1 else None
        found = match_centring(site, [mean, sub]) if sub in values else None
        if found is not None:
            return found
    return None


def _take_whole(gm: torch.fx.GraphModule, chain: Chain, shape_reads: Sequence[torch.fx.Node],
                nodes: Sequence[torch.fx.Node], entry: Entry, out: torch.fx.Node) -> list[torch.fx.Node]:
    """A subgraph matched as one op (a norm over the channels, a mean centring, a pointwise region, a gate) as the
    chain's next step, covering its nodes, the value's shape reads and the output's aliases; the chain's value
    after it (the output and its aliases)."""
    out_aliases = _aliases(gm, out)
    covered = [s.name for s in shape_reads] + [n.name for n in nodes] + [a.name for a in out_aliases[1:]]
    chain.steps.append(Step([entry], covered, None, value=out_aliases[-1].name))
    return out_aliases


def walk_chain(gm: torch.fx.GraphModule, node: torch.fx.Node, match: ProducerMatch) -> Chain | NoChain:
    """The longest chain from the convolution at ``node`` (before the configs' validation)."""
    in_shape = _shape(match.input)
    if in_shape is None:
        return NoChain(node.name, "the convolution's input shape is unknown")
    producer = _aliases(gm, node)
    dims = KINDS[match.entry["op"]].spatial_dims
    cur = list(producer)
    chain = Chain(node.name, match.entry, dict(match.weights), in_shape, [],
                  [n.name for n in (*match.computes, *match.before, *producer)], "", None,
                  producer_derived=dict(match.derived), at_example=match.at_example)
    if match.crop:  # an uneven pad taken evenly: the chain starts by cropping the convolution's output
        chain.steps.append(Step(list(match.crop), [], None, value=producer[-1].name))
    pending: list[torch.fx.Node] = []  # readers of the convolution's output still to come
    while True:
        channels = _gate_import().channels(int(match.entry["out_channels"]), chain.steps)  # half after a glu over dim 1
        values, shape_reads = _readers(gm, cur)
        first = cur[0] in producer
        if first:
            candidates = values[:1]
            pending = values[1:]
        else:
            candidates = values
        if not candidates:
            chain.end = "its value is not read by any op"
            break
        channel_norm = (_channel_norm(gm, values, cur, producer, channels, dims)
                        or _gate(gm, values, cur, producer, channels, dims))
        if channel_norm is not None:  # a layer norm over the channels, by hand or permuted around one: one op
            nodes, entry, out = channel_norm
            cur = _take_whole(gm, chain, shape_reads, nodes, entry, out)
            continue
        centring = _centring(gm, values, cur, producer, channels, dims, first)
        if centring is not None:  # x - x.mean(dim, keepdim=True): one op, a barrier like a norm
            nodes, entry = centring
            cur = _take_whole(gm, chain, shape_reads, nodes, entry, nodes[-1])
            continue
        if len(values) > 1 and not (first and len(values) > 16):
            site = Site(gm, values[0], set(cur), set(producer), channels, dims)
            region = match_pointwise_region(site, values)
            if region is not None:  # every reader of the value is in one elementwise region: one op
                nodes, entry, join = region
                cur = _take_whole(gm, chain, shape_reads, nodes, entry, join)
                continue
        if len(candidates) > 1:
            site = Site(gm, candidates[0], set(cur), set(producer), channels, dims)
            idiom = match_idiom(site, candidates)
            if idiom is None:
                names = ", ".join(c.name for c in candidates)
                writes = [c.name for c in candidates if overwrites_input(gm, c)]
                chain.end, chain.end_node = (f"its value is read by several ops ({names}), not as x * f(x) for an "
                                             "f of the idioms (swish, mish, hardswish written out)"
                                             + (f"; {', '.join(writes)} writes it in place, so the others read the "
                                                "new values" if writes else "")), None
                break
            inner, entries, mul = idiom
            out_aliases = _aliases(gm, mul)
            covered = [s.name for s in shape_reads] + [n.name for n in inner] + [a.name for a in out_aliases]
            chain.steps.append(Step(entries, covered, None, value=out_aliases[-1].name))
            cur = out_aliases
            continue
        nxt = candidates[0]
        if nxt.op == "output":
            chain.end, chain.end_node = "its value is the model's output", None
            break
        builder = lookup(gm, nxt)
        if builder is None:
            refused = match_producer(gm, nxt) if _is_convolution(gm, nxt) else None
            what = (f"is a convolution fusetune does not take ({refused})" if isinstance(refused, str)
                    else "is a convolution (a chain of its own starts there)" if _is_convolution(gm, nxt)
                    else "pads a convolution's input (that convolution's chain takes it as its padding)"
                    if _folded_pad(gm, nxt) else _PAD_NOT_TAKEN if _pads_a_convolution(gm, nxt)
                    else "is not in the vocabulary")
            chain.end, chain.end_node = f"{_describe(gm, nxt)} {what}", nxt.name
            break
        site = Site(gm, nxt, set(cur), set(producer), channels, dims)
        try:
            mapped = builder(site)
        except Stop as stop:
            chain.end, chain.end_node = f"{_describe(gm, nxt)}: {stop}", nxt.name
            break
        except Exception as exc:  # noqa: BLE001 - arguments no row foresaw: the op stays in PyTorch, named
            mapped = f"its arguments are not in the vocabulary ({type(exc).__name__}: {exc})"
        if isinstance(mapped, str):
            chain.end, chain.end_node = f"{_describe(gm, nxt)}: {mapped}", nxt.name
            break
        shared = [p.name for p in pending if p is not nxt]
        if first and shared and overwrites_input(gm, nxt):
            return NoChain(node.name, f"{_describe(gm, nxt)} writes the convolution's output in place, which "
                                      f"{', '.join(shared)} also reads (after it, so it reads the new values)")
        if nxt in pending:
            pending.remove(nxt)
        views = [v for e in mapped.entries if isinstance(e.get("by"), ParamRef) for v in e["by"].views]
        taken = set(chain.nodes)
        views += [v for e in mapped.entries if isinstance(e.get("by"), DerivedRef) for v in e["by"].nodes
                  if v not in taken and v not in views]
        order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        covered = sorted([s.name for s in shape_reads] + views + [nxt.name] + [e.name for e in mapped.extra],
                         key=order.__getitem__)
        nxt_aliases = _aliases(gm, mapped.out)
        covered += [a.name for a in nxt_aliases[1:]]
        chain.steps.append(Step(mapped.entries, covered, mapped.module, mapped.weights, value=nxt_aliases[-1].name))
        cur = nxt_aliases
    if match.crop:
        cropped = _cropped_chain(chain, len(match.crop))
        if cropped is not None:
            return NoChain(node.name, cropped)
    chain.producer_readers = [r.name for r in _readers(gm, producer)[0]]
    outside = [p.name for p in pending if p.name not in chain.nodes]
    if outside and match.crop:  # the kernels' convolution is the evenly padded one, larger than the user's
        return NoChain(node.name, f"the convolution's output is also read by {', '.join(outside)}, outside the chain, "
                                  "which computes it padded evenly and then crops (its input's pad is uneven)")
    too_early = _cut_before_early_readers(gm, chain)
    if too_early is not None:  # the fused chain hands the convolution's output back at its end: too late for them
        return NoChain(node.name, too_early)
    chain.output_node = _last_value(chain)
    chain.size_nodes = _size_nodes(gm, chain)
    settle_sizes(chain)
    nodes = {n.name: n for n in gm.graph.nodes}
    chain.derived_readers = {name: [u.name for u in nodes[name].users] for step in chain.steps for e in step.entries
                             if isinstance(ref := e.get("by"), DerivedRef) for name in ref.nodes}
    settle_derived(chain)
    chain.producer_values = [n.name for n in producer]
    return chain


def _early_readers(chain: Chain, steps: int, order: dict[str, int]) -> list[str]:
    """The ops outside the chain's first ``steps`` steps that read the convolution's output before those steps' last
    value: the fused call, placed at that value, returns the output too late for them."""
    last = order[_last_value(chain, steps)]
    return [name for name in producer_outside(chain, steps) if order[name] < last]


def _cut_before_early_readers(gm: torch.fx.GraphModule, chain: Chain) -> str | None:
    """Cut the chain before the first op outside it that reads the convolution's output before the chain's last
    value (``y = conv(x); z = tanh(relu(y)); s = y.mean(...)`` between the relu and the tanh): it keeps the longest
    prefix whose last value comes before every such reader, which reads the convolution's output the shortened
    fused chain returns (producer_outside); the ops after the cut stay in PyTorch, reading the chain's value. An
    op of the chain that reads such a reader's value is cut off with the rest or ended the chain already (an
    operand computed from the convolution's output is none of a chain's: Site.operand; a derived operand is
    computed from the model's tensors alone). Why there is no chain where no op of the vocabulary is kept."""
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    early = _early_readers(chain, len(chain.steps), order)
    if not early:
        return None
    k = next(k for k in range(len(chain.steps), -1, -1) if not _early_readers(chain, k, order))
    if not any(step.entries for step in chain.steps[:k]):
        first = next((i + 1 for i, step in enumerate(chain.steps) if step.entries), len(chain.steps))
        return (f"the convolution's output is also read by {', '.join(early)}, outside the chain and before its last "
                f"value {_last_value(chain)}, and before its first op's value {_last_value(chain, first)} too, so "
                "no cut of the chain ends before it (the fused chain returns the convolution's output beside its own "
                "value, at its end)")
    nodes = {n.name: n for n in gm.graph.nodes}
    end = next((n for n in chain.steps[k].nodes if not _is_shape_read(nodes[n])), None)
    readers = _early_readers(chain, k + 1, order)  # those the next step's value would come after
    chain.end = (f"{', '.join(readers)} read{'s' if len(readers) == 1 else ''} the convolution's output before "
                 f"{_last_value(chain, k + 1)}: the chain ends before that, and returns the convolution's output "
                 "beside its own value (outputs: [chain, producer])")
    chain.end_node = end
    chain.steps = chain.steps[:k]
    return None


def producer_outside(chain: Chain, steps: int | None = None) -> list[str]:
    """The ops outside the chain's first ``steps`` steps that read the convolution's output (a VAE block's residual
    ``h + f(silu(group_norm(h)))``, ``return relu(y), y``): the fused chain returns that output too (config
    ``outputs: [chain, producer]``) and they read it there. walk_chain made sure every one comes after the chain's
    last value, cutting the chain before any that came earlier (_cut_before_early_readers); one that fit_chain cut
    off comes after it too."""
    kept = {n for step in (chain.steps[:steps] if steps is not None else chain.steps) for n in step.nodes}
    return [r for r in chain.producer_readers if r not in kept]


def _size_nodes(gm: torch.fx.GraphModule, chain: Chain) -> dict[str, tuple[Any, list[str]]]:
    """Chain.size_nodes: each size node among the chain's nodes, with its value at the traced shapes and its
    readers; one whose value cannot be told is left out (an op outside that reads it keeps the chain eager)."""
    out: dict[str, tuple[Any, list[str]]] = {}
    nodes = {n.name: n for n in gm.graph.nodes}
    for name in chain.nodes:
        node = nodes.get(name)
        if node is None or not (_is_shape_read(node) or _is_size_arithmetic(node)):
            continue
        try:
            value = _traced_size(node)
        except (TypeError, ValueError, IndexError, AttributeError):
            continue
        out[name] = (value, [u.name for u in node.users])
    return out


def settle_sizes(chain: Chain) -> None:
    """The chain's sizes that ops outside it read (Chain.sizes): a read of a chain value's shape (and the size
    arithmetic on it) goes with the chain (_metadata_closure), so where an op outside reads it, the optimizer gives
    that op the size at the traced shapes, and the optimized model runs its own forward at any other shapes.
    Run again where the chain is cut shorter (fit_chain)."""
    inside = set(chain.nodes)
    chain.sizes = {name: value for name, (value, readers) in chain.size_nodes.items()
                   if name in inside and any(r not in inside for r in readers)}


def _traced_size(node: Any) -> Any:
    """What a read of a value's shape (and sizes and numbers computed from it) gives at the traced shapes."""
    if isinstance(node, (tuple, list)):
        return type(node)(_traced_size(a) for a in node)
    if not isinstance(node, torch.fx.Node):
        return node
    if _is_shape_read(node):
        shape = torch.Size(_shape(node.args[0]))
        if node.op == "call_function":
            if node.args[1] not in ("shape", "ndim"):  # a dtype or device: the model's own when it runs, not the trace's
                raise ValueError(f"{node.name} reads {node.args[1]}, not a size")
            return len(shape) if node.args[1] == "ndim" else shape
        if node.target == "dim":
            return len(shape)
        dims = [_traced_size(a) for a in node.args[1:]] + [_traced_size(v) for v in node.kwargs.values()]
        return shape[dims[0]] if dims else shape
    return node.target(*(_traced_size(a) for a in node.args))


def _cropped_chain(chain: Chain, crops: int) -> str | None:
    """A chain that starts by cropping its convolution's output (ProducerMatch.crop) ends before an op reading that
    output as an operand (``by: producer``: the kernels' is the evenly padded one, larger); why there is no chain
    where no op is left after the crop."""
    for i, step in enumerate(chain.steps[1:], start=1):
        if any(e.get("by") == "producer" for e in step.entries):
            chain.end = (f"{step.nodes[0] if step.nodes else '?'} reads the convolution's output, which the chain "
                         "computes padded evenly and then crops (its input's pad is uneven)")
            chain.end_node = step.nodes[0] if step.nodes else None
            chain.steps = chain.steps[:i]
            break
    if len(chain.steps) <= 1 and crops:
        return f"no op of the vocabulary follows the convolution: {chain.end}"
    return None


def settle_derived(chain: Chain) -> None:
    """Leave out of the chain's nodes the derivations' nodes that an op outside the chain reads (another chain's
    operand, the model's output): the model computes them there, and the chain computes its operand again
    from the model's tensors (DerivedRef). Run again where the chain is cut shorter (fit_chain)."""
    derived = {n for step in chain.steps for e in step.entries if isinstance(ref := e.get("by"), DerivedRef)
               for n in ref.nodes}
    if not derived:
        return
    inside = set(chain.nodes)
    changed = True
    while changed:
        changed = False
        for name in sorted(derived & inside):
            if any(user not in inside for user in chain.derived_readers.get(name, ())):
                inside.discard(name)
                changed = True
    for step in chain.steps:
        step.nodes = [n for n in step.nodes if n in inside]


def _last_value(chain: Chain, steps: int | None = None) -> str:
    """The node holding the output of the chain's first ``steps`` steps (all by default): the last step's value (or
    the convolution's)."""
    for step in reversed(chain.steps[:steps] if steps is not None else chain.steps):
        if step.entries or step.nodes:
            return step.value or (step.nodes[-1] if step.nodes else chain.producer_node)
    return chain.producer_node
