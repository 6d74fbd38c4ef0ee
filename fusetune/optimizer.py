"""``fusetune.optimize``: a PyTorch model whose convolution chains run as tuned fused kernels.

The model is traced as ``fusetune import`` traces it (torch.fx, else torch.export; in eval mode), each chain the
importer finds is tuned with the search (or read from the cache) and replaced, in a copy of the
model, by a ``FusedChain``. The copy is a ``torch.fx.GraphModule`` holding the user's own
submodules, parameters and buffers (the same tensor objects: nothing is copied, and its
``state_dict`` has the user's names), on the user's device. It has the model's forward, modules and
state, not the model's other methods (it is not an instance of the model's class).

A ``FusedChain`` runs its tuned kernels only where they compute what the model would: eval mode,
inference (no autograd), a CUDA input of a tuned shape and of the dtype the chain was traced in (float32,
float16 or bfloat16: a model in half precision is tuned in it). Everything else runs the chain's
reference path, the user's own ops from the traced graph, exactly as the model would run them:

* training mode: the reference path, so batch norm updates its running statistics (eval-mode
  batch norm runs fused, from the running statistics, as it was tuned);
* autograd (``torch.is_grad_enabled()`` and the input or a parameter of the chain requires grad):
  the reference path, so ``backward`` works; run inference under ``torch.no_grad()`` or
  ``torch.inference_mode()`` to get the kernels;
* a shape not tuned, a CPU tensor, another dtype, a build that failed: the reference path.

Each such fallback is said once through ``logging`` (logger ``fusetune.optimize``), per chain and
reason (per chain and shape for untuned shapes), never per call.

What follows a chain's first fused region is cut into later regions (fusetune/pipeline.py), each a problem
of its own: they are tuned after every chain's first region, within the same budget, and where one's winner
runs kernels the chain's generated model runs them (on the chain's own modules); elsewhere its ops run in
PyTorch inside the chain's kernel path.

Code in the model's forward that reads ``self.training`` for a functional call
(``F.dropout(x, training=self.training)``) is traced in eval mode, as torch.fx fixes such values;
modules (``nn.Dropout``, ``nn.BatchNorm2d``) follow ``.train()`` and ``.eval()`` as usual.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import logging
import operator
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import torch
import torch.nn as nn

from fusetune.dtypes import DEFAULT_DTYPE, DTYPES
from fusetune.errors import FusetuneError

log = logging.getLogger("fusetune.optimize")

#: Seconds ``optimize`` may spend tuning, all chains together (a cached chain costs nothing).
DEFAULT_BUDGET_S = 900.0


def optimize(model: nn.Module, example_inputs: Any, *, budget_s: float = DEFAULT_BUDGET_S,
             cache_dir: str | Path | None = None, trials: int | None = None,
             benchmarker: Callable | None = None, machine: Any = None, cuda_graphs: bool = True) -> nn.Module:
    """A copy of ``model`` with every convolution chain tuned and fused (see the module's docstring).

    ``example_inputs``: a tensor or a sequence of the forward's arguments; each chain is tuned at the
    shape it sees with them. ``budget_s``: seconds for tuning, shared by the chains still untuned
    (cached winners cost none), every chain's first region before any later region; a chain the budget
    does not reach runs its reference path, a later region it does not reach runs in PyTorch.
    ``trials``: per chain (default: the search's). ``benchmarker``: a factory ``(plan, shape) ->
    Benchmarker`` replacing the GPU one (tests drive the search with a fake); with it, ``machine``
    (a ``fusetune.search.Machine``) names the machine the results are cached for.

    The kernels run in eval mode, without autograd (``torch.no_grad()``, ``torch.inference_mode()``),
    on CUDA inputs of a tuned shape, in the dtype each chain was traced in (float32, float16 or bfloat16: the
    configs take it, so a half model's chains are tuned and verified in half); otherwise each chain runs its own eager ops (training
    mode updates batch norm's running statistics; backward works), said once in the log. A chain left
    without tuned kernels (out of budget, or eager won its search) is not replaced at all: it keeps the
    model's own ops, so it costs nothing per call. On a GPU the optimized model is then timed against the
    model on the example inputs (``keep_what_pays``): a chain whose own ops make the whole model faster gets
    them back, and a model still slower than the user's runs every chain's own ops. Without a
    CUDA device (and no benchmarker), the copy keeps every chain on its eager path, and the log says
    why once. ``cuda_graphs``: replay the forward as a CUDA graph per input signature where it runs on the
    GPU without autograd in eval mode (fusetune/graphs.py: a model of many small chains otherwise spends
    longer issuing its forward than the GPU running it); the outputs are the caller's own, cloned out of the
    graph's memory. A model that neither torch.fx nor torch.export traces (control flow on tensor values), or
    whose traces compute other values than its forward on the example inputs (an in-place op torch.fx records
    as a new tensor, where torch.export cannot trace the model either: importer.matching_trace), is returned as it
    is, the very object, with one warning saying why.
    """
    from fusetune.cache import Cache
    from fusetune.search import Machine

    from fusetune.importer import TraceError

    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    clock = _Phases()
    try:
        root, gm = _traced_copy(model, inputs)
    except TraceError as exc:  # no trace computes the model (or none traces it): nothing to replace, said once
        log.warning("fusetune.optimize: %s; the model is returned unchanged", exc)
        return model
    found = _configs(gm, type(model).__name__, "graph" if cuda_graphs else "launch")
    at_example = next((f.chain.example_only() for f in found if f.chain.example_only()), None)
    if at_example is not None:  # a chain fixed at the example's shapes: other input shapes run the model's forward
        gm.meta[AT_EXAMPLE] = at_example
    if machine is None:
        try:
            machine = Machine.detect()
        except FusetuneError as exc:
            log.warning("fusetune.optimize: %s; every chain of %s runs eagerly", exc, type(model).__name__)
            return _finish(model, root, gm, [], inputs)
    dtypes = {x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()}
    if dtypes - set(TRACED_DTYPES):
        log.warning("fusetune.optimize: the chains are tuned in %s, the inputs are %s; every chain runs eagerly",
                    ", ".join(TRACED_DTYPES.values()), ", ".join(sorted(map(str, dtypes))))
        return _finish(model, root, gm, [], inputs)
    cache = Cache(cache_dir)
    clock.mark("trace")
    winners = _tune(found, cache, machine, budget_s, trials, benchmarker)
    clock.mark("cache and search")
    fused: list[FusedChain] = []
    build_now = benchmarker is None and torch.cuda.is_available()
    replaced_by: dict[str, torch.fx.Node] = {}  # a replaced chain's output node's name -> its fused module's call
    others: collections.Counter[str] = collections.Counter()  # why the chains not fused are not (the summary)
    for item in found:
        try:
            chain = FusedChain.make(gm, item, winners.get(item.spec.name), cache, machine.capability, winners,
                                    replaced_by)
        except Exception as exc:  # a generated module that does not take the winner: this chain stays eager
            chain = f"{type(exc).__name__}: {exc}"
        if isinstance(chain, str):
            log.info("fusetune.optimize: %s stays eager: %s", item.spec.name, chain)
            others["cannot be bound to the model's tensors"] += 1
            continue
        if chain.state.kernel_model is None:  # untuned, or eager won: the model's own ops, at no cost per call
            log.info("fusetune.optimize: %s keeps the model's own ops (no tuned kernels)", item.spec.name)
            others["not tuned within the budget" if winners.get(item.spec.name) is None
                   else "beaten by their own ops in the search"] += 1
            continue
        replaced = _replace(gm, item, chain, replaced_by)
        if replaced is not None:
            log.info("fusetune.optimize: %s stays eager: %s", item.spec.name, replaced)
            others["cannot be cut out of the graph"] += 1
            continue
        if build_now:
            chain.load()
        fused.append(chain)
    optimized = _finish(model, root, gm, fused, inputs)
    clock.mark("kernels bound and loaded")
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)  # else the kernels never run
    if cuda_graphs and fused and torch.cuda.is_available():
        from fusetune.graphs import GraphedForward

        optimized._graphs = GraphedForward()
    if build_now and fused and on_gpu and not model.training:
        try:
            keep_what_pays(model, optimized, inputs, fused)
        except Exception as exc:  # a check that cannot time (out of memory, ...) leaves the model as tuned
            for chain in fused:
                chain.pays, chain.kernel_calls = True, 0
            log.warning("fusetune.optimize: the whole-model check did not run (%s: %s); every tuned chain keeps "
                        "its kernels", type(exc).__name__, exc)
        if cuda_graphs:  # the check's graphs (one per set of chains it tried) go, and their memory with them
            optimized._graphs = GraphedForward()
        clock.mark("whole-model check")
    _summarise(type(model).__name__, len(found), fused, others, getattr(optimized, "_graphs", None) is not None)
    log.info("fusetune.optimize: %s took %s", type(model).__name__, clock.text())
    return optimized


class _Phases:
    """Seconds per phase of optimize, said once at the end: a service waiting on a warm start sees whether
    the time goes to tracing, reading the cache (or searching), loading kernels or the whole-model check."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = now - self.last
        self.last = now

    def text(self) -> str:
        parts = ", ".join(f"{phase} {s:.2f} s" for phase, s in self.seconds.items())
        return f"{time.perf_counter() - self.start:.2f} s ({parts})"


def _summarise(name: str, found: int, fused: Sequence["FusedChain"], others: Mapping[str, int], graphs: bool) -> None:
    """One line on what optimize made of the model: how many chains run kernels, and why the others do not."""
    slower = sum(not chain.pays for chain in fused)
    why = {**others, **({"slower in the whole model (optimize's check)": slower} if slower else {})}
    log.info("fusetune.optimize: %s: %d of %d convolution chains run fused kernels%s%s", name, len(fused) - slower,
             found, "; ".join([""] + [f"{n} {reason}" for reason, n in why.items() if n]),
             "; the forward replays from a CUDA graph per input shape" if graphs and len(fused) > slower else "")


#: Timed runs of the whole model (after WHOLE_WARMUP) for optimize's check, and the share of the optimized
#: model's time a chain's own ops must save to replace its kernels (below it: noise).
WHOLE_REPS = 20
WHOLE_WARMUP = 3
WHOLE_SLACK = 0.01


def keep_what_pays(model: nn.Module, optimized: nn.Module, inputs: Sequence[Any], fused: Sequence["FusedChain"],
                   time_ms: Callable[[Callable[[], Any]], float] | None = None) -> list[str]:
    """Time the optimized model against the user's on the example inputs; where it is slower, give chains their
    own ops back, one at a time, keeping each change that makes the whole model faster; where it is still
    slower than the user's, every chain runs its own ops. Returns the names of the chains given their ops back.

    Why: each chain was searched alone, on fresh inputs with the L2 flushed; in the model, neighbours share the
    cache and the GPU, and a chain's gain alone may not survive there. A user asked for a faster model: the
    whole model is the measure. ``time_ms``: a callable's time in ms (default: CUDA events, median); tests pass one."""
    time_ms = time_ms or _median_ms
    for chain in fused:  # the trials below say nothing per chain: the outcome is said once, at the end
        chain._said.add("slower")
    with torch.no_grad():
        eager = time_ms(lambda: model(*inputs))
        best = time_ms(lambda: optimized(*inputs))
        dropped: list[str] = []
        if best > eager:
            for chain in fused:
                chain.pays = False
                now = time_ms(lambda: optimized(*inputs))
                if now < best * (1 - WHOLE_SLACK):
                    best = now
                    dropped.append(chain.name)
                else:
                    chain.pays = True
            if best > eager:
                for chain in fused:
                    chain.pays = False
                dropped = [chain.name for chain in fused]
    for chain in fused:
        chain.kernel_calls = 0  # the check's calls are not the user's
    if dropped:
        log.warning("fusetune.optimize: on the example inputs the optimized model took %.3f ms against the model's "
                    "%.3f ms; %s %s again", best, eager, ", ".join(dropped),
                    "run their own ops" if len(dropped) > 1 else "runs its own ops")
    else:
        log.info("fusetune.optimize: on the example inputs the optimized model takes %.3f ms, the model %.3f ms",
                 best, eager)
    return dropped


def _median_ms(fn: Callable[[], Any]) -> float:
    """The median of WHOLE_REPS runs of ``fn`` on the GPU, as verification times (CUDA events, L2 flushed)."""
    from fusetune.evaluate import median_ms

    return median_ms(fn, reps=WHOLE_REPS, warmup=WHOLE_WARMUP)


# --------------------------------------------------------------------------------------------------
# The copy


def shared_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree whose parameters and buffers are the model's own tensor objects:
    the copy's mode and attributes are its own, its weights the user's."""
    from fusetune.computed_weights import hook_tensors

    memo: dict[int, Any] = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    memo.update(hook_tensors(model))  # weight_norm's and prune's module.weight: recomputed at each call
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:
        raise FusetuneError(f"{type(model).__name__}: cannot copy the model ({type(exc).__name__}: {exc}); optimize "
                            "works on a copy that shares the model's tensors, and leaves the model as it is") from None


def _traced_copy(model: nn.Module, inputs: Sequence[Any]) -> tuple[nn.Module, torch.fx.GraphModule]:
    """The shared copy and its trace (in eval mode: the configs are inference's, and tracing must not
    move the user's running statistics), one that computes the model's forward on the example inputs (a
    TraceError where none does: importer.matching_trace; nothing built on another may replace the model). The
    GraphModule holds the copy's top-level children and tensors themselves, so its names are the user's."""
    from fusetune.importer import matching_trace, trace

    root = shared_copy(model)
    root.eval()
    gm = matching_trace(root, trace(root, inputs, type(model).__name__), inputs, type(model).__name__)
    for name, child in root.named_children():
        setattr(gm, name, child)
    for name, param in root.named_parameters(recurse=False):
        gm.register_parameter(name, param)
    for name, buf in root.named_buffers(recurse=False):
        if name in gm._buffers or not hasattr(gm, name):
            gm.register_buffer(name, buf, persistent=name not in root._non_persistent_buffers_set)
    return root, gm


def _finish(model: nn.Module, root: nn.Module, gm: torch.fx.GraphModule, fused: list["FusedChain"],
            inputs: Sequence[Any]) -> nn.Module:
    """Drop the trace's constants no node reads any more, give every module the user's mode, and where torch.export
    traced the model, run its own forward at other input shapes (ExportedShapes)."""
    from fusetune.exported import TRACED_BY
    from fusetune.importer import CONCRETE_ARGS

    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name in [n for n in gm._buffers if n.startswith("_tensor_constant") and n not in used]:
        del gm._buffers[name]
    gm.graph.lint()
    gm.recompile()
    modes = {name: m.training for name, m in model.named_modules()}
    for name, m in root.named_modules():
        m.training = modes.get(name, model.training)
    gm.training = model.training
    for chain in fused:
        chain.training = model.training
    _share(model, gm)
    if gm.meta.get(TRACED_BY) == "torch.export":
        gm._specialised = ExportedShapes(root, inputs)
    elif gm.meta.get(AT_EXAMPLE):
        gm._specialised = AtExample(root, inputs, gm.meta[AT_EXAMPLE])
    elif gm.meta.get(CONCRETE_ARGS):
        gm._specialised = GivenArguments(root, inputs, gm.meta[CONCRETE_ARGS])
    return gm


class SharedGraphModule(torch.fx.GraphModule):
    """The optimized model: a GraphModule whose tensors are the user's model's own.

    Why more than sharing the tensor objects once: ``.to()``/``.cuda()``/``.double()`` swap a
    parameter's data in place (both models see it) but replace a buffer by a new tensor in the moved
    model alone (a batch norm's running statistics, a registered constant). So each call first takes
    the user's current tensors (the user moved the model: this one follows), and ``_apply`` (what
    ``.to()`` and the like run) takes them, moves them, and gives the moved ones back to the user's
    modules (this one was moved: the user's model follows)."""

    # _shared: (this model's module's _parameters or _buffers, the user's module's, a name), in __dict__;
    # a deep copy has none (torch.fx copies what the graph reads): its tensors are its own, shared with no model.

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _pull(self.__dict__.get("_shared", ()))
        specialised = self.__dict__.get("_specialised")
        if specialised is not None and not specialised.accepts(args, kwargs):  # torch.export's trace: its shapes
            return specialised.run(self, args, kwargs)
        graphs = self.__dict__.get("_graphs")
        if graphs is not None:  # optimize's cuda_graphs: fusetune/graphs.py
            return graphs(self, super().__call__, args, kwargs)
        return super().__call__(*args, **kwargs)

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        _pull(self.__dict__.get("_shared", ()))
        result = super()._apply(*args, **kwargs)
        _push(self.__dict__.get("_shared", ()))
        return result


class ExportedShapes:
    """A model only torch.export traces is specialised to the example's input shapes: its guards fail at any other
    (``Guard failed: x.size()[0] == 2``). There the optimized model runs the model's own forward instead, on the
    shared copy's modules and the user's tensors (what an untuned shape of a torch.fx trace runs, chain by chain),
    said once. A deep copy of the optimized model keeps the trace alone (torch.fx copies what its graph reads)."""

    def __init__(self, root: nn.Module, inputs: Sequence[Any]) -> None:
        self.root = root
        self.signature = _signature(inputs, {})
        self.said = False

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        return _signature(args, kwargs) == self.signature

    def run(self, gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> Any:
        if not self.said:
            self.said = True
            log.info("fusetune.optimize: %s was traced by torch.export, specialised to its example's shapes %s; "
                     "other shapes run the model's own forward", type(self.root).__name__, self.signature)
        for kind in ("_parameters", "_buffers"):  # the top-level tensors the user may have moved (gm pulled them)
            mine, ours = getattr(self.root, kind), getattr(gm, kind)
            for key in list(mine):
                if ours.get(key) is not None:
                    mine[key] = ours[key]
        self.root.training = gm.training
        return self.root(*args, **kwargs)


#: The key of a GraphModule's ``meta`` saying why a chain of it holds at the example's input shapes alone.
AT_EXAMPLE = "fusetune_at_example"


class AtExample(ExportedShapes):
    """A model with a chain whose config holds at the example's input shapes alone (importer.ProducerMatch's
    at_example: a transposed convolution's output_padding, from the output size the forward asked there; another
    model input may give that chain the same input shape and ask another size): other input shapes run the
    model's own forward, said once."""

    def __init__(self, root: nn.Module, inputs: Sequence[Any], why: str) -> None:
        super().__init__(root, inputs)
        self.why = why

    def run(self, gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> Any:
        if not self.said:
            self.said = True
            log.info("fusetune.optimize: %s: %s; input shapes other than the example's %s run the model's own "
                     "forward", type(self.root).__name__, self.why, self.signature)
        return super().run(gm, args, kwargs)


class GivenArguments(ExportedShapes):
    """A forward whose later arguments the example leaves at their defaults (``forward(x, mask=None)``) is traced
    with them as those values (importer.tracing._defaults_not_given): a call that gives one runs the model's own forward,
    said once; any other call runs the trace (at any shape, as torch.fx's)."""

    def __init__(self, root: nn.Module, inputs: Sequence[Any], names: Sequence[str]) -> None:
        super().__init__(root, inputs)
        self.count, self.names = len(inputs), frozenset(names)

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        return len(args) <= self.count and not self.names & kwargs.keys()

    def run(self, gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> Any:
        if not self.said:
            self.said = True
            log.info("fusetune.optimize: %s was traced with %s at their defaults; a call that gives them runs the "
                     "model's own forward", type(self.root).__name__, ", ".join(sorted(self.names)))
        return super().run(gm, args, kwargs)


def _signature(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
    """The shapes and dtypes of a call's tensors (what torch.export's guards check), None for anything else."""
    def one(x: Any) -> Any:
        return (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else None
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _share(model: nn.Module, gm: torch.fx.GraphModule) -> None:
    """Make ``gm`` a SharedGraphModule tied to ``model``'s modules, name by name. The class made here is
    named as torch.fx names its per-instance classes, so that a deep copy is made of SharedGraphModule."""
    shared: list[tuple[dict, dict, str]] = []
    for name, theirs in model.named_modules():
        try:
            ours = gm.get_submodule(name) if name else gm
        except AttributeError:
            continue
        if ours is theirs or isinstance(ours, torch.jit.ScriptModule):  # a scripted one's tensors are its own
            continue
        for kind in ("_parameters", "_buffers"):
            mine, users = getattr(ours, kind), getattr(theirs, kind)
            shared += [(mine, users, key) for key in users if key in mine]
    gm.__class__ = type("GraphModuleImpl", (SharedGraphModule,), {})
    gm._shared = shared
    gm.recompile()  # the forward lives on the instance's class


def _pull(shared: Sequence[tuple[dict, dict, str]]) -> None:
    """Give our modules the user's current tensors. A flat list of (our module's parameters or buffers,
    the user's, a name) keeps it to tens of microseconds for a ResNet-50: it runs before every call."""
    for mine, users, key in shared:
        tensor = users.get(key)
        if tensor is not None and mine.get(key) is not tensor:
            mine[key] = tensor


def _push(shared: Sequence[tuple[dict, dict, str]]) -> None:
    """Give the user's modules our tensors (after ``_apply`` replaced some)."""
    for mine, users, key in shared:
        tensor = mine.get(key)
        if tensor is not None and key in users and users[key] is not tensor:
            users[key] = tensor


# --------------------------------------------------------------------------------------------------
# Chains to configs, configs to winners


@dataclasses.dataclass
class Found:
    chain: Any  # importer.Chain
    spec: Any  # config.ProblemSpec
    weights: dict[str, str]  # generated Model state key -> the user's name
    full: Any = None  # the module of every variant (the search's), once rendered
    later: list["Found"] = dataclasses.field(default_factory=list)  # a chain's later regions of kernels (_tune)
    owner: str | None = None  # of a later region: its chain's config name
    region: int = 0  # of a later region: its place in the chain's pipeline (ModelNew.attach_later's index)
    #: The config's extra inputs (inputs:): config name -> the graph node the fused module is called with.
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Its parameters computed from the model's tensors (fusetune/derived.py): config name -> the Derivation.
    derived: dict[str, Any] = dataclasses.field(default_factory=dict)


def _configs(gm: torch.fx.GraphModule, model_name: str, timing: str = "launch") -> list[Found]:
    """The importer's chains and configs (the longest prefix of each chain that validates), each searched with
    ``timing`` (config.TIMINGS: ``graph`` where the model will replay its forward from a CUDA graph, so that a
    chain's kernels are chosen for what they cost there)."""
    from fusetune.config import parse_config
    from fusetune.importer import _stem, chain_derived, chain_inputs, find_chains, fit_chain

    chains, refused = find_chains(gm)
    for no in refused:
        log.info("fusetune.optimize: no chain at %s: %s", no.node, no.reason)
    found: list[Found] = []
    stem = _stem(model_name)
    precision = conv_precision()
    for chain in chains:
        name = f"{stem}_chain{len(found)}"
        where = f"<{model_name}>/{name}"
        try:
            fitted = fit_chain(chain, name, Path(where))
            if not isinstance(fitted, str):
                steps, raw, weights = fitted
                dtype = _traced_dtype(gm, chain)
                if dtype != DEFAULT_DTYPE:  # the chain computes in it, as traced: so do its kernels
                    raw = {**raw, "dtype": dtype}
                elif raw.get("dtype", DEFAULT_DTYPE) == DEFAULT_DTYPE:  # as the user's own convolutions multiply
                    raw = {**raw, "precision": precision}
                if timing != "launch":
                    raw = {**raw, "search": {**raw.get("search", {}), "timing": timing}}
                found.append(Found(chain, parse_config(raw, where), weights, inputs=chain_inputs(chain, steps),
                                   derived=chain_derived(chain, steps)))
                continue
        except Exception as exc:  # noqa: BLE001 - one chain's trouble never takes the others (or the model) down
            fitted = f"{type(exc).__name__}: {exc}"
        log.info("fusetune.optimize: no chain at %s: %s", chain.producer_node, fitted)
    return found


#: The dtypes a chain may be traced in, as torch and the configs spell them (fusetune.dtypes.DTYPES).
TRACED_DTYPES = {getattr(torch, dtype.torch): name for name, dtype in DTYPES.items()}


def _traced_dtype(gm: torch.fx.GraphModule, chain: Any) -> str:
    """The config dtype of a chain: its convolution's output as traced (float32 where the trace says nothing,
    or a dtype the kernels do not take, which the config then refuses as any other)."""
    from fusetune.importer import _dtype

    node = next((n for n in gm.graph.nodes if n.name == chain.producer_node), None)
    return TRACED_DTYPES.get(_dtype(node), DEFAULT_DTYPE)


def conv_precision() -> str:
    """The config precision of the user's cuDNN convolutions now: ``ieee`` where TF32 is turned off,
    else ``tf32`` (torch's default). The per-operator API (torch.backends.cudnn.conv.fp32_precision,
    'none' inheriting from cudnn's, then the backends') is read first: on a torch that has it, reading
    the legacy allow_tf32 after the new API set a value raises ("a mix of the legacy and new APIs").
    Where all of it says 'none' (the legacy flag was set, which the new API does not show), the
    legacy flag decides."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):
        for owner in (conv, torch.backends.cudnn, torch.backends):
            value = getattr(owner, "fp32_precision", "none")
            if value in ("ieee", "tf32"):
                return value
    try:
        return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"
    except RuntimeError:  # new and legacy settings mixed: the new API's 'none' left nothing set
        return "tf32"


#: A later region's weight in the split of the budget (a first region's is 1): its ops, without the convolution,
#: are the smaller part of its chain's time, so its search has less to gain. The first regions leave this share
#: for each later region still untuned; the later regions get what is left after every first region.
LATER_WEIGHT = 0.5


def _tune(found: list[Found], cache: Any, machine: Any, budget_s: float, trials: int | None,
          benchmarker: Callable | None) -> dict[str, dict[str, Any]]:
    """Each chain's winning variant (config name -> stage values), and each of its later regions' (under the
    region's own name, fusetune/pipeline.py): cached, or searched within the budget left, shared by the
    problems still to go. Sets each chain's ``later`` (its later regions of kernels, as problems).

    Every chain's first region is searched first (the convolution and what fuses with it: most of a chain's
    time), then, with what is left, the later regions of the chains whose first region runs kernels (only
    there does a later region run: a chain without kernels keeps the model's own ops); a first region gets at
    least fusetune.lazy.MIN_SEARCH_S however small its share, a later region no more than is left. A later region is a
    problem like any chain, keyed as ``fusetune search`` keys it (with the chain's ``search.timing``: a config
    of the chain with ``timing: graph`` finds what optimize tuned for a CUDA graph, and the other way round).
    Problems that repeat at the same shape (a network's repeated blocks) are tuned once: the others read
    the cache.

    With the GPU benchmarker (or a budgeted factory, see ``BudgetedFactory``) a search builds only
    the candidates it is about to time (fusetune.lazy): every problem's cheapest batch of a phase is
    submitted to one build pool before the phase's first is timed, so nvcc works for later problems
    meanwhile; the winners' modules are built in that pool at the end, so the returned model loads without
    building.
    """
    from fusetune.lazy import MIN_SEARCH_S

    run = _Tuning(cache, machine, time.monotonic() + budget_s, trials, benchmarker)
    for item in found:
        item.later = run.regions(item)
    todo = run.cached(found)
    later = run.cached([r for item in found if _may_run_kernels(run.winners.get(item.spec.name)) for r in item.later])
    try:
        run.search(todo, reserve=LATER_WEIGHT * len({_problem(r) for r in later}), least_s=MIN_SEARCH_S)
        ready = {item.spec.name for item in found if _runs_kernels(run.winners.get(item.spec.name))}
        run.search([r for r in later if r.owner in ready], reserve=0.0, least_s=0.0)
        run.build_winners([*found, *(r for item in found if item.spec.name in ready for r in item.later)])
    finally:
        run.close()
    return run.winners


def _problem(item: Found) -> str:
    """What a search is of: the problem at its shape (chains and later regions that repeat share one)."""
    return json.dumps([item.spec.canonical(), list(item.spec.shapes[0])], default=list)


def _runs_kernels(variant: Mapping[str, Any] | None) -> bool:
    """Whether a winner runs kernels of its own (not PyTorch's forward, nor torch.compile's of it)."""
    from fusetune.worlds import DEFAULT, WORLDS

    if variant is None:
        return False
    world = WORLDS.get(variant.get("producer", {}).get("impl", DEFAULT))
    return world is None or not world.runs_reference


def _may_run_kernels(variant: Mapping[str, Any] | None) -> bool:
    """Whether a chain's first region may run kernels: it does, or it is not tuned yet."""
    return variant is None or _runs_kernels(variant)


class _Tuning:
    """One optimize run's searches: the winners found, the modules rendered (their hashes key the cache), and,
    under a budgeted factory, the build pool all of them share and each problem's batches (fusetune.lazy)."""

    def __init__(self, cache: Any, machine: Any, deadline: float, trials: int | None,
                 benchmarker: Callable | None) -> None:
        self.cache, self.machine, self.deadline, self.trials = cache, machine, deadline, trials
        self.winners: dict[str, dict[str, Any]] = {}
        self.renders: dict[str, Any] = {}  # problem -> the module of every variant (its hash keys the cache; not built)
        self.factory = benchmarker if benchmarker is not None else _GpuFactory(cache, machine)
        self.budgeted = getattr(self.factory, "budgeted", False)
        self.pool: Any = None
        self.batches: dict[str, Any] = {}  # problem -> its fusetune.lazy.Batches

    def regions(self, item: Found) -> list[Found]:
        """The chain's later regions of kernels, each a problem of its own at the tensor's shape."""
        from fusetune.pipeline import later_segments
        from fusetune.plan import make_plan

        try:
            return [Found(item.chain, segment.spec, {}, owner=item.spec.name, region=segment.index)
                    for segment in later_segments(make_plan(item.spec)) if segment.spec is not None]
        except Exception as exc:  # its later regions stay in PyTorch; the chain itself is tuned as ever
            log.warning("fusetune.optimize: %s: its later regions: %s: %s", item.spec.name, type(exc).__name__, exc)
            return []

    def cached(self, items: list[Found]) -> list[Found]:
        """The items still to search; the others' cached winners are read (what tune_shape would return,
        without its work). Renders each problem's module of every variant once (``item.full``)."""
        from fusetune.cache import make_key
        from fusetune.codegen import render
        from fusetune.plan import make_plan
        from fusetune.search import key_fields

        todo: list[Found] = []
        for item in items:
            try:  # everything of one problem, its render and its cache entry too
                problem = _problem(item)
                if problem not in self.renders:
                    self.renders[problem] = render(make_plan(item.spec))
                item.full = self.renders[problem]
                entry = self.cache.load(make_key(key_fields(item.spec, item.spec.shapes[0], self.machine,
                                                            item.full.source_hash)))
                if entry is not None and entry.winner is not None:
                    self.winners[item.spec.name] = dict(entry.winner["variant"])
                else:
                    todo.append(item)
            except Exception as exc:  # one problem's trouble never takes the others (or the model) down
                log.warning("fusetune.optimize: %s not tuned: %s: %s", item.spec.name, type(exc).__name__, exc)
        return todo

    def _schedule(self, todo: list[Found]) -> None:
        """Every problem's cheapest batch builds now, in the order they are timed; then every problem's other
        starts (the search's first queue), so that nvcc works for later problems while earlier ones are timed."""
        from fusetune.lazy import Batches, BuildPool, starts
        from fusetune.plan import make_plan

        if self.pool is None:
            self.pool = BuildPool(self.factory.builder)
        first: dict[str, list[Any]] = {}
        for item in todo:
            problem = _problem(item)
            if problem in self.batches:
                continue
            try:
                spec, shape = item.spec, item.spec.shapes[0]
                plan = make_plan(spec)
                first[problem] = starts(spec, plan, shape, self.machine.capability)
                self.batches[problem] = Batches(plan, self.pool, self.deadline, (first[problem] or [None])[0])
            except Exception as exc:
                log.warning("fusetune.optimize: %s: its first batch: %s: %s", item.spec.name, type(exc).__name__, exc)
        for problem, queued in first.items():
            if problem in self.batches:
                self.batches[problem].schedule(queued)

    def search(self, todo: list[Found], reserve: float, least_s: float) -> None:
        """Search ``todo`` in order, each with its share of the budget left: the time left over the distinct
        problems still to go and ``reserve`` (the shares kept for what is searched after these). Under a
        budgeted factory a search gets at least ``least_s`` (its cheapest batch is timed whatever its share)."""
        from fusetune.codegen import plan_space
        from fusetune.plan import make_plan
        from fusetune.search import tune_shape

        if not todo:
            return
        if self.budgeted:
            self._schedule(todo)
        problems = [_problem(item) for item in todo]
        for n, item in enumerate(todo):
            shape = item.spec.shapes[0]
            left = self.deadline - time.monotonic()
            to_go = len(set(problems[n:]) - set(problems[:n]))
            share = max(1.0, left / max(1.0, to_go + reserve))
            make = _out_of_budget
            if left > 1.0:
                make = self.factory
                if self.budgeted:
                    share = max(share, least_s)  # its cheapest candidates, however small its share
                    batches = self.batches.get(problems[n])
                    if batches is None:  # its first batch could not be made: said above
                        continue
                    batches.deadline = time.monotonic() + share
                    make = functools.partial(self.factory, batches=batches)
            try:
                result = tune_shape(item.spec, shape, self.cache, self.machine, make, trials=self.trials,
                                    timeout=share, echo=log.debug)
            except (_OutOfBudget, FusetuneError) as exc:
                log.info("fusetune.optimize: %s %s not tuned: %s", item.spec.name, list(shape), exc)
                continue
            except Exception as exc:  # one problem's trouble never takes the others (or the model) down
                log.warning("fusetune.optimize: %s %s not tuned: %s: %s", item.spec.name, list(shape),
                            type(exc).__name__, exc)
                continue
            finally:
                if problems[n] in self.batches:
                    self.batches[problems[n]].cancel_pending()
            if result.candidate is None:
                log.info("fusetune.optimize: %s %s: %s", item.spec.name, list(shape), result.message or result.status)
                continue
            self.winners[item.spec.name] = plan_space(make_plan(item.spec)).stage_values(result.candidate)
            log.info("fusetune.optimize: %s %s %s: %.4f ms (eager %s ms)", item.spec.name, list(shape), result.status,
                     result.time_ms or float("nan"), f"{result.eager_ms:.4f}" if result.eager_ms else "?")
        if self.pool is not None:
            self.pool.cancel()  # the batches of problems the budget did not reach: what comes next goes first

    def build_winners(self, items: list[Found]) -> None:
        if self.pool is not None:
            _build_winners(items, self.winners, self.pool, self.cache, self.machine.capability)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        close = getattr(self.factory, "close", None)
        if close is not None:
            close()


def _build_winners(found: list[Found], winners: Mapping[str, Mapping[str, Any]], pool: Any, cache: Any,
                   arch: str) -> None:
    """Build every winner's module at once (fusetune.lazy.winner_module: a cuDNN winner's is its chain's
    batch 0, already built), so that loading the model compiles nothing. A failed build is said when its
    chain loads (which then runs eagerly; a later region's, in PyTorch)."""
    futures = []
    for item in found:
        variant = winners.get(item.spec.name)
        if variant is None or variant.get("producer", {}).get("impl") == "eager" or _built(item.full, cache, arch):
            continue  # nothing to run, or the search's module of every variant is built (FusedChain.make takes it)
        try:
            futures.append((item, pool.submit(_winner_module(item, variant))))
        except Exception as exc:
            log.warning("fusetune.optimize: %s: its winner's module: %s: %s", item.spec.name, type(exc).__name__, exc)
    for item, future in futures:
        try:
            future.result()
        except Exception as exc:
            log.warning("fusetune.optimize: %s: its winner's module: %s: %s", item.spec.name, type(exc).__name__, exc)


class _OutOfBudget(Exception):
    def __str__(self) -> str:
        return "the time budget is spent (a later optimize with more budget_s tunes it)"


def _out_of_budget(plan: Any, shape: Any, **_: Any) -> Any:
    raise _OutOfBudget()


class BudgetedFactory(Protocol):
    """A benchmarker factory that builds per batch (fusetune.lazy): ``budgeted`` is True, ``builder``
    builds one module (the pool runs it), and each chain's factory call gets that chain's ``batches``
    (fusetune.lazy.Batches, under the chain's deadline). optimize's own GPU factory is one; tests pass
    one with a fake builder."""

    budgeted: bool
    builder: Callable[[Any], Any]

    def __call__(self, plan: Any, shape: Any, *, batches: Any) -> Any: ...


class _GpuFactory:
    """The GPU's budgeted factory: one evaluation worker for the run, LazyGpuBenchmarker per chain."""

    budgeted = True

    def __init__(self, cache: Any, machine: Any) -> None:
        self.cache, self.machine = cache, machine
        self.worker: Any = None

    def builder(self, module: Any) -> Any:
        from fusetune.build import build

        return build(module, self.cache, arch=self.machine.capability)

    def __call__(self, plan: Any, shape: Any, *, batches: Any) -> Any:
        from fusetune.runner import LazyGpuBenchmarker
        from fusetune.worker import Worker

        if self.worker is None:
            self.worker = Worker()
        left = max(60.0, batches.deadline - time.monotonic())
        return LazyGpuBenchmarker(plan, shape, self.cache, self.machine, self.worker, batches,
                                  open_timeout=left, echo=log.debug)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


# --------------------------------------------------------------------------------------------------
# The fused module


#: The winners' modules rendered in this process, by problem and variant (the sources depend on nothing else).
_RENDERED: dict[str, Any] = {}


def _winner_module(item: Found, variant: Mapping[str, Any]) -> Any:
    """The module of a chain's winner alone (fusetune.lazy.winner_module), rendered once per problem and
    winner in this process: a network repeats its blocks."""
    from fusetune.lazy import winner_module
    from fusetune.plan import make_plan

    memo = json.dumps([item.spec.canonical(), variant], sort_keys=True, default=list)
    if memo not in _RENDERED:
        _RENDERED[memo] = winner_module(make_plan(item.spec), variant)
    return _RENDERED[memo]


@dataclasses.dataclass(frozen=True, eq=False)
class ChainState:
    """What a FusedChain runs on, fixed when it is made (FusedChain.make). The modules and tensors named
    here are the optimized model's own, which hold the user's tensors (SharedGraphModule)."""

    name: str  # the chain's config name
    spec: Any  # its config.ProblemSpec
    reference: torch.fx.GraphModule  # the chain's own ops, on the model's modules: its eager path
    kernel_model: nn.Module | None  # the generated ModelNew bound to the model's tensors; None: untuned
    shapes: frozenset[tuple[int, ...]]  # the input shapes tuned (the kernels run on these alone)
    modules: tuple[nn.Module, ...]  # the modules the reference calls: any in training mode means eager
    tensors: tuple[tuple[nn.Module, str], ...]  # (owner, attribute) of each tensor the chain reads
    #: (ModelNew's owner, attr, model's owner, attr, the declared shape where the user's tensor binds as a view)
    loose: tuple[tuple[nn.Module, str, nn.Module, str, tuple[int, ...] | None], ...]
    root_tensors: tuple[str, ...]  # the model's top-level tensors the reference reads
    root: torch.fx.GraphModule  # the optimized model
    input_node: torch.fx.Node  # the chain's input in the model's graph
    rendered: Any  # the generated module whose kernels are built (codegen.RenderedModule), or None
    cache: Any  # the cache its build goes to
    arch: str | None  # the compute capability it was tuned for
    #: (index, its module, the chain's parameters it reads) of each later region attached to kernel_model
    later: tuple[tuple[int, Any, tuple[str, ...]], ...] = ()
    #: The graph nodes of its extra inputs (the config's inputs:, in order): the fused module's arguments after x.
    input_nodes: tuple[torch.fx.Node, ...] = ()
    #: (name, Derivation) of each parameter of kernel_model computed from the model's tensors at every kernel call
    derived: tuple[tuple[str, Any], ...] = ()


class FusedChain(nn.Module):
    """One chain of the user's model: its tuned kernels where they apply, else its reference path
    (the user's own ops). Registers no parameters or submodules of its own: the model's state
    stays under the user's names, and the tensors are read from the user's modules at every call,
    so ``.to()`` and ``load_state_dict`` on the model reach the kernels too. What it runs on is its
    ``state`` (frozen); what changes is whether its kernels loaded, what the log said, and the count
    of calls that ran the kernels."""

    def __init__(self, state: ChainState) -> None:
        super().__init__()
        for key, value in {"state": state, "_kernels": None, "_said": set(), "kernel_calls": 0, "pays": True}.items():
            object.__setattr__(self, key, value)  # not registered: see the class docstring

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def shapes(self) -> frozenset[tuple[int, ...]]:
        return self.state.shapes

    @property
    def dtype(self) -> torch.dtype:
        """The dtype its kernels take: its config's."""
        return getattr(torch, DTYPES[self.state.spec.dtype].torch)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def make(cls, gm: torch.fx.GraphModule, item: Found, variant: Mapping[str, Any] | None, cache: Any,
             arch: str | None, winners: Mapping[str, Mapping[str, Any]] | None = None,
             replaced_by: Mapping[str, torch.fx.Node] | None = None) -> "FusedChain | str":
        """The fused module of a chain of ``gm`` (not yet in its graph), or why there is none. ``winners``
        (config name -> variant) holds its later regions' (``item.later``): each that runs kernels is attached.
        ``replaced_by``: the calls that replaced earlier chains' outputs, by the output's name (an extra input
        of this chain may be one: a residual's shortcut)."""
        from fusetune.build import load_generated

        reference = _reference_graph(gm, item, replaced_by or {})
        if isinstance(reference, str):
            return reference
        sub, inputs_node, extra_nodes = reference
        ref = torch.fx.GraphModule(gm, sub)
        root_tensors: list[str] = []
        for top in {str(n.target).split(".")[0] for n in sub.nodes if n.op in ("get_attr", "call_module")}:
            value = getattr(gm, top)
            if isinstance(value, nn.Module):
                setattr(ref, top, value)  # the user's module itself, not the trace's partial container
            elif not top.startswith("_tensor_constant"):  # the trace's own constants never move
                root_tensors.append(top)
        modules = [gm.get_submodule(str(n.target)) for n in sub.nodes if n.op == "call_module"]
        tensors = [_owner(gm, user) for user in [*item.weights.values(), *(t for d in item.derived.values()
                                                                          for t in d.reads)]]
        kernel_model = None
        rendered = None
        shapes: set[tuple[int, ...]] = set()
        if variant is not None and variant.get("producer", {}).get("impl") != "eager":
            if _built(item.full, cache, arch):  # the search built every variant here: nothing to compile
                rendered = item.full
            else:
                rendered = _winner_module(item, variant)
            generated = load_generated(rendered.write(cache.module_dir(rendered.name)))
            kernel_model = generated.ModelNew(variant=dict(variant))
            kernel_model.training = False  # not .eval(): that would reach the user's modules once bound
            bound = _bind(kernel_model, gm, item.weights, item.derived)
            if isinstance(bound, str):
                return bound
            loose = bound
            _derive(kernel_model, gm, item.derived)
            shapes = {tuple(s) for s in item.spec.shapes}
            later = _attach_later(kernel_model, item, winners or {}, cache, arch)
        else:
            loose = []
            later = ()
        chain = cls(ChainState(
            name=item.spec.name, spec=item.spec, reference=ref, kernel_model=kernel_model, shapes=frozenset(shapes),
            modules=tuple(modules), tensors=tuple(tensors), loose=tuple(loose), root_tensors=tuple(root_tensors),
            root=gm, input_node=inputs_node, rendered=rendered, cache=cache, arch=arch, later=later,
            input_nodes=tuple(extra_nodes), derived=tuple(item.derived.items()) if kernel_model is not None else ()))
        if variant is None:
            chain._say("untuned", "not tuned (see the log above); it runs eagerly")
        return chain

    # -- running --------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """The chain on ``x`` (the convolution's input) and its extra inputs (a residual's identity), in the
        order of its config's ``inputs:``."""
        why = self._why_eager(x, inputs)
        state = self.state
        if why is None:
            self._bind_tensors()
            self.kernel_calls += 1  # how many calls ran the kernels: what a user (or a test) checks first
            return state.kernel_model(x, *inputs)
        self._say(*why)
        for name in state.root_tensors:
            _set_tensor(state.reference, name, getattr(state.root, name))
        return state.reference(x, *inputs)

    def _bind_tensors(self) -> None:
        """Give the kernels the user's tensors now (``.to()`` replaces a buffer by a new tensor), and the later
        regions the chain's parameters they read (the same objects)."""
        state = self.state
        changed = False
        for owner, attr, user, user_attr, shape in state.loose:
            if shape is not None and _views(getattr(owner, attr, None), getattr(user, user_attr)):
                continue
            changed |= _set_tensor(owner, attr, _user_tensor(user, user_attr, shape))
        changed |= _derive(state.kernel_model, state.root, dict(state.derived))
        if changed:
            for index, _, params in state.later:
                region = state.kernel_model._later.get(index)
                for name in params if region is not None else ():
                    _set_tensor(region, name, getattr(state.kernel_model, name))

    def _why_eager(self, x: Any, inputs: Sequence[Any] = ()) -> tuple[str, str] | None:
        """Why this call takes the reference path (a key for saying it once, and the reason), or None.
        ``inputs``: the chain's extra inputs (a residual's identity), which must be as x is."""
        if self.state.kernel_model is None:
            return ("untuned", "no tuned kernels (not tuned, or eager PyTorch won its search): eager")
        if not self.pays:
            return ("slower", "the whole model ran faster with this chain's own ops than with its kernels "
                              "(optimize's check on the example inputs): eager")
        if self.training or any(m.training for m in self.state.modules):
            return ("training", "training mode: eager, so batch norm updates its running statistics")
        if torch.is_grad_enabled() and (getattr(x, "requires_grad", False)
                                        or any(getattr(o, a).requires_grad for o, a in self.state.tensors)):
            return ("autograd", "autograd is recording (a parameter or the input requires grad): eager, so backward "
                                "works; run under torch.no_grad() or torch.inference_mode() for the kernels")
        if not isinstance(x, torch.Tensor):
            return ("type", f"input of type {type(x).__name__}: eager")
        if tuple(x.shape) not in self.shapes:
            return (f"shape {tuple(x.shape)}", f"shape {list(x.shape)} was not tuned (tuned: "
                                               f"{sorted(map(list, self.shapes))}): eager")
        if not x.is_cuda:
            return ("device", f"input on {x.device}: the kernels run on CUDA; eager")
        dtype = self.dtype
        if x.dtype != dtype:
            return ("dtype", f"input of {x.dtype}: the kernels were tuned for {dtype}; eager")
        for t in inputs:
            if not isinstance(t, torch.Tensor):
                return ("type", f"an extra input of type {type(t).__name__}: eager")
            if torch.is_grad_enabled() and t.requires_grad:
                return ("autograd", "autograd is recording (an extra input requires grad): eager, so backward "
                                    "works; run under torch.no_grad() or torch.inference_mode() for the kernels")
            if not t.is_cuda or t.dtype != dtype:
                return ("device", f"an extra input of {t.dtype} on {t.device}: the kernels take {dtype} on CUDA; "
                                  "eager")
        failed = self.load()
        if failed:
            return ("build", failed)
        return None

    def load(self) -> str | None:
        """Build (or reuse from the cache) the winners' kernels and load them; why not, if they cannot be."""
        if self._kernels is None:
            from fusetune.build import build_and_load

            arch = self.state.arch
            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability()
                arch = f"{major}.{minor}"
            try:
                build_and_load(self.state.rendered, self.state.cache, arch)
                object.__setattr__(self, "_kernels", "")
            except Exception as exc:  # a build that fails leaves the model running, eagerly
                object.__setattr__(self, "_kernels", f"the kernels did not build ({type(exc).__name__}: "
                                                     f"{str(exc)[-500:]}): eager")
            if not self._kernels:
                for index, rendered, _ in self.state.later:
                    try:
                        build_and_load(rendered, self.state.cache, arch)
                    except Exception as exc:  # that region runs in PyTorch, the chain's kernels as ever
                        self.state.kernel_model._later.pop(index, None)
                        self._say(f"later {index}", f"later region {index}'s kernels did not build "
                                                    f"({type(exc).__name__}: {str(exc)[-500:]}): it runs in PyTorch")
        return self._kernels or None

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info("fusetune: %s: %s", self.name, message)

    @property
    def reference(self) -> torch.fx.GraphModule:
        """The chain's own ops, from the user's model (its eager path)."""
        return self.state.reference

    @property
    def kernel_model(self) -> nn.Module | None:
        """The generated ModelNew, bound to the user's tensors (None where the chain is not tuned)."""
        return self.state.kernel_model

    def fold_versions(self) -> tuple:
        """The address and version of each tensor its kernels keep something computed from (the generated
        ModelNew's fold_versions: the cudnn_fused world's fold, the spectral world's weights' spectrum, repeated
        parameters; each kept until its tensor changes), () where none is kept: a CUDA graph of the model is keyed
        by them (fusetune/graphs.py), so that an in-place update gets a graph that computes them again."""
        if self.state.derived:  # recomputed at every call (_derive), so is its fold: a graph captures both
            return ()
        versions = getattr(self.state.kernel_model, "fold_versions", None)
        return versions() if versions is not None else ()

    @property
    def later(self) -> dict[int, nn.Module]:
        """The later regions that run their tuned kernels inside ``kernel_model`` (index -> the region's
        ModelNew, on the chain's modules); the chain's other later regions run in PyTorch there."""
        return dict(self.state.kernel_model._later) if self.state.kernel_model is not None else {}

    def extra_repr(self) -> str:
        nodes = self.state.reference.graph.nodes
        ops = [str(n.target) for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
        later = f"; later regions on kernels {sorted(self.later)}" if self.later else ""
        return f"{self.name}: {' -> '.join(ops)}; tuned shapes {sorted(map(list, self.shapes))}{later}"


def _built(rendered: Any, cache: Any, arch: str | None) -> bool:
    """Whether ``rendered`` has a finished build in the cache for ``arch`` (as fusetune.build names it)."""
    from fusetune.build import finished

    return rendered is not None and arch is not None and finished(
        cache.build_dir(f"{rendered.name}-sm{arch.replace('.', '')}"), arch)


def _attach_later(kernel_model: nn.Module, item: Found, winners: Mapping[str, Mapping[str, Any]], cache: Any,
                  arch: str | None) -> tuple[tuple[int, Any, tuple[str, ...]], ...]:
    """Attach each later region of the chain whose winner runs kernels to the chain's ModelNew (already bound
    to the user's tensors: ModelNew.attach_later gives the region its modules and parameters); (index, the
    module whose kernels it runs, the parameters it reads) of each. One untuned, or whose winner is PyTorch's own ops (cheaper inline in
    the chain's model), or that does not load, runs in PyTorch there."""
    from fusetune.build import load_generated

    attached = []
    for region in item.later:
        variant = winners.get(region.spec.name)
        if not _runs_kernels(variant):
            continue
        try:
            rendered = region.full if _built(region.full, cache, arch) else _winner_module(region, variant)
            generated = load_generated(rendered.write(cache.module_dir(rendered.name)))
            model = generated.ModelNew(variant=dict(variant))
            model.training = False  # not .eval(): attached, it runs the user's modules
            params = tuple(p.name for p in region.spec.parameters)
            for name in params:  # a buffer of the user's in a Parameter's place is given as what it is
                _set_tensor(model, name, getattr(kernel_model, name))
            try:
                kernel_model.attach_later(region.region, model)
            except Exception:
                kernel_model._later.pop(region.region, None)
                raise
            attached.append((region.region, rendered, params))
        except Exception as exc:  # that region runs in PyTorch, the chain's kernels as ever
            log.info("fusetune.optimize: %s stays in PyTorch: %s: %s", region.spec.name, type(exc).__name__, exc)
    return tuple(attached)


def _views(view: Any, tensor: torch.Tensor) -> bool:
    """Whether ``view`` is a view of ``tensor``'s storage as it is now (``.to()`` replaces the storage)."""
    if not isinstance(view, torch.Tensor) or view.device != tensor.device or view.dtype != tensor.dtype:
        return False
    return view.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    """(the module holding the user's tensor ``name``, its attribute): modules outlive ``.to()``, tensors may not."""
    owner, _, attr = name.rpartition(".")
    return (root.get_submodule(owner) if owner else root), attr


def _set_tensor(module: nn.Module, name: str, value: torch.Tensor) -> bool:
    """Make ``module.name`` the tensor object ``value`` (a Parameter stays one, anything else a buffer);
    whether it was another before."""
    if module._parameters.get(name) is value or module._buffers.get(name) is value:
        return False
    module._parameters.pop(name, None)
    module._buffers.pop(name, None)
    module.__dict__.pop(name, None)
    if isinstance(value, nn.Parameter):
        module.register_parameter(name, value)
    else:
        module.register_buffer(name, value, persistent=False)
    return True


def _derive(kernel_model: nn.Module, root: nn.Module, derived: Mapping[str, Any]) -> bool:
    """Compute each derived parameter (fusetune/derived.py) from the user's tensors as they are now, into the
    tensor the kernels read (in place where it is of the value's shape, dtype and device, so that a CUDA graph
    captured around the call replays the computation too); whether a tensor object changed."""
    changed = False
    with torch.no_grad():
        for name, how in derived.items():
            value = how.compute(lambda path: getattr(*_owner(root, path)))
            owner, attr = _owner(kernel_model, name)  # a parameter of the config, or the producer's weight or bias
            current = owner._buffers.get(attr)
            if current is not None and not how.reads and value.device != current.device:  # of constants alone: made
                value = value.to(current.device)  # on the CPU (one of the user's tensors is where the user put them)
            if current is not None and (current.shape, current.dtype, current.device) == (
                    value.shape, value.dtype, value.device):
                current.copy_(value)
            else:
                changed |= _set_tensor(owner, attr, value.detach().clone())
    return changed


#: What a convolution module computes beside its tensors: the user's module replaces the generated one only where
#: these agree (the importer folds a pad before an unpadded convolution into the config's padding and padding_mode,
#: which the user's module does not have: its tensors are then bound one by one).
_MODULE_GEOMETRY = ("kernel_size", "stride", "padding", "dilation", "groups", "output_padding", "padding_mode")


def _bind(kernel_model: nn.Module, root: nn.Module, weights: Mapping[str, str],
          derived: Mapping[str, Any] | None = None) -> list | str:
    """Give the generated ModelNew the user's tensors: a submodule whose every tensor is one user module's
    (the convolution, a norm) becomes that module; the others (a functional convolution's weights, a
    per-channel parameter) are bound at each call. Returns those, or why the chain cannot be bound."""
    ours = {**dict(kernel_model.named_parameters()), **dict(kernel_model.named_buffers())}
    # A batch norm's count of batches is read in training alone, which runs the user's ops: a norm that has
    # none (a FrozenBatchNorm2d, an eval-mode InstanceNorm's statistics) keeps the generated module's.
    missing = sorted(k for k in set(ours) - set(weights) - set(derived or {})
                     if k.rpartition(".")[2] != "num_batches_tracked")
    if missing:
        return f"the generated model's {', '.join(missing)} have no tensor of the model"
    groups: dict[str, list[tuple[str, str]]] = {}
    for key, user in weights.items():
        owner, _, attr = key.rpartition(".")
        groups.setdefault(owner, []).append((attr, user))
    # a module with a tensor the model computes (a weight-normed convolution's weight: fusetune/computed_weights.py)
    # is never the user's module: the kernels read its weight, which _derive computes, not the module's attribute
    computed = {key.rpartition(".")[0] for key in derived or {}}
    loose: list[tuple[nn.Module, str, nn.Module, str, tuple[int, ...] | None]] = []
    for owner, items in groups.items():
        users = {u.rpartition(".")[0] for _, u in items}
        if owner and "." not in owner and owner not in computed and len(users) == 1 and all(
                a == u.rpartition(".")[2] for a, u in items):
            theirs = root.get_submodule(next(iter(users))) if next(iter(users)) else root
            mine = kernel_model.get_submodule(owner)
            if isinstance(theirs, type(mine)) and all(getattr(theirs, a, None) == getattr(mine, a, None)
                                                      for a in _MODULE_GEOMETRY):
                setattr(kernel_model, owner, theirs)
                continue
        target = kernel_model.get_submodule(owner) if owner else kernel_model
        for attr, user in items:
            module, user_attr = _owner(root, user)
            declared = tuple(ours[f"{owner}.{attr}" if owner else attr].shape)
            shape = declared if tuple(getattr(module, user_attr).shape) != declared else None
            _set_tensor(target, attr, _user_tensor(module, user_attr, shape))
            loose.append((target, attr, module, user_attr, shape))
    return loose


def _user_tensor(module: nn.Module, attr: str, shape: tuple[int, ...] | None) -> torch.Tensor:
    """The user's tensor, or where the config declares another shape (a 0-dim scale, a (1, C, 1, 1) bias, as
    the importer maps them) a view of it of that shape (importer.declared_view): the same storage."""
    from fusetune.importer import declared_view

    value = getattr(module, attr)
    return value if shape is None else declared_view(value.detach(), shape)


def _reference_graph(gm: torch.fx.GraphModule, item: Found, replaced_by: Mapping[str, torch.fx.Node]
                     ) -> tuple[torch.fx.Graph, torch.fx.Node, list[torch.fx.Node]] | str:
    """The chain's nodes as a graph of their own: its input (the convolution's) a placeholder, and one after
    it for each extra input (the config's inputs:, a residual's identity), the parameters and constants it
    reads get_attr nodes; or why the chain cannot be cut out. With the graph: its input's node and its extra
    inputs' in the model's graph (what the fused module is called with)."""
    from fusetune.importer import match_producer

    nodes = {n.name: n for n in gm.graph.nodes}
    inside = {nodes[name] for name in item.chain.nodes if name in nodes}
    out = nodes.get(item.chain.output_node)
    match = match_producer(gm, nodes[item.chain.producer_node])
    if out is None or match is None or isinstance(match, str):
        return "its nodes are not in the traced graph"
    returned = _returned_producer(item, nodes)  # the convolution's output where the chain returns it too
    for node in inside - {out} - set(returned):
        outside = [u.name for u in node.users if u not in inside]
        if outside and node.name not in item.chain.sizes:  # a size: _replace gives its readers its traced value
            return f"{node.name} is also read by {', '.join(outside)}"
    sub = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {match.input: sub.placeholder("x")}
    extra: list[torch.fx.Node] = []
    for name, node_name in item.inputs.items():
        node = nodes.get(node_name) or replaced_by.get(node_name)  # another chain's output: its fused call now
        if node is None:
            return f"its input {node_name} is not in the traced graph"
        extra.append(node)
        env.setdefault(node, sub.placeholder(name))  # x itself may be an extra input: read as x

    # a derived operand's nodes that the model also reads outside the chain (importer.settle_derived): the
    # reference computes them again from the model's tensors, as the kernels' binding does (fusetune/derived.py)
    again = {op["name"] for how in item.derived.values() for op in how.ops}

    def arg(node: torch.fx.Node) -> torch.fx.Node:
        if node not in env:
            if node.op == "get_attr":
                env[node] = sub.get_attr(node.target)
            elif node.name in again:
                env[node] = sub.node_copy(node, arg)
            else:
                raise _Outside(node.name)
        return env[node]

    try:
        for node in gm.graph.nodes:
            if node in inside:
                env[node] = sub.node_copy(node, arg)
    except _Outside as exc:
        return f"it reads {exc}, computed outside the chain"
    values = {"chain": env[out], "producer": env[returned[0]] if returned else None}
    sub.output(tuple(values[name] for name in item.spec.outputs) if len(item.spec.outputs) > 1 else env[out])
    return sub, match.input, extra


def _returned_producer(item: Found, nodes: Mapping[str, torch.fx.Node]) -> list[torch.fx.Node]:
    """The convolution's node and its identity aliases where the chain's config returns its output too (``outputs:
    [chain, producer]``: ops outside the chain read it, importer.producer_outside), else none."""
    if not item.spec.returns_producer:
        return []
    return [nodes[name] for name in item.chain.producer_values if name in nodes]


class _Outside(Exception):
    pass


def _replace(gm: torch.fx.GraphModule, item: Found, chain: FusedChain,
             replaced_by: dict[str, torch.fx.Node] | None = None) -> str | None:
    """Put ``chain`` in place of its nodes in ``gm``'s graph (one call_module node); why not, if it cannot.
    ``replaced_by`` records the call under the name of the chain's output node it replaces."""
    nodes = {n.name: n for n in gm.graph.nodes}
    inside = [n for n in gm.graph.nodes if n.name in set(item.chain.nodes)]
    out = nodes[item.chain.output_node]
    name = f"fused_{item.spec.name}"
    gm.add_submodule(name, chain)
    with gm.graph.inserting_after(out):
        new = gm.graph.call_module(name, (chain.state.input_node, *chain.state.input_nodes))
    returned = _returned_producer(item, nodes)
    if returned:  # the fused module returns a tuple (config outputs): the chain's value and the convolution's output
        with gm.graph.inserting_after(new):
            value = gm.graph.call_function(operator.getitem, (new, item.spec.outputs.index("chain")))
        with gm.graph.inserting_after(value):
            conv = gm.graph.call_function(operator.getitem, (new, item.spec.outputs.index("producer")))
        for node in returned:  # the ops outside the chain that read it (after its last value: importer.walk_chain)
            for user in [u for u in node.users if u.name not in set(item.chain.nodes)]:
                user.replace_input_with(node, conv)
            if replaced_by is not None:  # a later chain's extra input may be it (a residual's shortcut)
                replaced_by[node.name] = conv
        out.replace_all_uses_with(value)
        new = value
    else:
        out.replace_all_uses_with(new)
    if replaced_by is not None:
        replaced_by[out.name] = new
    _give_sizes(inside, item.chain.sizes)
    attrs = {a for n in inside for a in n.all_input_nodes if a.op == "get_attr"}
    for node in reversed(inside):
        gm.graph.erase_node(node)
    for node in attrs:
        if not node.users:
            gm.graph.erase_node(node)
    return None


def _give_sizes(inside: Sequence[torch.fx.Node], sizes: Mapping[str, Any]) -> None:
    """The ops outside the chain that read a size of its values (an FPN's ``F.interpolate(top,
    size=lateral.shape[-2:])``, importer.Chain.sizes) read that size's traced value instead: the nodes computing
    it go with the chain's; the model runs its own forward at other input shapes (AtExample)."""
    chain = set(inside)
    for node in inside:
        if node.name not in sizes:
            continue
        for user in [u for u in node.users if u not in chain]:
            user.args = torch.fx.node.map_aggregate(user.args, lambda a, n=node: sizes[n.name] if a is n else a)
            user.kwargs = torch.fx.node.map_aggregate(user.kwargs, lambda a, n=node: sizes[n.name] if a is n else a)


def fused_chains(model: nn.Module) -> Iterator[FusedChain]:
    """The FusedChain modules of an optimized model, in order."""
    return (m for m in model.modules() if isinstance(m, FusedChain))
