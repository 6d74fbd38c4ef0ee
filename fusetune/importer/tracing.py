"""Tracing a model for the import and for ``optimize``: torch.fx's ``symbolic_trace`` with _Tracer (buffer reads kept as
nodes, the vocabulary's modules of other packages kept as calls, parametrized convolutions traced into), else
torch.export lifted back to torch.fx's level (fusetune/exported.py); shapes propagated on fake tensors where every op
has a fake kernel, else by running the model; in-place writes read through (a chain goes on through ``x.mul_(s)``).
``trace_differs`` checks a trace against the model's own forward, since torch.fx records an in-place op on a proxy as a
new tensor; where torch.fx's differs, torch.export's is taken where it computes the model (``matching_trace``). A model
that neither traces, whose trace does not run on its example, or that no trace computes, is a TraceError (exit 2).
"""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import re
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.nn as nn

from fusetune.computed_weights import parametrization_refusal, parametrized_convolution
from fusetune.derived import overwrites_input
from fusetune.errors import FusetuneError
from fusetune.importer.graph import (_CONV_FUNCTIONS, _CONV_MODULES, _call_input, _fetch_or_none, _module_argument,
                                     _shape)
from fusetune.importer.matching import _channel_import
from fusetune.importer.table import _named_module
from fusetune.producers import KINDS, SPATIAL_NAMES


log = logging.getLogger("fusetune.import")

#: torch's loggers that print, with torch's own traceback and to the stderr they were built with (no redirect reaches
#: it), a failure the trace catches: a fake kernel refusing the example's shapes (a pool's window larger than its
#: input) in torch.export's trace or the shapes' propagation. The import says that failure in one line (the fallback
#: run's TraceError, or torch.export's reason), so these are silenced while it traces (_quiet_loggers).
CAUGHT_LOGGERS = ("torch._subclasses.fake_tensor",)


@contextlib.contextmanager
def _quiet_loggers(names: Sequence[str] = CAUGHT_LOGGERS) -> Iterator[None]:
    """CAUGHT_LOGGERS disabled inside the block, as they were after it."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before):
            logger.disabled = disabled


class TraceError(FusetuneError):
    """Neither torch.fx nor torch.export can trace the model (data-dependent control flow), or the traced
    model does not run on the example inputs: bad input, exit 2, nothing written."""

    exit_code = 2


def trace(model: nn.Module, inputs: Sequence[Any], source: str = "<model>") -> torch.fx.GraphModule:
    """``symbolic_trace`` the model and record every node's shape (``node.meta['tensor_meta']``), on fake
    tensors where every op has a fake kernel (nothing computed, no statistic moved), else by running it.
    The model's own modules are shared with the result, so a training-mode batch norm's running
    statistics move when it runs, as they would in the model."""
    concrete = _defaults_not_given(model, inputs)
    try:
        gm = _symbolic_trace(model, concrete)
        if concrete:
            gm.meta[CONCRETE_ARGS] = tuple(concrete)
    except Exception as exc:
        gm = _export_instead(model, inputs, source, exc)
    return _prepared(gm, inputs, source)


def _prepared(gm: torch.fx.GraphModule, inputs: Sequence[Any], source: str) -> torch.fx.GraphModule:
    """A trace as the importer reads it: in-place writes read through, every node's shape recorded, a layer norm over
    tokens' channels moved after their views; a TraceError (exit 2) where it does not run on the example inputs."""
    from torch.fx.passes.shape_prop import ShapeProp

    _read_through_in_place_writes(gm)
    if not _propagate_fake(gm, inputs):
        try:  # ShapeProp prints the failing node's traceback before raising: the error below says it in one line
            with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
                ShapeProp(gm).propagate(*inputs)
        except Exception as exc:
            raise TraceError(f"{source}: running the traced model on the example inputs failed"
                             f"{_failed_at(exc, gm)}") from None
    _channel_import().norm_tokens_last(gm)  # a layer norm over tokens' channels before their views: exactly so
    return gm


def matching_trace(root: nn.Module, gm: torch.fx.GraphModule, inputs: Sequence[Any],
                   source: str = "<model>") -> torch.fx.GraphModule:
    """``gm`` (``trace(root, inputs)``) where it computes what the model's forward does on the example inputs
    (trace_differs), else torch.export's trace of the model where that one does: torch.fx records ``x *= 3`` on a
    proxy as a new tensor, so where ``r = x`` named it too, eager's later reads of ``r`` see the product and the fx
    graph's do not; torch.export runs the forward on fake tensors and records the write on the tensor ``r`` is. A
    TraceError (exit 2) where neither trace computes the model: configs imported from it, and a model optimize
    builds on it, would compute other values, silently."""
    from fusetune.exported import TRACED_BY, export_graph

    differs = trace_differs(root, gm, inputs)
    if differs is None:
        return gm
    if gm.meta.get(TRACED_BY) == "torch.export" or differs.startswith(_OWN_FAILS):  # no other trace, or no use
        raise TraceError(f"{source}: the model's {differs}")
    try:
        with _quiet_loggers():
            exported = _prepared(export_graph(root, inputs), inputs, source)
    except Exception as exc:  # noqa: BLE001 - whatever export raises, the model stays in PyTorch, said once
        raise TraceError(f"{source}: the model's {differs}; nor can torch.export trace it ({_first_line(exc)})"
                         ) from None
    again = trace_differs(root, exported, inputs)
    if again is not None:
        raise TraceError(f"{source}: the model's {differs}; torch.export's {again}")
    log.info("%s: torch.fx's %s; torch.export's trace computes the model's values, and is taken instead", source,
             differs)
    return exported


def trace_differs(root: nn.Module, gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> str | None:
    """How the trace's output differs from the model's own on the example inputs (without autograd, from one
    random state, each on its own copy of the inputs), as a clause for an error, None where it does not.
    torch.fx runs the forward's Python once on proxies: ``out += b`` on a proxy records ``out + b``, so where
    ``out`` was another name's tensor too, the eager forward's later reads of that name see the sum and the
    trace's do not. Nothing else checks a trace: configs imported from it, and a model optimize builds on it,
    would compute other values, silently."""
    from torch.utils import _pytree as pytree

    # a forward that writes a buffer (a spectral norm's power iteration: self.u.copy_(u), a batch norm's statistics)
    # would start the second run from another state: each run starts from the buffers as they were, left so after
    buffers = [(b, b.clone()) for b in root.buffers()]

    def run(fn: Callable[..., Any]) -> list[Any]:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        # every started GPU's generator forked and seeded alike (torch.manual_seed would also seed the others,
        # and queue a seed for a GPU not started yet: the user's random state, changed)
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.default_generator.manual_seed(0)
            for index in devices:
                torch.cuda.default_generators[index].manual_seed(0)
            # an output that is a buffer (or a view of one) would change under the next run's restore: copied
            return [x.clone() if isinstance(x, torch.Tensor) else x for x in pytree.tree_leaves(fn(*copies))]

    try:
        try:
            want = run(root)
        except Exception as exc:  # the user's model itself fails at these inputs (a CPU tensor beside CUDA ones)
            return f"{_OWN_FAILS} on the example inputs ({type(exc).__name__}: {exc})"
        try:
            got = run(gm)
        except Exception as exc:  # the trace ran on the example when traced; a second run may not (state it changed)
            return f"trace fails on the example inputs where its own forward runs ({type(exc).__name__}: {exc})"
    finally:  # the user's buffers as they were, whichever run failed
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    why = _first_difference(want, got)
    if why is None:
        return None
    from fusetune.exported import TRACED_BY

    how = "" if gm.meta.get(TRACED_BY) == "torch.export" else _FX_IN_PLACE
    return f"traced forward differs from its own on the example inputs ({why}){how}"


#: What trace_differs says where the model's own forward fails on the example inputs (no trace can match it).
_OWN_FAILS = "own forward fails"

#: Why torch.fx's trace of a model may compute other values than the model (trace_differs says it after the difference).
_FX_IN_PLACE = (": torch.fx records an in-place op on a proxy as a new tensor (out += b, where out is another name's "
                "tensor too, which eager then reads changed)")


def _first_difference(want: list[Any], got: list[Any]) -> str | None:
    """The first output (pytree leaves) where ``got`` is not ``want``: another shape, or values beyond float
    noise (1e-3 of the output's largest magnitude)."""
    if len(want) != len(got):
        return f"{len(got)} outputs, not {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if not _same_leaf(w, g):
                return f"output {i}: {g!r}, not {w!r}"
            continue
        if w.shape != g.shape:
            return f"output {i} of shape {list(g.shape)}, not {list(w.shape)}"
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return f"output {i}: other values"
            continue
        scale = float(w.abs().nan_to_num(nan=0.0, posinf=0.0).max()) if w.numel() else 1.0
        if not torch.allclose(g.to(w.dtype), w, rtol=1e-3, atol=1e-3 * max(scale, 1e-30), equal_nan=True):
            return f"output {i}: largest difference {float((g.double() - w.double()).abs().nan_to_num().max()):.3g}"
    return None


def _same_leaf(w: Any, g: Any) -> bool:
    """Whether two outputs that are not both tensors are the same: equal, both NaN, or not comparable (a container
    pytree does not open, a dataclass of tensors: assumed the same rather than failing the model)."""
    if isinstance(w, float) and isinstance(g, float) and math.isnan(w) and math.isnan(g):
        return True
    try:
        return bool(w == g)
    except Exception:  # noqa: BLE001 - an object whose == is a tensor's, or raises
        return True


def _failed_at(exc: Exception, gm: torch.fx.GraphModule) -> str:
    """Where and why a traced model failed to run: ShapeProp wraps the op's own error in one that prints the node
    and its metadata; the node's name and the op's error are what the user needs. A convolution given an input of
    another rank is said in fusetune's terms (the rank and layout it expects, the shape it got: torch's own text
    speaks of 'unbatched' inputs, which the kernels never take), and a convolution before the failing node that ran
    on an unbatched input (a 3-D tensor to Conv2d: a batch norm after it fails) is named as the likely cause."""
    cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
    found = re.search(r"ShapeProp error for: node=%(\w+)", str(exc))
    name = found.group(1) if found and cause is not exc else None
    node = next((n for n in gm.graph.nodes if n.name == name), None)
    wrong = _input_rank(gm, node) if node is not None else None
    if wrong is not None:  # where the input is one dim short, PyTorch took the rank: its error says what else failed
        return f" at {name}: {wrong[0]}{f' ({type(cause).__name__}: {cause})' if wrong[1] else ''}"
    earlier = [why[0] for n in gm.graph.nodes if n is not node and (why := _input_rank(gm, n)) is not None]
    hint = f"; before it, {'; '.join(earlier)}" if earlier else ""
    return f"{f' at {name}' if name else ''} ({type(cause).__name__}: {cause}){hint}"


def _input_rank(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[str, bool] | None:
    """Why a convolution node cannot take the input it was given on the example, where that input (as shapes
    propagated so far recorded it) is not of rank 2 + its spatial dims, and whether it is unbatched (one dim short:
    PyTorch takes it, the kernels do not); None where the rank is right, or unknown, or the node is no convolution."""
    if node.op == "call_module":
        module = _fetch_or_none(gm, str(node.target))
        kind, what = _CONV_MODULES.get(type(module)), f"{node.target} ({type(module).__name__})"
    elif node.op == "call_function" and node.target in _CONV_FUNCTIONS:
        kind = _CONV_FUNCTIONS[node.target]
        what = f"{node.name} (F.{kind})"
    else:
        return None
    shape = _shape(_call_input(node))
    if kind is None or shape is None or len(shape) == KINDS[kind].spatial_dims + 2:
        return None
    dims = KINDS[kind].spatial_dims
    unbatched = (" (an unbatched input, which PyTorch takes and the kernels do not: do the example inputs leave out "
                 "the batch dim?)" if len(shape) == dims + 1 else "")
    layout = f"[N, C, {', '.join(SPATIAL_NAMES[dims])}]"
    return f"{what} expects a {dims + 2}-D input {layout}, got {list(shape)}{unbatched}", bool(unbatched)


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, with the modules of other packages that the vocabulary takes whole (NAMED_MODULES: a
    FrozenBatchNorm2d) kept as calls of their own, as torch.nn's modules are."""

    #: A buffer read in the forward is a node of the graph (get_attr), as a parameter is: without it torch.fx
    #: computes arithmetic on buffers alone at trace time (``torch.sqrt(self.bn.running_var + self.bn.eps)``) and
    #: keeps the result as a constant, which a later change of the buffer (load_state_dict) would never reach.
    proxy_buffer_attributes = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The parametrizations (ParametrizationList and its modules) of the convolutions traced into, by id.
        self._into: set[int] = set()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if id(m) in self._into:  # a parametrization of a convolution traced into
            return False
        if parametrized_convolution(m, _CONV_MODULES) and parametrization_refusal(m) is None:
            # its weight a subgraph of the trace on the originals (fusetune/computed_weights.py): F.conv*d on it
            self._into.update(id(p) for plist in m.parametrizations.values() for p in plist.modules())
            return False
        return _named_module(m) is not None or super().is_leaf_module(m, module_qualified_name)


class _ValueBufferTracer(_Tracer):
    """_Tracer reading buffers as values at trace time (torch.fx's default): for a forward whose control flow
    reads a buffer (an ``initialized`` flag), which a proxied buffer cannot steer. Arithmetic on buffers alone is
    then a constant of the trace, in the model optimize returns as in the import."""

    proxy_buffer_attributes = False


#: The key of a GraphModule's ``meta`` naming the forward's arguments torch.fx took as their defaults (concrete_args):
#: a call that gives one runs the model's own forward (optimizer.GivenArguments).
CONCRETE_ARGS = "fusetune_concrete_args"


def _defaults_not_given(model: nn.Module, inputs: Sequence[Any]) -> dict[str, Any]:
    """The forward's arguments after the example's, each with its default (``forward(x, mask=None)`` called as
    ``model(x)``): torch.fx takes them as they are (concrete_args), where it would otherwise trace ``mask`` as a
    tensor (``if mask is not None`` true) and the graph would not run on the example."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != len(parameters) or len(inputs) > len(positional):  # *args, **kwargs, keyword-only: as is
        return {}
    return {p.name: p.default for p in positional[len(inputs):] if p.default is not p.empty}


def _symbolic_trace(model: nn.Module, concrete: Mapping[str, Any] | None = None) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace`` with _Tracer, else with _ValueBufferTracer (logged: the buffers' arithmetic
    is then frozen at its traced value); ``concrete``: forward arguments taken as the values given."""
    try:
        tracer: _Tracer = _Tracer()
        graph = tracer.trace(model, concrete_args=dict(concrete) if concrete else None)
    except Exception as exc:
        tracer = _ValueBufferTracer()
        graph = tracer.trace(model, concrete_args=dict(concrete) if concrete else None)  # (else torch.export next)
        log.info("%s traces only with its buffers read as values (%s): arithmetic on buffers alone is a "
                 "constant of the trace", type(model).__name__, _first_line(exc))
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _export_instead(model: nn.Module, inputs: Sequence[Any], source: str, fx_error: Exception) -> torch.fx.GraphModule:
    """torch.export's trace (fusetune/exported.py) where torch.fx's failed; a TraceError (exit 2) naming the
    model and both reasons where neither traces."""
    from fusetune.exported import export_graph

    try:
        with _quiet_loggers():
            return export_graph(model, inputs)
    except Exception as exc:  # noqa: BLE001 - whatever export raises, the model stays in PyTorch, said once
        raise TraceError(f"{source}: torch.fx cannot trace the model ({_first_line(fx_error)}), nor can torch.export "
                         f"({_first_line(exc)}); nothing was imported and the model stays in PyTorch as it is. Control "
                         "flow that depends on tensor values (if x.sum() > 0: ...) cannot be traced: write it with "
                         "torch.where, or move it into a submodule and import the convolutions' part") from None


def _propagate_fake(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Shapes without computing: ShapeProp on fake tensors (KernelBench sizes take gigabytes and minutes
    on a CPU; the chains need only the shapes). False where some op has no fake kernel: then it runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.shape_prop import ShapeProp

    try:  # ShapeProp prints the traceback of a failing node: the fallback runs it, so it is noise here
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()), _quiet_loggers(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own, copying an exported graph's pytree specs
            ShapeProp(gm, fake_mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    except Exception:
        for node in gm.graph.nodes:
            node.meta.pop("tensor_meta", None)
        return False
    return True


def _read_through_in_place_writes(gm: torch.fx.GraphModule) -> None:
    """``x.mul_(s)`` as a statement, then ops reading ``x``: each op after an in-place write that reads the tensor
    it wrote reads the write's result instead, which is that same tensor (an in-place op returns its input), so a
    chain goes on through the write, and ``relu_(y) + y`` is the relu's value read twice. Exact: the graph computes
    what it did; a view taken of the tensor before the write still reads it (the walk refuses that case)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    changed = False
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module") or not overwrites_input(gm, node):
            continue
        written = (_module_argument(node) if node.op == "call_module"
                   else node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self")))
        if not isinstance(written, torch.fx.Node):
            continue
        for user in list(written.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(written, node)
                changed = True
    if changed:
        gm.recompile()
