"""``fusetune import``: find the convolution chains of a PyTorch model and write one config per chain.

The model is traced with torch.fx (``symbolic_trace``), or where that fails with torch.export lifted back
to torch.fx's level (fusetune/exported.py), and its shapes propagated with ``ShapeProp`` on the example
inputs. A chain starts at a convolution (a Conv/ConvTranspose module, or ``F.conv*d`` on
module weights) and goes on through ops of the vocabulary while each consumes the previous one's
output and nothing else reads that intermediate value (ops that read the convolution's own output
become ``by: producer``). Every module, function and method the importer knows is a row of one
table, ``TABLE``: (call kind, target) -> a builder that returns the config entries of the op, or the
reason the chain stops before it. An even pad that only an unpadded convolution reads (nn.ReflectionPad2d, F.pad
with a mode) is that convolution's padding and padding_mode (_fold_pad). A module with forward hooks is no chain's
op (_hooked): a fused chain never calls it, so it would not run them; but a convolution whose weight (or bias) the
model computes by a known rule (weight norm, pruning, a parametrization traced into, F.conv2d on a computed tensor)
is a producer whose weight is recomputed from the model's tensors at every call (fusetune/computed_weights.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import itertools
import json
import keyword
import math
import logging
import operator
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from fusetune import broadcast
from fusetune.computed_weights import (hook_derivations, owners_refusal, parametrization_refusal,
                                       parametrized_convolution)
from fusetune.config import _reserved, load_config, parse_config
from fusetune.derived import RESHAPE_METHODS, Derivation, derivation, overwrites_input, written_in_place
from fusetune.errors import ConfigError, FusetuneError, count
from fusetune.ops import SPECIAL_NAMES, TORCH_ALIASES, Shape
from fusetune.paths import decode_text, read_bytes
from fusetune.producers import KINDS, SPATIAL_NAMES

log = logging.getLogger("fusetune.import")

Entry = dict[str, Any]


class TraceError(FusetuneError):
    """Neither torch.fx nor torch.export can trace the model (data-dependent control flow), or the traced
    model does not run on the example inputs: bad input, exit 2, nothing written."""

    exit_code = 2


# --------------------------------------------------------------------------------------------------
# Loading the model


@dataclasses.dataclass
class LoadedModel:
    model: nn.Module
    inputs: tuple[Any, ...]
    stem: str  # config names and file names start with it
    source: str  # the MODEL argument as given
    #: The floating dtype the model computes in (its parameters', else its inputs'): it is traced in float32 on
    #: the CPU, and its configs take this dtype where the kernels have it (model_dtype).
    dtype: torch.dtype = torch.float32
    #: Each floating parameter's and buffer's dtype before that cast, by its name: a chain's config takes its
    #: convolution weight's (a model of mixed dtypes), else ``dtype``.
    tensor_dtypes: dict[str, torch.dtype] = dataclasses.field(default_factory=dict)


_counter = itertools.count()


def load_model(spec: str, input_shapes: Sequence[Shape] = ()) -> LoadedModel:
    """Build the model of a KernelBench-style file or a ``package.module:factory`` (float32, CPU,
    its mode as constructed). Raises ``ConfigError`` (exit 2) naming the file and what was expected."""
    if spec.endswith(".py") or os.sep in spec or (":" not in spec and Path(spec).exists()):
        return _load_file(spec, input_shapes)
    if ":" in spec:
        return _load_factory(spec, input_shapes)
    raise ConfigError(spec, "", "expected a Python file (KernelBench convention: class Model, get_inputs, "
                                "get_init_inputs) or package.module:factory")


#: What a KernelBench-style file defines, by name, and what each must be: said where one is missing or is no such.
CONVENTION: dict[str, str] = {
    "Model": "a class Model(nn.Module)",
    "get_inputs": "a function get_inputs() returning the forward's example arguments (a list, or one tensor)",
    "get_init_inputs": "a function get_init_inputs() returning Model's constructor arguments (a list)",
}


def _load_file(spec: str, input_shapes: Sequence[Shape]) -> LoadedModel:
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(spec, "", "no such file; expected a Python file defining class Model(nn.Module), "
                                    "get_inputs() and get_init_inputs()")
    _check_source(spec, path)
    name = f"_fusetune_import_{next(_counter)}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(spec, "", "cannot be imported as a Python module; expected a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(spec, "", f"running the file failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.modules.pop(name, None)
    cls = getattr(module, "Model", None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        got = "missing" if cls is None else f"not an nn.Module class (it is {_what(cls)})"
        raise ConfigError(spec, "Model", f"{got}; expected {CONVENTION['Model']} (KernelBench convention)")
    get_inputs = None if input_shapes else _convention_function(spec, module, "get_inputs", required=True)
    init = _convention_function(spec, module, "get_init_inputs", required=False)
    init_args = _called(spec, "get_init_inputs", init) if init is not None else ()
    try:
        model = cls(*init_args)
    except Exception as exc:
        raise ConfigError(spec, "Model", f"building the model failed: {type(exc).__name__}: {exc}") from None
    inputs = _example_inputs(input_shapes) if get_inputs is None else _called(spec, "get_inputs", get_inputs)
    dtypes = tensor_dtypes(model)  # before _float32 casts the module in place
    return LoadedModel(model=_float32(model), inputs=_float32_inputs(inputs), stem=_stem(path.stem), source=spec,
                       dtype=model_dtype(dtypes, inputs), tensor_dtypes=dtypes)


def _check_source(spec: str, path: Path) -> None:
    """Refuse a file Python would refuse to read as source: bytes that are not text in its encoding (UTF-8, or what
    a PEP 263 ``# -*- coding: ... -*-`` line declares). importlib compiles the raw bytes, and CPython's tokenizer
    lets bad bytes through in comments and strings it does not decode, so ``python model.py`` fails on a file the
    import would take (a Latin-1 ``# café``); said as the config loader says it for YAML: the byte, its offset and
    its line."""
    import tokenize

    data = read_bytes(path, spec)
    declared: SyntaxError | None = None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown encoding declared, or a first line that is not UTF-8 (said below)
        encoding, declared = "utf-8", exc
    decode_text(data, spec, encoding, ", which Python refuses as source; save the file as UTF-8 (or declare its "
                                      "encoding: PEP 263)")
    if declared is not None:
        raise ConfigError(spec, "", f"not readable as Python source: {declared.msg}")


def _what(value: Any) -> str:
    """A value's kind for a message: ``a list``, ``an int``, ``the class Foo``."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _convention_function(spec: str, module: Any, name: str, required: bool) -> Callable[[], Any] | None:
    """The file's function ``name`` (CONVENTION); None where it is absent and not ``required`` (a model without
    constructor arguments). A value of that name that is no function (``get_inputs = [x]``) is said so, not
    taken for missing."""
    value = getattr(module, name, None)
    if value is None and not required:
        return None
    if value is None:
        raise ConfigError(spec, name, f"missing; expected {CONVENTION[name]} (or pass --inputs)")
    if not callable(value):
        raise ConfigError(spec, name, f"not callable (it is {_what(value)}); expected {CONVENTION[name]}")
    return value


def _called(spec: str, name: str, function: Callable[[], Any]) -> tuple[Any, ...]:
    """What ``get_inputs()`` or ``get_init_inputs()`` returned, as arguments: ``example_arguments``, its error
    naming the file and the function."""
    try:
        value = function()
    except Exception as exc:
        raise ConfigError(spec, name, f"calling {name}() failed: {type(exc).__name__}: {exc}") from None
    arguments = example_arguments(value, allow_tensor=name == "get_inputs")
    if arguments is None:
        raise ConfigError(spec, name, f"returned {_what(value)}; expected {CONVENTION[name]}")
    return arguments


def example_arguments(value: Any, allow_tensor: bool = True) -> tuple[Any, ...] | None:
    """A model file's ``get_inputs()`` (or ``get_init_inputs()``) value as the call's arguments: a list or tuple
    is them; one tensor is the forward's one argument, as ``optimize`` takes it (``tuple(t)`` would iterate it
    over its first dim: N tensors of one sample each, a shape error far from the cause); anything else None."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if allow_tensor and isinstance(value, torch.Tensor):
        return (value,)
    return None


def _load_factory(spec: str, input_shapes: Sequence[Shape]) -> LoadedModel:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(spec, "", f"cannot import {module_name!r}: {type(exc).__name__}: {exc}; expected "
                                    "package.module:factory") from None
    factory: Any = module
    for part in attr.split(".") if attr else [""]:
        factory = getattr(factory, part, None) if part else None
    if not callable(factory):
        raise ConfigError(spec, attr, f"not found in {module_name}; expected a callable returning an nn.Module")
    if not input_shapes:
        raise ConfigError(spec, "", "a factory needs the example input shape: pass --inputs N,C,H,W")
    try:
        model = factory()
    except Exception as exc:
        raise ConfigError(spec, attr, f"calling the factory failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(spec, attr, f"expected the factory to return an nn.Module, got {type(model).__name__}")
    dtypes = tensor_dtypes(model)  # before _float32 casts the module in place
    return LoadedModel(model=_float32(model), inputs=_example_inputs(input_shapes), stem=_stem(attr.split(".")[-1]),
                       source=spec, dtype=model_dtype(dtypes, ()), tensor_dtypes=dtypes)


def _stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "model"


def _example_inputs(shapes: Sequence[Shape]) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*shape, generator=generator) for shape in shapes)


def model_dtype(dtypes: Mapping[str, torch.dtype], inputs: Iterable[Any]) -> torch.dtype:
    """The dtype of the model's first floating parameter or buffer (``dtypes``: tensor_dtypes), else of its first
    floating input, else float32 (read before load_model casts both to float32 for tracing on the CPU)."""
    floating = (x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point())
    return next(itertools.chain(dtypes.values(), floating), torch.float32)


def tensor_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    """Each floating parameter's and buffer's dtype, by its name in the model."""
    named = itertools.chain(model.named_parameters(), model.named_buffers())
    return {name: t.dtype for name, t in named if t.is_floating_point()}


def _chain_dtype(loaded: LoadedModel, chain: Chain) -> torch.dtype:
    """The dtype a chain computes in: its convolution weight's (the user's tensor, or the first one its
    computation reads), else the model's."""
    weight = chain.weights.get("producer.weight")
    if weight is None and "producer.weight" in chain.producer_derived:
        weight = next(iter(chain.producer_derived["producer.weight"].reads), None)
    return loaded.tensor_dtypes.get(weight or "", loaded.dtype)


def _float32(model: nn.Module) -> nn.Module:
    return model.to(device="cpu").float()


def _float32_inputs(inputs: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(x.detach().to("cpu", torch.float32) if isinstance(x, torch.Tensor) and x.is_floating_point()
                 else x for x in inputs)


# --------------------------------------------------------------------------------------------------
# Tracing


def trace(model: nn.Module, inputs: Sequence[Any], source: str = "<model>") -> torch.fx.GraphModule:
    """``symbolic_trace`` the model and record every node's shape (``node.meta['tensor_meta']``), on fake
    tensors where every op has a fake kernel (nothing computed, no statistic moved), else by running it.
    The model's own modules are shared with the result, so a training-mode batch norm's running
    statistics move when it runs, as they would in the model."""
    from torch.fx.passes.shape_prop import ShapeProp

    concrete = _defaults_not_given(model, inputs)
    try:
        gm = _symbolic_trace(model, concrete)
        if concrete:
            gm.meta[CONCRETE_ARGS] = tuple(concrete)
    except Exception as exc:
        gm = _export_instead(model, inputs, source, exc)
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
            return f"own forward fails on the example inputs ({type(exc).__name__}: {exc})"
        try:
            got = run(gm)
        except Exception as exc:  # the trace ran on the example when traced; a second run may not (state it changed)
            return f"trace fails on the example inputs where its own forward runs ({type(exc).__name__}: {exc})"
    finally:  # the user's buffers as they were, whichever run failed
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    why = _first_difference(want, got)
    return None if why is None else (
        f"traced forward differs from its own on the example inputs ({why}): torch.fx records an in-place op on "
        "a proxy as a new tensor (out += b, where out is another name's tensor too, which eager then reads changed)")


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
    shape = _shape(node.args[0] if node.args else node.kwargs.get("input"))
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
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own, copying an exported graph's pytree specs
            ShapeProp(gm, fake_mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    except Exception:
        for node in gm.graph.nodes:
            node.meta.pop("tensor_meta", None)
        return False
    return True


def _shape(node: Any) -> Shape | None:
    meta = getattr(node, "meta", {}).get("tensor_meta") if isinstance(node, torch.fx.Node) else None
    return tuple(int(s) for s in meta.shape) if hasattr(meta, "shape") else None


def fetch(gm: nn.Module, target: str) -> Any:
    return functools.reduce(getattr, target.split("."), gm)


def _fetch_or_none(gm: nn.Module, target: str) -> Any:
    try:
        return fetch(gm, target)
    except AttributeError:
        return None


# --------------------------------------------------------------------------------------------------
# Producers


@dataclasses.dataclass(frozen=True)
class ProducerMatch:
    entry: Entry  # the config's producer
    weights: dict[str, str]  # generated Model's state key -> the user's name
    input: torch.fx.Node
    before: tuple[torch.fx.Node, ...] = ()  # nodes between the input and the convolution it takes (a pad: _fold_pad)
    #: The convolution's tensors the model computes at every call (weight norm, a pruning mask, a parametrization,
    #: F.conv2d(x, self.weight * self.mask)): generated Model's state key -> how (fusetune/computed_weights.py)
    derived: dict[str, Derivation] = dataclasses.field(default_factory=dict)
    #: The trace's nodes computing them that nothing but the convolution reads (the chain's; the others stay the
    #: model's, and the chain computes its weight again from the model's tensors)
    computes: tuple[torch.fx.Node, ...] = ()
    #: Why its config holds at the traced input shapes alone (a transposed convolution's output_padding, from the
    #: output size the forward asked there), None where it holds at any
    at_example: str | None = None
    #: The slices the chain starts with where the convolution takes an uneven pad evenly (a causal convolution's
    #: F.pad(x, (k - 1, 0)): padding k - 1 on both sides, the last k - 1 outputs cropped; _fold_pad)
    crop: tuple[Entry, ...] = ()


_CONV_MODULES: dict[type, str] = {getattr(nn, kind.module): op for op, kind in KINDS.items()}
_CONV_FUNCTIONS: dict[Any, str] = {getattr(F, op): op for op in KINDS}


def _window(values: Any, dims: int) -> Any:
    values = tuple(values) if isinstance(values, (tuple, list)) else (values,) * dims
    return int(values[0]) if len(set(values)) == 1 else [int(v) for v in values]


def match_producer(gm: torch.fx.GraphModule, node: torch.fx.Node) -> ProducerMatch | str | None:
    """The producer a node is, None where it is no convolution, a reason where it is one fusetune cannot take."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        kind = next((op for cls, op in _CONV_MODULES.items() if type(module) is cls), None)
        if kind is None:
            return parametrization_refusal(module) if parametrized_convolution(module, _CONV_MODULES) else None
        derived = hook_derivations(module, str(node.target)) or {}  # weight norm, pruning: known pre-hooks
        hooked = _hooked(module) if not derived else None
        if hooked is not None:
            return hooked
        dims = KINDS[kind].spatial_dims
        source, output_padding = _module_argument(node), module.output_padding if KINDS[kind].transposed else 0
        at_example = None
        if source is None and KINDS[kind].transposed:  # self.up(x, output_size=skip.size()): at the traced shapes
            sized = _output_size_padding(node, module, dims)
            if isinstance(sized, str):
                return sized
            source, output_padding = sized
            at_example = (f"{type(module).__name__} ({node.target}) is called with an output size, whose output_padding "
                          "is the traced shapes'")
        if source is None:
            return f"{type(module).__name__} is called with more than its input"
        entry: Entry = {"op": kind, "in_channels": module.in_channels, "out_channels": module.out_channels,
                        "kernel_size": _window(module.kernel_size, dims)}
        _conv_options(entry, dims, module.stride, module.padding, module.dilation, module.groups,
                      output_padding, module.bias is not None)
        if module.padding_mode != "zeros":  # reflect, replicate, circular: the config takes it as nn.Conv*d does
            entry["padding_mode"] = module.padding_mode
        weights = {"producer.weight": f"{node.target}.weight"}
        if module.bias is not None:
            weights["producer.bias"] = f"{node.target}.bias"
        weights = {k: v for k, v in weights.items() if k not in derived}
        return _fold_pad(gm, ProducerMatch(entry, weights, source, derived=derived, at_example=at_example))
    if node.op == "call_function" and node.target in _CONV_FUNCTIONS:
        kind = _CONV_FUNCTIONS[node.target]
        transposed, dims = KINDS[kind].transposed, KINDS[kind].spatial_dims
        names = (["input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"] if transposed
                 else ["input", "weight", "bias", "stride", "padding", "dilation", "groups"])
        args = bind_all(node, names, {"bias": None, "stride": 1, "padding": 0, "output_padding": 0, "groups": 1,
                                       "dilation": 1})
        if isinstance(args, str):
            return args
        weight, bias = args["weight"], args["bias"]
        for key in ("stride", "padding", "output_padding", "groups", "dilation"):
            if has_node(args[key]):
                return f"F.{kind}'s {key} is computed in the forward"
        weights: dict[str, str] = {}
        derived: dict[str, Derivation] = {}
        calls: list[torch.fx.Node] = []
        for name, tensor in (("weight", weight), ("bias", bias)):
            if tensor is None:
                continue
            if isinstance(tensor, torch.fx.Node) and tensor.op == "get_attr":
                weights[f"producer.{name}"] = str(tensor.target)
                continue
            refused = owners_refusal(gm, _attributes_read(tensor))  # torch.export traces through spectral_norm's
            if refused is not None:
                return refused
            found = _computed_tensor(gm, tensor)
            if found is None:
                written = sorted(set(_attributes_read(tensor)) & written_in_place(gm))
                if written:
                    return (f"F.{kind}'s {name} is computed in the forward from {', '.join(written)}, which the "
                            "forward writes in place (a fused call would compute it from the written values)")
                return (f"F.{kind}'s {name} is computed in the forward from more than the model's tensors (an input, "
                        "a module call, an in-place or random op), not a module's parameter nor a derivation of them")
            derived[f"producer.{name}"], nodes = found
            calls += nodes
        shape = fetch(gm, weight.target).shape if "producer.weight" in weights else derived["producer.weight"].shape
        groups = int(args["groups"])
        cin, cout = (shape[0], shape[1] * groups) if transposed else (shape[1] * groups, shape[0])
        if "producer.bias" in derived and derived["producer.bias"].shape != (cout,):
            return f"F.{kind}'s bias is computed of shape {list(derived['producer.bias'].shape)}, not ({cout},)"
        entry = {"op": kind, "in_channels": int(cin), "out_channels": int(cout),
                 "kernel_size": _window(tuple(shape[2:]), dims)}
        _conv_options(entry, dims, args["stride"], args["padding"], args["dilation"], groups,
                      args["output_padding"], bias is not None)
        return _fold_pad(gm, ProducerMatch(entry, weights, args["input"], derived=derived,
                                           computes=_read_by_alone(gm, node, calls)))
    return None


def _computed_tensor(gm: torch.fx.GraphModule, node: Any) -> tuple[Derivation, list[torch.fx.Node]] | None:
    """A convolution's weight or bias the forward computes from the model's tensors alone (a parametrization's
    traced subgraph, ``self.weight * self.mask``), as a derivation of its own shape and its call nodes; None where
    it is computed otherwise (fusetune/derived.py's rules) or of unknown shape."""
    shape, dtype = _shape(node), _dtype(node)
    if not isinstance(node, torch.fx.Node) or shape is None or dtype is None or not dtype.is_floating_point:
        return None
    return derivation(gm, node, shape, lambda n: _user_tensor(gm, n))


def _attributes_read(node: Any) -> tuple[str, ...]:
    """The targets of the get_attr nodes ``node``'s value is computed from (through any path of the graph)."""
    seen: set[torch.fx.Node] = set()
    todo = [node] if isinstance(node, torch.fx.Node) else []
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(current.all_input_nodes)
    return tuple(sorted(str(n.target) for n in seen if n.op == "get_attr"))


def _read_by_alone(gm: torch.fx.GraphModule, reader: torch.fx.Node,
                   nodes: Sequence[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
    """Those of ``nodes`` whose value nothing reads but ``reader`` and the others kept (the chain's, cut out with
    it), in graph order; the rest stay the model's."""
    kept = set(nodes)
    changed = True
    while changed:
        changed = False
        for n in list(kept):
            if any(user is not reader and user not in kept for user in n.users):
                kept.discard(n)
                changed = True
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return tuple(sorted(kept, key=order.__getitem__))


#: Padding modules -> the padding_mode of a convolution that pads alike (a ConstantPad only with the value 0).
_PAD_MODULES: dict[type, str] = {
    **{getattr(nn, f"ReflectionPad{d}d"): "reflect" for d in (1, 2, 3)},
    **{getattr(nn, f"ReplicationPad{d}d"): "replicate" for d in (1, 2, 3)},
    **{getattr(nn, f"CircularPad{d}d"): "circular" for d in (1, 2, 3) if hasattr(nn, f"CircularPad{d}d")},
    **{getattr(nn, f"ZeroPad{d}d"): "zeros" for d in (1, 2, 3) if hasattr(nn, f"ZeroPad{d}d")},
    **{getattr(nn, f"ConstantPad{d}d"): "zeros" for d in (1, 2, 3)},
}
#: F.pad's modes -> the padding_mode (mode="constant" only with the value 0).
_PAD_MODES = {"constant": "zeros", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}


def _fold_pad(gm: torch.fx.GraphModule, match: ProducerMatch) -> ProducerMatch:
    """An unpadded convolution whose input is a pad read by it alone (CycleGAN's and fast style transfer's
    ``nn.ReflectionPad2d(p)`` then ``nn.Conv2d(..., padding=0)``, F.pad(x, pads, mode)) is the convolution with
    that padding and padding_mode, on the pad's input: nn.Conv2d(padding_mode="reflect") pads with F.pad alike.
    The pad joins the chain; where it pads unevenly, pads the batch or the channels, or with a value other than 0,
    the match is left as it is (the pad stays in PyTorch)."""
    entry, pad = match.entry, match.input
    dims = KINDS[entry["op"]].spatial_dims
    if (KINDS[entry["op"]].transposed or entry.get("padding", 0) not in (0, "valid") or "padding_mode" in entry
            or not isinstance(pad, torch.fx.Node) or len(pad.users) != 1):
        return match
    found = _pad_of(gm, pad)
    if found is None:
        return match
    source, pads, mode = found
    if len(pads) % 2 or len(pads) > 2 * dims or any(p < 0 for p in pads):
        return match
    pairs = [(0, 0)] * (dims - len(pads) // 2) + [(int(pads[i]), int(pads[i + 1])) for i in range(len(pads) - 2, -1, -2)]
    stride = entry.get("stride", 1)
    crop = _crop(pairs, list(stride) if isinstance(stride, (list, tuple)) else [int(stride)] * dims, mode)
    if crop is None:
        return match
    per_dim = [max(pair) for pair in pairs]
    folded = {k: v for k, v in entry.items() if k != "padding"}
    window = _window(per_dim, dims)
    if window != 0:
        folded["padding"] = window
    if mode != "zeros":
        folded["padding_mode"] = mode
    return dataclasses.replace(match, entry=folded, input=source, before=(pad, *match.before), crop=crop)


def _crop(pairs: Sequence[tuple[int, int]], stride: Sequence[int], mode: str) -> tuple[Entry, ...] | None:
    """The slices that make a convolution padded max(left, right) on both sides of each spatial dim compute the
    one on the unevenly padded input (F.pad(x, (left, right))): its outputs from the (max - left)-th, less the last
    (max - right); () where every pad is even, None where that is not exact (a stride other than 1 on an uneven
    dim: the windows would not line up; a pad of another mode than zeros)."""
    entries: list[Entry] = []
    for d, (left, right) in enumerate(pairs):
        if left == right:
            continue
        if stride[d] != 1 or mode != "zeros":
            return None
        high = max(left, right)
        entry: Entry = {"op": "slice", "dim": 2 + d}
        if high > left:
            entry["start"] = high - left
        if high > right:
            entry["end"] = right - high
        entries.append(entry)
    return tuple(entries)


#: Why a pad before a convolution stays in PyTorch (a chain's end there, the map's word for the pad).
_PAD_NOT_TAKEN = ("pads a convolution's input, which that convolution does not take as its padding (it takes one of "
                  "the spatial dims read by it alone: an even pad, or an uneven zero pad before a stride-1 convolution)")


def _pads_a_convolution(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether ``node`` is a pad (_pad_of) that a convolution reads."""
    return _pad_of(gm, node) is not None and any(_is_convolution(gm, u) for u in node.users)


def _folded_pad(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether ``node`` is a pad that the convolution reading it takes as its padding (_fold_pad)."""
    if len(node.users) != 1:
        return False
    match = match_producer(gm, next(iter(node.users)))
    return isinstance(match, ProducerMatch) and node in match.before


def _pad_of(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...], str] | None:
    """(the padded tensor, F.pad's pads, the padding_mode) of a pad module or F.pad call without hooks, padding
    with zeros where it pads a constant; None for anything else."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        mode = _PAD_MODULES.get(type(module))
        source = _module_argument(node)
        if mode is None or source is None or _hooked(module) is not None or float(getattr(module, "value", 0)) != 0:
            return None
        return source, tuple(module.padding), mode
    if node.op == "call_function" and node.target is F.pad:
        a = bind_all(node, ["input", "pad", "mode", "value"], {"mode": "constant", "value": None})
        if isinstance(a, str) or has_node(a["pad"]) or a["mode"] not in _PAD_MODES or a["value"] not in (None, 0, 0.0):
            return None
        if not all(isinstance(p, int) for p in a["pad"]):
            return None
        return a["input"], tuple(a["pad"]), _PAD_MODES[a["mode"]]
    return None


def _module_argument(node: torch.fx.Node) -> Any:
    """The one argument a module is called with, positional or as ``input=`` (``self.conv(input=x)``); None where
    it is called with more (a transposed convolution's output_size)."""
    if len(node.args) == 1 and not node.kwargs:
        return node.args[0]
    if not node.args and set(node.kwargs) == {"input"}:
        return node.kwargs["input"]
    return None


def _output_size_padding(node: torch.fx.Node, module: nn.Module, dims: int) -> tuple[Any, tuple[int, ...]] | str:
    """A transposed convolution called with its output size (``self.up(x, output_size=skip.size())``, U-Net's
    decoders): its input, and the output_padding that size is at the traced shapes, as PyTorch derives it
    (the size less the smallest output, below the stride or the dilation); a reason where it is not that call.
    The fused chain runs its kernels at the tuned input shapes alone, where the forward asks the same size."""
    args, kwargs = list(node.args), dict(node.kwargs)
    source = kwargs.pop("input", args.pop(0) if args else None)
    size = kwargs.pop("output_size", args.pop(0) if args else None)
    if source is None or size is None or args or kwargs:
        return f"{type(module).__name__} is called with more than its input and output_size"
    shape_in, shape_out = _shape(source), _shape(node)
    if shape_in is None or shape_out is None:
        return f"{type(module).__name__}'s output_size: its input or output shape was not traced"
    padding = []
    for d in range(dims):
        smallest = ((shape_in[2 + d] - 1) * module.stride[d] - 2 * module.padding[d]
                    + module.dilation[d] * (module.kernel_size[d] - 1) + 1)
        extra = shape_out[2 + d] - smallest
        if not 0 <= extra < max(module.stride[d], module.dilation[d]):
            return f"{type(module).__name__}'s output_size gives output_padding {extra} on dim {2 + d}"
        padding.append(extra)
    return source, tuple(padding)


def _conv_options(entry: Entry, dims: int, stride: Any, padding: Any, dilation: Any, groups: int,
                  output_padding: Any, bias: bool) -> None:
    """The producer's arguments beside the defaults: left out where PyTorch's default."""
    for key, value, default in (("stride", stride, 1), ("dilation", dilation, 1),
                                ("output_padding", output_padding, 0)):
        window = _window(value, dims)
        if window != default:
            entry[key] = window
    pad = padding if isinstance(padding, str) else _window(padding, dims)
    if pad != 0:
        entry["padding"] = pad
    if groups != 1:
        entry["groups"] = int(groups)
    entry["bias"] = bool(bias)


def has_node(value: Any) -> bool:
    found: list[bool] = []
    torch.fx.node.map_arg(value, lambda n: found.append(True))
    return bool(found)


# --------------------------------------------------------------------------------------------------
# The vocabulary table


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A tensor of the user's model that the config declares as a per-channel parameter, by its attribute
    path, and its own shape: (C, 1, ..., 1) as declared, or any shape that broadcasts as one against the
    chain's value, (1, C, 1, 1) or a single value (0-dim, (1,), (1, 1, 1)), which binds as a view
    (``declared_view``)."""

    target: str
    shape: tuple[int, ...] = ()
    views: tuple[str, ...] = ()  # the forward's nodes reshaping it (self.bias.view(1, -1, 1, 1)): the chain's too


@dataclasses.dataclass(frozen=True)
class InputRef:
    """A binary op's operand that is another tensor of the forward, of the chain value's shape and computed
    without the convolution (a residual's identity, a second input of the model: ``forward(self, x,
    add_input)``): the config declares it as an extra input (``inputs:``), which the fused module is called with."""

    node: str  # the graph node holding it
    name: str  # its name in the config: the forward's argument where it is one, else the node's
    #: How it broadcasts against the chain's value (fusetune/broadcast.py): "full" (the chain's shape), or a kind
    #: such as a UNet's ``temb[:, :, None, None]`` (per_sample_channel)
    kind: str = "full"


@dataclasses.dataclass(frozen=True)
class DerivedRef:
    """A binary op's operand that the forward computes from the model's tensors alone (``w = bn.weight /
    torch.sqrt(bn.running_var + bn.eps)``, ``self.scale.exp()``, ``torch.sigmoid(self.gate).view(1, -1, 1, 1)``),
    one value per channel or a single value: the config declares it as a parameter, whose value the fused
    chain computes from the user's tensors at every call (fusetune/derived.py), never a constant of the import."""

    target: str  # the base of its config name (derived_<node>)
    node: str  # the graph node holding the operand
    derivation: Derivation
    nodes: tuple[str, ...]  # the derivation's call nodes, in graph order: the chain's where no other op reads them


#: Names an extra input of the config may not take (config.INPUT_RESERVED); one that would is prefixed.
_INPUT_PREFIX = "input_"


#: Reshapes of a tensor that keep its values' order (derived.RESHAPE_METHODS: a per-channel tensor viewed as
#: (1, C, 1, 1) in the forward), and contiguous, which keeps them too (derived.VIEW_METHODS, the views a write goes
#: through, leaves it out: it copies a tensor that is not contiguous).
_VIEW_METHODS = RESHAPE_METHODS | {"contiguous"}
_VIEW_FUNCTIONS = tuple(getattr(torch, name) for name in sorted(RESHAPE_METHODS) if name != "view")  # no torch.view


def _viewed_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[str, list[torch.fx.Node]] | None:
    """(the attribute, the view nodes) where ``node`` is a model tensor reshaped in the forward (views,
    ``[None, :, None, None]``), each view read once and the element count kept; else None."""
    nodes: list[torch.fx.Node] = []
    while node.op != "get_attr":
        index_ok = (node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[1], tuple)
                    and all(i is None or i == slice(None) or i is Ellipsis for i in node.args[1]))
        if not (index_ok or (node.op == "call_method" and node.target in _VIEW_METHODS)
                or (node.op == "call_function" and node.target in _VIEW_FUNCTIONS)):
            return None
        if len(node.users) != 1 or not node.args or not isinstance(node.args[0], torch.fx.Node) or any(
                has_node(a) for a in (*node.args[1:], *node.kwargs.values())):
            return None
        nodes.append(node)
        node = node.args[0]
    value = fetch(gm, node.target)
    if not nodes or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None
    shape = _shape(nodes[0])
    if shape is None or math.prod(shape) != value.numel():
        return None
    return str(node.target), nodes[::-1]


def per_channel_form(shape: Sequence[int], value_shape: Sequence[int], channels: int) -> str | None:
    """How a tensor of ``shape`` broadcasts against the chain's value (N, C, spatial...) of
    ``value_shape``: "per_channel" (one value per channel, whatever its leading 1s), "scalar" (one value),
    or None where it is neither or would change the value's shape (rank above the value's, or a size
    other than 1 beside the channels). A single value is "scalar" whatever the value's channels: after a
    channel reduction (keepdim) a (1, 1, 1) parameter is one value, which the config declares shape: scalar."""
    shape, rank = tuple(int(s) for s in shape), len(value_shape)
    if len(shape) > rank:
        return None
    if all(s == 1 for s in shape):  # one value: whatever the value's channels (after a channel reduction too)
        return "scalar"
    if rank < 2 or value_shape[1] != channels:
        return None
    padded = (1,) * (rank - len(shape)) + shape
    if padded[1] == channels and all(s == 1 for i, s in enumerate(padded) if i != 1):
        return "per_channel"
    return None


def declared_view(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The user's tensor as the config declares it, (C, 1, ..., 1) or a scalar's 0-dim: itself where it has that
    shape, else a view of the same storage (a single value expanded or made 0-dim, a (1, C, 1, 1) reshaped), so
    that an in-place update of the user's tensor (an optimizer step, ``load_state_dict``) reaches the kernels."""
    shape = tuple(int(s) for s in shape)
    if tuple(tensor.shape) == shape:
        return tensor
    if tensor.numel() == 1:
        return tensor.reshape(()).expand(shape)
    return tensor.view(shape)


@dataclasses.dataclass
class Mapped:
    """What one user op becomes: config entries (in order) and the nodes it covers."""

    entries: list[Entry]
    out: torch.fx.Node  # the node whose value the chain goes on from
    extra: list[torch.fx.Node] = dataclasses.field(default_factory=list)  # e.g. the getitem after torch.max
    module: str | None = None  # the user's module holding state (a norm's weights, running statistics)
    weights: dict[str, str] | None = None  # a functional norm's: its tensor's name (weight, bias) -> the user's


@dataclasses.dataclass
class Site:
    """A candidate next op, with what the builders need to know about the chain."""

    gm: torch.fx.GraphModule
    node: torch.fx.Node
    cur: set[torch.fx.Node]  # the chain's value and its identity aliases
    producer: set[torch.fx.Node]  # the convolution's output and its aliases
    channels: int
    spatial_dims: int

    @property
    def module(self) -> nn.Module:
        return self.gm.get_submodule(self.node.target)

    @property
    def shape_in(self) -> Shape | None:
        return _shape(next(iter(self.cur)))

    @property
    def shape_out(self) -> Shape | None:
        return _shape(self.node)

    def is_x(self, arg: Any) -> bool:
        return isinstance(arg, torch.fx.Node) and arg in self.cur

    def operand(self, arg: Any) -> Any:
        """A binary op's other operand as the config writes it (a number, 'producer', a ParamRef),
        or a reason string."""
        if isinstance(arg, bool):
            return "a boolean operand is not in the vocabulary"
        if isinstance(arg, (int, float)):
            return float(arg) if math.isfinite(arg) else f"a non-finite operand {arg!r}"
        if not isinstance(arg, torch.fx.Node):
            return f"an operand of type {type(arg).__name__} is not in the vocabulary"
        if arg in self.producer:
            return "producer"
        if arg.op == "get_attr":
            value = fetch(self.gm, arg.target)
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() <= 1 and (
                    arg.target.startswith("_tensor_constant") or value.dim() == 0) and not isinstance(value, nn.Parameter):
                return float(value.item())
            per_channel = (self.channels,) + (1,) * self.spatial_dims
            value_shape = self.shape_in or ()
            if isinstance(value, torch.Tensor) and value.is_floating_point() and per_channel_form(
                    value.shape, value_shape, self.channels) is not None:
                return ParamRef(arg.target, tuple(int(s) for s in value.shape))
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            against = (f"the input now has {count(value_shape[1], 'channel')}" if len(value_shape) > 1
                       and value_shape[1] != self.channels else f"the chain's value {list(value_shape)}")
            return (f"the operand {arg.target} has shape {shape}: not one value per channel nor a single value "
                    f"against {against} (a per-channel parameter is {list(per_channel)}, (1, C, 1, ...) or 0-dim)")
        constant = _constant_tensor(self, arg)
        if constant is not None:  # torch.tensor(0.5, device=x.device): a number
            return constant
        size = shape_number(self, arg)
        if size is not None:  # x.sum(2) / x.shape[-1]: the size at the traced shape
            return size
        viewed = _viewed_tensor(self.gm, arg)
        if viewed is not None:  # self.bias.view(1, -1, 1, 1), self.scale[None, :, None, None]
            target, nodes = viewed
            value = fetch(self.gm, target)
            if per_channel_form(_shape(arg) or (), self.shape_in or (), self.channels) is not None:
                return ParamRef(target, tuple(int(s) for s in value.shape), tuple(n.name for n in nodes))
        shape = _shape(arg)
        derived = self._derived(arg, shape)
        if derived is not None:
            return derived
        before = _available(self.gm, arg, self.producer)
        if shape is not None and shape == self.shape_in and before:
            return InputRef(arg.name, str(arg.target) if arg.op == "placeholder" else arg.name)
        kind = broadcast.kind_of_shape(shape, self.shape_in) if shape is not None and self.shape_in else None
        argument = _viewed_argument(arg)
        if kind not in (None, broadcast.FULL) and (before or argument is not None) and not _depends_on(
                arg, self.producer, through_shapes=False):
            # temb[:, :, None, None], t.view(N, C, 1, 1), a forward argument of shape (N, C, 1, 1) or (1, C, 1, 1),
            # a diffusion block's self.temb_proj(F.silu(temb))[:, :, None, None] (computed after the convolution
            # from no convolution after it: the fused call comes after the chain, where it is computed)
            return InputRef(arg.name, str(argument.target) if argument is not None else arg.name, kind)
        if shape is None and arg.op == "placeholder":
            return (f"the other operand ({arg.name}) is an argument of forward that is not a tensor of the example "
                    "inputs (a number given at each call): not a constant of the chain")
        what = (f"of shape {list(shape)}, not the chain value's {list(self.shape_in or ())}" if shape is not None
                else "of unknown shape")
        if shape is not None and shape == self.shape_in:
            # computed from a convolution after this one: another chain's value, which that chain's walk may take
            # with this one's as its input (a residual's main path takes the shortcut's, computed before its
            # convolution)
            what = ("computed from the convolution's output" if _depends_on(arg, self.producer, through_shapes=False)
                    else "computed after the convolution, from a later convolution")
        return (f"the other operand ({arg.name}) is a tensor of the forward {what}: not a number, the "
                "convolution's output, a per-channel parameter or an extra input of the chain's shape")


    def _derived(self, arg: torch.fx.Node, shape: Shape | None) -> DerivedRef | None:
        """The operand as a DerivedRef where the forward computes it from the model's tensors alone and it is one
        value per channel or a single value against the chain's value; else None."""
        if shape is None or _dtype(arg) is None or not _dtype(arg).is_floating_point:
            return None
        form = per_channel_form(shape, self.shape_in or (), self.channels)
        if form is None:
            return None
        declared = () if form == "scalar" else (self.channels,) + (1,) * self.spatial_dims
        found = derivation(self.gm, arg, declared, lambda n: _user_tensor(self.gm, n))
        if found is None:
            return None
        how, calls = found
        return DerivedRef(f"derived_{arg.name}", arg.name, how, tuple(n.name for n in calls))


def _user_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether a get_attr node reads a tensor of the user's model (a parameter or a buffer), not a constant the
    trace made of a tensor built in the forward."""
    target = str(node.target)
    return not target.split(".")[-1].startswith("_tensor_constant") and isinstance(_fetch_or_none(gm, target),
                                                                                    torch.Tensor)


def _viewed_argument(node: torch.fx.Node) -> torch.fx.Node | None:
    """The forward argument (placeholder) ``node`` is, or views (``temb[:, :, None, None]``,
    ``temb.view(n, c, 1, 1)``): a broadcast input's name in the config; None where it is computed otherwise."""
    current = node
    while current.op != "placeholder":
        sources = [n for n in current.all_input_nodes if n.op != "get_attr"]
        viewing = (current.op == "call_method" and current.target in _VIEW_METHODS) or (
            current.op == "call_function" and (current.target is operator.getitem or current.target in _VIEW_FUNCTIONS))
        if not viewing or len(sources) != 1:
            return None
        current = sources[0]
    return current


def _available(gm: torch.fx.GraphModule, node: torch.fx.Node, producer: set[torch.fx.Node]) -> bool:
    """Whether ``node`` may be an extra input of the chain of the convolution ``producer``: computed before the
    convolution, or after it from no convolution after it (an FPN's upsampled top-down value, a diffusion block's
    projected time embedding). The fused call comes after the chain's last node, where either is computed; a value
    read from a later convolution is that convolution's chain's to take, with this chain's value as its input
    (a residual's shortcut and main path: the one computed second takes the add), so that one chain takes it."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    start = min(order[p] for p in producer)
    if order[node] < start:
        return True
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current in seen or order[current] < start:
            continue
        seen.add(current)
        if current in producer or _is_convolution(gm, current):
            return False
        if not _is_shape_read(current):  # a size read off a value: fixed at the traced shapes (Chain.sizes)
            todo.extend(current.all_input_nodes)
    return True


def _depends_on(node: torch.fx.Node, sources: set[torch.fx.Node], through_shapes: bool = True) -> bool:
    """Whether ``node``'s value is computed from any of ``sources`` (through any path of the graph); with
    ``through_shapes`` False, not through reads of their shapes (``F.interpolate(top, size=lateral.shape[-2:])``
    reads no value of ``lateral``)."""
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current in sources:
            return True
        if current not in seen:
            seen.add(current)
            if through_shapes or not _is_shape_read(current):
                todo.extend(current.all_input_nodes)
    return False


Builder = Callable[[Site], "Mapped | str"]

#: Functions that make a one-value tensor of a number in the forward (``torch.tensor(c, device=x.device)``):
#: where the number is a constant and every other argument reads only the chain value's metadata, the
#: operand is that number (its value as the tensor holds it: ``dtype`` rounds it).
_CONSTANT_TENSOR_FUNCTIONS = (torch.tensor, torch.as_tensor, torch.scalar_tensor)
#: Their keyword arguments that do not change the value (dtype is applied to it).
_CONSTANT_TENSOR_KWARGS = ("device", "dtype", "requires_grad", "pin_memory", "layout")


def _constant_tensor(site: Site, node: Any) -> float | None:
    """The number a forward-made one-value tensor holds (torch.tensor(c, device=x.device, dtype=...), or a
    trace constant moved with ``.to(x.device)``), where it reads nothing but the chain value's metadata; else
    None. Its nodes join the chain (``_constant_tensor_nodes``), so no read of the chain's value leaves it."""
    nodes = _constant_tensor_nodes(site, node)
    if nodes is None:
        return None
    value = _evaluate_constant(site, node)
    return float(value) if value is not None and math.isfinite(value) else None


def _constant_tensor_nodes(site: Site, node: Any) -> list[torch.fx.Node] | None:
    """The nodes of a forward-made one-value tensor (the constructor and any ``.to``), or None where ``node``
    is not one: a number, the chain value's metadata (x.device, x.dtype) and trace constants are its only inputs."""
    if not isinstance(node, torch.fx.Node):
        return None
    out: list[torch.fx.Node] = []
    while node.op == "call_method" and node.target == "to" and node.args:
        out.append(node)
        node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            return None
    if node.op == "get_attr" and out:
        if not _constant(site.gm, node):
            return None
    elif node.op == "call_function" and node.target in _CONSTANT_TENSOR_FUNCTIONS:
        data = node.args[0] if node.args else node.kwargs.get("data", node.kwargs.get("s"))
        if isinstance(data, (list, tuple)) and len(data) == 1:  # torch.tensor([c]): one value, shape (1,)
            data = data[0]
        if isinstance(data, bool) or not isinstance(data, (int, float)) or len(node.args) > 1 or (
                node.kwargs.keys() - {"data", "s", *_CONSTANT_TENSOR_KWARGS}):
            return None
        out.append(node)
    else:
        return None
    for part in out:
        for arg in part.all_input_nodes:
            if arg in out or (arg.op == "get_attr" and _constant(site.gm, arg)):
                continue
            if not (_is_shape_read(arg) and arg.args and site.is_x(arg.args[0])):
                return None
    if any(len(part.users) != 1 for part in out):
        return None
    return out


def _evaluate_constant(site: Site, node: torch.fx.Node) -> float | None:
    """Run the constant's nodes on the CPU, the chain value's metadata as the trace recorded it (float32)."""
    env: dict[torch.fx.Node, Any] = {}

    def value(arg: Any) -> Any:
        if not isinstance(arg, torch.fx.Node):
            return arg
        if arg in env:
            return env[arg]
        if arg.op == "get_attr":
            return fetch(site.gm, arg.target)
        attribute = arg.args[1] if arg.target is getattr else None
        if attribute == "device":
            return torch.device("cpu")
        if attribute == "dtype":
            meta = arg.args[0].meta.get("tensor_meta")
            return getattr(meta, "dtype", torch.float32)
        raise Stop(f"{arg.name} is not a constant")
    try:
        for part in reversed(_constant_tensor_nodes(site, node) or []):
            args = torch.fx.node.map_aggregate(part.args, value)
            kwargs = torch.fx.node.map_aggregate(part.kwargs, value)
            if part.op == "call_method":
                env[part] = getattr(args[0], part.target)(*args[1:], **kwargs)
            else:
                env[part] = part.target(*args, **kwargs)
        result = env.get(node)
    except Exception:  # noqa: BLE001 - a constant that does not evaluate is no number
        return None
    if not isinstance(result, torch.Tensor) or result.numel() != 1 or result.dtype == torch.bool or result.is_complex():
        return None
    return float(result.item())


def shape_number(site: Site, node: Any) -> float | None:
    """The number a size read off the chain's values computes (``x.sum(2) / x.shape[-1]``, ``/ (h * w)`` with ``h, w
    = x.shape[2:]``, ``x.size(1)``), at the traced shape; None where ``node`` is not one or reads the shape of a
    tensor that is not the chain's (the model's input, another branch). Its nodes read a value of the chain and so
    go with it (``_metadata_closure``); the fused kernels run at the traced shapes alone, any other shape runs the
    chain's own ops, which read the size again."""
    if not isinstance(node, torch.fx.Node) or node.op == "placeholder" or _shape(node) is not None:
        return None
    if not (_is_shape_read(node) or (node.op == "call_function" and node.target in _METADATA_FUNCTIONS)):
        return None
    try:
        result = _size_value(site, node)
    except (Stop, IndexError, TypeError, ValueError, ZeroDivisionError):
        return None
    return float(result) if isinstance(result, (int, float)) and not isinstance(result, bool) else None


def _size_value(site: Site, arg: Any) -> Any:
    """What ``arg`` computes from sizes read off the chain's values and numbers, at the traced shape: a number or a
    tuple of them (``x.shape[1:]``, F.layer_norm's normalized_shape); raises Stop where it reads anything else."""
    if not isinstance(arg, torch.fx.Node):
        if isinstance(arg, (tuple, list)):
            return type(arg)(_size_value(site, a) for a in arg)
        return arg
    if _is_shape_read(arg):
        source = arg.args[0]
        if not (site.is_x(source) or (isinstance(source, torch.fx.Node) and source not in site.producer
                                      and _depends_on(source, site.producer))):
            raise Stop(f"{arg.name} reads the shape of {getattr(source, 'name', source)}, not a chain value")
        shape = _shape(source)
        if shape is None:
            raise Stop(f"{arg.name}: the shape of {source.name} was not traced")
        if arg.op == "call_method" and arg.target == "dim" or arg.op == "call_function" and arg.args[1] == "ndim":
            return len(shape)
        if arg.op == "call_function" and arg.args[1] != "shape":
            raise Stop(f"{arg.name} reads {arg.args[1]}, not a size")
        dims = [_size_value(site, a) for a in arg.args[1:]] if arg.op == "call_method" else []
        return shape[dims[0]] if dims else tuple(shape)
    if arg.op == "call_function" and arg.target in _METADATA_FUNCTIONS:
        return arg.target(*(_size_value(site, a) for a in arg.args))
    raise Stop(f"{arg.name} is not computed from sizes alone")


# What an op's own import module (fusetune/channel_import.py, gate_import.py, slice_import.py) builds its matchers
# on, public for that: Site and Mapped, Stop, bind_op and bind_all, module_input, has_node, fetch, shape_number.


class Stop(Exception):
    """Raised inside a builder: the chain stops before this op, for this reason."""


def _call_args(site: Site) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return tuple(site.node.args), dict(site.node.kwargs)


def bind_all(node: torch.fx.Node, names: Sequence[str], defaults: Mapping[str, Any]) -> dict[str, Any] | str:
    """Positional and keyword arguments by name (the first is the input), defaults filled in."""
    args, kwargs = tuple(node.args), dict(node.kwargs)
    if len(args) > len(names):
        return f"called with {len(args)} positional arguments"
    out = dict(defaults)
    out.update(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            return f"argument {key}= is not in the vocabulary"
        out[key] = value
    missing = [n for n in names if n not in out]
    if missing:
        return f"missing argument {missing[0]}"
    return out


def bind_op(site: Site, names: Sequence[str], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``bind_all`` for the op at ``site``: its input must be the chain's value, its other arguments
    Python values (not computed in the forward)."""
    bound = bind_all(site.node, ["input", *names], defaults)
    if isinstance(bound, str):
        raise Stop(bound)
    if not site.is_x(bound["input"]):
        raise Stop("it reads the chain's value as an argument other than its input")
    for key in names:
        if has_node(bound[key]):
            raise Stop(f"its argument {key} is computed in the forward")
    return bound


def module_input(site: Site) -> None:
    if not site.is_x(_module_argument(site.node)):
        raise Stop("the module is called with more than the chain's value")


def _as_list(window: int | list[int], dims: int) -> list[int]:
    """A pool's window argument (one int for every dim, or one a dim) as one int a dim."""
    return list(window) if isinstance(window, list) else [int(window)] * dims


def _ignore(value: Any, key: str, default: Any) -> None:
    if value != default:
        raise Stop(f"{key}={value!r} is not in the vocabulary")


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Stop(f"a non-number argument {value!r}")
    return float(value)


def _dims(value: Any) -> int | list[int]:
    if isinstance(value, (tuple, list)):
        if not value:
            raise Stop("it reduces every dim, the batch dim included")
        return [int(v) for v in value] if len(value) > 1 else int(value[0])
    if value is None:
        raise Stop("it reduces every dim, the batch dim included (no dim given)")
    return int(value)


def _one(site: Site, *entries: Entry, out: torch.fx.Node | None = None, module: str | None = None) -> Mapped:
    return Mapped(entries=list(entries), out=out or site.node, module=module)


# Builders: each returns a function of the site.


def unary(kind: str, names: Sequence[str] = (), defaults: Mapping[str, Any] | None = None,
          ignored: Mapping[str, Any] | None = None) -> Builder:
    """A functional or method op: ``kind(x, *names)``; ``ignored`` arguments must keep their default
    (inplace: the value is the same either way; the chain reads the op's result)."""
    defaults = dict(defaults or {})
    ignored = dict(ignored or {"inplace": False})

    def build(site: Site) -> Mapped:
        a = bind_op(site, [*names, *ignored], {**defaults, **{k: v for k, v in ignored.items()}})
        entry: Entry = {"op": kind}
        for key in names:
            value = a[key]
            entry[key] = value if isinstance(value, str) else _num(value)
        return _one(site, entry)
    return build


def module_op(kind: str, read: Callable[[nn.Module], Mapping[str, Any]] = lambda m: {}) -> Builder:
    """A module called on the chain's value: its arguments read off its attributes."""
    def build(site: Site) -> Mapped:
        module_input(site)
        return _one(site, {"op": kind, **read(site.module)})
    return build


def binary(kind: str) -> Builder:
    """x (op) other, other (op) x: a number, a per-channel parameter or the producer; c - x is
    neg then add; c / x is pow -1 then mul c (a number or a parameter); c ** x is not in the vocabulary;
    x * x is pow 2, x + x is mul 2."""
    def build(site: Site) -> Mapped:
        args, kwargs = _call_args(site)
        if kwargs or len(args) != 2:
            raise Stop(f"{_describe(site.gm, site.node)} with arguments {sorted(kwargs)} is not in the vocabulary")
        a, b = args
        if site.is_x(a) and site.is_x(b) and not (site.cur & site.producer):
            if kind == "mul":
                return _one(site, {"op": "pow", "by": 2.0})
            if kind == "add":
                return _one(site, {"op": "mul", "by": 2.0})
            raise Stop("both operands are the chain's value")
        if site.is_x(a):
            return Mapped([_binary_entry(kind, site.operand(b))], site.node, _constant_tensor_nodes(site, b) or [])
        if not site.is_x(b):
            raise Stop("its operands do not include the chain's value")
        other = site.operand(a)
        extra = _constant_tensor_nodes(site, a) or []
        if kind in ("add", "mul", "minimum", "maximum"):
            return Mapped([_binary_entry(kind, other)], site.node, extra)
        if kind == "sub":
            return Mapped([{"op": "neg"}, _binary_entry("add", other)], site.node, extra)
        if kind == "div" and not isinstance(other, (str, InputRef)):  # c / x: 1 / x (pow -1), times c unless 1
            scale = [] if other == 1.0 else [_binary_entry("mul", other)]
            return Mapped([{"op": "pow", "by": -1.0}, *scale], site.node, extra)
        raise Stop(f"{'c / x' if kind == 'div' else 'c ** x'} (the chain's value on the right, c {other!r}) is not "
                    "in the vocabulary")
    return build


def _binary_entry(kind: str, operand: Any) -> Entry:
    if isinstance(operand, str) and operand != "producer":
        raise Stop(operand)
    if kind == "div" and operand == 0.0:
        raise Stop("division by zero")
    return {"op": kind, "by": operand}


#: The names torch's binary functions give their two operands (torch.add(input, other), torch.pow(self, exponent),
#: torch.true_divide(dividend, divisor)): a keyword call is bound by them.
_FIRST_OPERAND = ("input", "self", "dividend")
_SECOND_OPERAND = ("other", "exponent", "divisor")


def _method_or_fn_binary(kind: str) -> Builder:
    """torch.add(x, y, alpha=a) / x.sub(y, alpha=a) / x.div(y, rounding_mode=None), positional or by keyword:
    ``binary``'s op, alpha (x + a * y) folded into a number operand (x - 1 * a) or into a multiply of the chain's
    value (y + a * x: mul a then add y; x + a * x: mul 1 + a); a true division (rounding_mode None)."""
    inner = binary(kind)

    def build(site: Site) -> Mapped:
        a, b, options = _binary_operands(site.node)
        alpha = options.pop("alpha", 1)
        if options.pop("rounding_mode", None) is not None and kind == "div":
            raise Stop(f"rounding_mode={site.node.kwargs['rounding_mode']!r} (a rounded division) is not in the "
                       "vocabulary")
        if options:
            raise Stop(f"arguments {sorted(options)} are not in the vocabulary")
        if alpha != 1:
            if kind not in ("add", "sub") or isinstance(alpha, (bool, torch.fx.Node)) or not isinstance(alpha, (int, float)):
                raise Stop(f"alpha={alpha!r} is not in the vocabulary")
            return _scaled_binary(site, kind, a, b, float(alpha))
        node = site.node
        saved = node.args, node.kwargs
        try:
            node.args, node.kwargs = (a, b), {}
            return inner(site)
        finally:
            node.args, node.kwargs = saved
    return build


def _binary_operands(node: torch.fx.Node) -> tuple[Any, Any, dict[str, Any]]:
    """A binary function's or method's two operands, positional or by keyword, and its other keyword arguments."""
    args, kwargs = list(node.args), dict(node.kwargs)
    for names in (_FIRST_OPERAND, _SECOND_OPERAND):
        given = [k for k in names if k in kwargs]
        if len(args) < 2 and given:
            args.append(kwargs.pop(given[0]))
    if len(args) != 2:
        raise Stop(f"called with {len(args)} operands")
    return args[0], args[1], kwargs


def _scaled_binary(site: Site, kind: str, a: Any, b: Any, alpha: float) -> Mapped:
    """a + alpha * b (add) or a - alpha * b (sub), one of them the chain's value."""
    sign = 1.0 if kind == "add" else -1.0
    if site.is_x(a) and site.is_x(b):
        return _one(site, {"op": "mul", "by": 1.0 + sign * alpha})
    if site.is_x(a):
        other = site.operand(b)
        if isinstance(other, float):
            return Mapped([_binary_entry(kind, alpha * other)], site.node, _constant_tensor_nodes(site, b) or [])
        raise Stop(f"alpha={alpha:g} scales the other operand, a tensor ({getattr(b, 'name', b)}): x {'+' if sign > 0 else '-'} "
                   f"{alpha:g} * y is in the vocabulary where y is a number, or the chain's value is y")
    if not site.is_x(b):
        raise Stop("its operands do not include the chain's value")
    other = site.operand(a)
    return Mapped([{"op": "mul", "by": sign * alpha}, _binary_entry("add", other)], site.node,
                  _constant_tensor_nodes(site, a) or [])


def clamp(lo_key: str = "min", hi_key: str = "max", only: str | None = None) -> Builder:
    """torch.clamp(x, min, max), x.clamp(...), clamp_min / clamp_max. A bound that is a tensor (a 0-dim buffer,
    torch.tensor(c), a parameter) is read as a binary op's operand: a number where it is one, else the clamp is
    maximum by min then minimum by max, as PyTorch defines a clamp by tensors."""
    def build(site: Site) -> Mapped:
        names = [only] if only else [lo_key, hi_key]
        a = bind_all(site.node, ["input", *names], {k: None for k in names})
        if isinstance(a, str):
            raise Stop(a)
        if not site.is_x(a["input"]):
            raise Stop("it reads the chain's value as an argument other than its input")
        bounds = {key: _num(a[key]) if not isinstance(a[key], torch.fx.Node) else site.operand(a[key])
                  for key in names if a[key] is not None}
        if not bounds:
            raise Stop("clamp without bounds")
        extra = [n for key in bounds for n in (_constant_tensor_nodes(site, a[key]) or [])]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds.values()):
            return Mapped([{"op": "clamp", **{key: _num(v) for key, v in bounds.items()}}], site.node, extra)
        kinds = {lo_key: "maximum", hi_key: "minimum"}
        return Mapped([_binary_entry(kinds[key], v) for key, v in bounds.items()], site.node, extra)
    return build


def threshold_fn(site: Site) -> Mapped:
    """F.threshold(x, threshold, value) / torch.threshold: x where x > threshold, else value."""
    a = bind_op(site, ["threshold", "value", "inplace"], {"inplace": False})
    return _threshold(site, a["threshold"], a["value"])


def threshold_module(site: Site) -> Mapped:
    module_input(site)
    return _threshold(site, site.module.threshold, site.module.value)


def _threshold(site: Site, threshold: Any, value: Any) -> Mapped:
    """x where x > threshold, else value: max(x, threshold), a clamp, where value is the threshold (relu at 0),
    the forms the planner knows best; else the op threshold (a jump at the threshold)."""
    if _num(threshold) != _num(value):
        return _one(site, {"op": "threshold", "threshold": _num(threshold), "value": _num(value)})
    if _num(threshold) == 0.0:
        return _one(site, {"op": "relu"})
    return _one(site, {"op": "clamp", "min": _num(threshold)})


def round_op(site: Site) -> Mapped:
    """torch.round(x), x.round(), torch.special.round(x): half to even. Another number of decimals scales by a power of
    ten around the rounding, which the op does not."""
    a = bind_op(site, ["decimals"], {"decimals": 0})
    _ignore(a["decimals"], "decimals", 0)
    return _one(site, {"op": "round"})


def extremum(kind: str) -> Builder:
    """torch.max/min: with another tensor (maximum/minimum), or over a dim ([0] or .values)."""
    def build(site: Site) -> Mapped:
        args, kwargs = _call_args(site)
        other = kwargs.get("other", args[1] if len(args) > 1 else None)
        if isinstance(other, torch.fx.Node) and "dim" not in kwargs:
            if kwargs.keys() - {"other"}:
                raise Stop(f"arguments {sorted(kwargs)} are not in the vocabulary")
            saved = (site.node.args, site.node.kwargs)
            try:
                site.node.args, site.node.kwargs = (args[0], other), {}
                return binary("maximum" if kind == "max" else "minimum")(site)
            finally:
                site.node.args, site.node.kwargs = saved
        a = bind_op(site, ["dim", "keepdim"], {"dim": None, "keepdim": False})
        if a["dim"] is None:
            raise Stop(f"torch.{kind}(x) without a dim reduces every value, the batch dim included")
        users = list(site.node.users)
        values = [u for u in users if (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0)
                  or (u.op == "call_function" and u.target is getattr and u.args[1] == "values")]
        if len(values) != 1 or len(users) != 1:
            raise Stop(f"torch.{kind}(x, dim)'s indices are used (only [0] or .values is in the vocabulary)")
        return Mapped(entries=[{"op": kind, "dim": _dims(a["dim"]), "keepdim": bool(a["keepdim"])}],
                      out=values[0], extra=[values[0]])
    return build


def reduction(kind: str, dim_default: Any = None) -> Builder:
    """torch.sum/mean/amax/amin/logsumexp(x, dim, keepdim), and the methods."""
    def build(site: Site) -> Mapped:
        a = bind_op(site, ["dim", "keepdim", "dtype"], {"dim": dim_default, "keepdim": False, "dtype": None})
        _ignore(a["dtype"], "dtype", None)
        return _one(site, {"op": kind, "dim": _dims(a["dim"]), "keepdim": bool(a["keepdim"])})
    return build


def softmax(kind: str, names: Sequence[str] = ("dim",)) -> Builder:
    """torch.softmax(x, dim), F.softmax(x, dim, _stacklevel, dtype), x.softmax(dim)."""
    def build(site: Site) -> Mapped:
        a = bind_op(site, [*names, "dtype"], {**{n: None for n in names}, "_stacklevel": 3, "dtype": None})
        _ignore(a["dtype"], "dtype", None)
        if a["dim"] is None:
            raise Stop(f"{kind} without dim (PyTorch's implicit choice) is not in the vocabulary")
        return _one(site, {"op": kind, "dim": int(a["dim"])})
    return build


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


def pool_fn(kind: str, dims: int) -> Builder:
    """F.max_pool*d / F.avg_pool*d."""
    def build(site: Site) -> Mapped:
        if kind == "max_pool":
            a = bind_op(site, ["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"],
                      {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False})
        else:
            names = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"]
            names += ["divisor_override"] if dims > 1 else []
            a = bind_op(site, names, {"stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True,
                                    "divisor_override": None})
        return _one(site, _pool_entry(kind, dims, a))
    return build


def pool_module(kind: str) -> Builder:
    def build(site: Site) -> Mapped:
        module_input(site)
        m = site.module
        dims = int(type(m).__name__[-2])
        a = {key: getattr(m, key) for key in ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                               "return_indices", "count_include_pad", "divisor_override")
             if hasattr(m, key)}
        return _one(site, _pool_entry(kind, dims, a))
    return build


def _pool_entry(kind: str, dims: int, a: Mapping[str, Any]) -> Entry:
    padding = _as_list(_window(a.get("padding", 0), dims), dims)
    # ceil_mode as the user wrote it: where it adds no window at the config's shapes the planner takes the pool as
    # floor mode there, and the model runs PyTorch's forward at any other shape (regions.ceil_adds_no_window)
    ceil = bool(a.get("ceil_mode"))
    if _window(a.get("dilation", 1), dims) != 1:
        raise Stop(f"dilation={a['dilation']!r} is not in the vocabulary (the pools take dilation 1)")
    if a.get("return_indices"):
        raise Stop("return_indices=True is not in the vocabulary")
    if a.get("divisor_override") is not None:
        raise Stop("divisor_override is not in the vocabulary")
    entry: Entry = {"op": kind, "kernel_size": _window(a["kernel_size"], dims)}
    stride = a.get("stride")
    if stride not in (None, [], ()) and _window(stride, dims) != entry["kernel_size"]:
        entry["stride"] = _window(stride, dims)
    if _window(a.get("padding", 0), dims) != 0:
        entry["padding"] = _window(a["padding"], dims)
    if ceil:
        entry["ceil_mode"] = True
    if not a.get("count_include_pad", True) and any(padding):  # (without padding the two divisors are one)
        entry["count_include_pad"] = False
    return entry


def adaptive(kind: str, module: bool) -> Builder:
    def build(site: Site) -> Mapped:
        if module:
            module_input(site)
            size, indices = site.module.output_size, getattr(site.module, "return_indices", False)
        else:
            names = ["output_size"] + (["return_indices"] if kind == "adaptive_max_pool" else [])
            a = bind_op(site, names, {"return_indices": False})
            size, indices = a["output_size"], a.get("return_indices", False)
        if indices:
            raise Stop("return_indices=True is not in the vocabulary")
        sizes = list(size) if isinstance(size, (list, tuple)) else [size]
        if any(s is None for s in sizes):
            raise Stop(f"output_size {size!r} keeps a dim's size (None), not in the vocabulary")
        return _one(site, {"op": kind, "output_size": int(sizes[0]) if len(set(sizes)) == 1 else [int(s) for s in sizes]})
    return build


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


def prelu_module(site: Site) -> Mapped:
    """nn.PReLU: its weight, one value or one per channel, is the op's parameter (``by``), under the user's name."""
    module_input(site)
    return _prelu(site, f"{site.node.target}.weight", site.module.weight)


def prelu_fn(site: Site) -> Mapped:
    """F.prelu(x, weight), torch.prelu: the weight a tensor of the model (a parameter, a buffer)."""
    bound = bind_all(site.node, ["input", "weight"], {})
    if isinstance(bound, str):
        raise Stop(bound)
    if not site.is_x(bound["input"]):
        raise Stop("it reads the chain's value as an argument other than its input")
    weight = bound["weight"]
    if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr"):
        raise Stop("its weight is computed in the forward, not a tensor of the model")
    return _prelu(site, str(weight.target), fetch(site.gm, weight.target))


def _prelu(site: Site, target: str, weight: Any) -> Mapped:
    """PReLU's weight applies along dim 1 whatever its rank (torch's rule, not broadcasting's): one value, or
    one per channel of the chain's value."""
    shape = site.shape_in or ()
    channels = shape[1] if len(shape) > 1 else 1
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.numel() not in (1, channels):
        size = list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise Stop(f"its weight {target} of shape {size} is neither one value nor one per channel ({channels})")
    if weight.numel() > 1 and channels != site.channels:
        raise Stop(f"its weight has {channels} values, one per channel of a value that is no longer the "
                    f"convolution's {count(site.channels, 'channel')}")
    return _one(site, {"op": "prelu", "by": ParamRef(target, tuple(int(s) for s in weight.shape))})


def identity_module(site: Site) -> Mapped:
    module_input(site)
    return Mapped(entries=[], out=site.node)


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


def _pow_form(exponent: float) -> Builder:
    def build(site: Site) -> Mapped:
        bind_op(site, [], {})
        return _one(site, {"op": "pow", "by": exponent})
    return build


def cast(site: Site) -> Mapped:
    """A cast reached as an op: one that changes the dtype, or reads its dtype off a tensor outside the chain (one
    that keeps it otherwise is an identity, _is_identity)."""
    to, now = _dtype(site.node), _dtype(next(iter(site.cur)))
    if to is not None and to == now:
        raise Stop(f"it keeps the dtype ({to}) but reads it off a tensor outside the chain, which stays in PyTorch")
    raise Stop(f"it casts the value to {to or 'another type'}; the chain computes in {now}, as traced")


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

#: relu6(x + 3) as PyTorch users write it.
_RELU6_OF_X_PLUS_3: tuple[tuple[Entry, ...], ...] = (
    ({"op": "add", "by": 3.0}, {"op": "relu6"}),
    ({"op": "add", "by": 3.0}, {"op": "clamp", "min": 0.0, "max": 6.0}),
    ({"op": "add", "by": 3.0}, {"op": "hardtanh", "min_val": 0.0, "max_val": 6.0}),
)
#: ``x * f(x)`` written out by hand: the entries of f (a run of the table's unary ops from x to the
#: multiply) -> the vocabulary's entries computing ``x * f(x)``; the chain's value is read twice, which no
#: single op of the table takes.
IDIOMS: tuple[tuple[tuple[Entry, ...], tuple[Entry, ...]], ...] = (
    (({"op": "sigmoid"},), ({"op": "silu"},)),
    (({"op": "softplus", "beta": 1.0, "threshold": 20.0}, {"op": "tanh"}), ({"op": "mish"},)),
    (({"op": "hardsigmoid"},), ({"op": "hardswish"},)),
    # x * relu6(x + 3) is 6 hardswish(x) (its / 6 follows as an op of its own)
    *((run, ({"op": "hardswish"}, {"op": "mul", "by": 6.0})) for run in _RELU6_OF_X_PLUS_3),
    # x * (relu6(x + 3) / 6), x * clamp((x + 3) / 6, 0, 1): hardswish
    *((run + ({"op": "div", "by": 6.0},), ({"op": "hardswish"},)) for run in _RELU6_OF_X_PLUS_3),
    (({"op": "add", "by": 3.0}, {"op": "div", "by": 6.0}, {"op": "clamp", "min": 0.0, "max": 1.0}),
     ({"op": "hardswish"},)),
    (({"op": "add", "by": 3.0}, {"op": "div", "by": 6.0}, {"op": "hardtanh", "min_val": 0.0, "max_val": 1.0}),
     ({"op": "hardswish"},)),
)
#: The multiply that closes an idiom: operator.mul, torch.mul, x.mul(y), torch.multiply, x.multiply(y).
_MUL_TARGETS = (("call_function", operator.mul), ("call_function", torch.mul), ("call_method", "mul"),
                ("call_function", torch.multiply), ("call_method", "multiply"))


def match_idiom(site: Site, readers: Sequence[torch.fx.Node]
                ) -> tuple[list[torch.fx.Node], list[Entry], torch.fx.Node] | None:
    """``x * f(x)`` where the chain's value x has exactly two readers: the multiply and the first op of f.
    Returns (f's nodes, the idiom's entries, the multiply), or None where the readers are anything else."""
    if len(readers) != 2:
        return None
    for mul, first in (readers, readers[::-1]):
        if (mul.op, mul.target) not in _MUL_TARGETS or mul.kwargs or len(mul.args) != 2:
            continue
        inner: list[torch.fx.Node] = []
        entries: list[Entry] = []
        node, cur = first, set(site.cur)
        while node is not mul and len(inner) < 3:
            builder = lookup(site.gm, node)
            if builder is None or overwrites_input(site.gm, node):  # in place: the multiply would read f(x) twice
                break
            try:
                mapped = builder(dataclasses.replace(site, node=node, cur=cur))
            except Exception:  # noqa: BLE001 - Stop, or arguments no row foresaw: no idiom
                break
            if isinstance(mapped, str) or mapped.out is not node or mapped.module is not None or len(node.users) != 1:
                break
            inner.append(node)
            entries.extend(mapped.entries)
            cur = {node}
            node = next(iter(node.users))
        if node is not mul or not inner:
            continue
        a, b = mul.args
        if not ((site.is_x(a) and b is inner[-1]) or (site.is_x(b) and a is inner[-1])):
            continue
        for pattern, replacement in IDIOMS:
            if list(pattern) == entries:
                return inner, [dict(e) for e in replacement], mul
    return None


#: The subtraction that closes a mean centring: x - m, torch.sub(x, m), x.sub(m), torch.subtract, x.subtract(m).
_SUB_TARGETS = (("call_function", operator.sub), ("call_function", torch.sub), ("call_method", "sub"),
                ("call_function", torch.subtract), ("call_method", "subtract"))
#: The mean a centring subtracts: torch.mean(x, dim, keepdim=True), x.mean(dim, keepdim=True).
_MEAN_TARGETS = (("call_function", torch.mean), ("call_method", "mean"))


def match_centring(site: Site, readers: Sequence[torch.fx.Node]) -> tuple[list[torch.fx.Node], Entry] | None:
    """``x - x.mean(dim, keepdim=True)`` where the chain's value x has exactly two readers: the mean (read by the
    subtraction alone) and the subtraction of it from x. Returns (the mean and the subtraction; the config's
    entry, ``{op: sub, by: {op: mean, dim, keepdim: true}}``: fusetune/ops/norm.py's MeanCentre), or None."""
    if len(readers) != 2:
        return None
    for mean, sub in (readers, readers[::-1]):
        if ((mean.op, mean.target) not in _MEAN_TARGETS or (sub.op, sub.target) not in _SUB_TARGETS
                or list(mean.users) != [sub] or len(sub.args) != 2 or set(sub.kwargs) - {"alpha"}
                or sub.kwargs.get("alpha", 1) != 1 or not site.is_x(sub.args[0]) or sub.args[1] is not mean):
            continue
        try:
            mapped = reduction("mean")(dataclasses.replace(site, node=mean))
        except Stop:
            return None
        (entry,) = mapped.entries
        if not entry["keepdim"]:
            return None  # x - x.mean(dim): the mean broadcast against other dims than it reduced
        return [mean, sub], {"op": "sub", "by": {"op": "mean", "dim": entry["dim"], "keepdim": True}}
    return None


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


def _constant(gm: torch.fx.GraphModule, arg: Any) -> bool:
    """A number, or a one-value constant of the trace (torch.tensor(2.0) in the forward); not a parameter."""
    if isinstance(arg, torch.fx.Node):
        if arg.op != "get_attr":
            return False
        value = fetch(gm, arg.target)
        return isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.numel() == 1 \
            and str(arg.target).startswith("_tensor_constant")
    return isinstance(arg, (int, float, bool)) or arg is None


def match_pointwise_region(site: Site, readers: Sequence[torch.fx.Node]
                           ) -> tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None:
    """Elementwise ops on the chain's value x, all of its readers among them, that join in one node J and
    compute one op of the vocabulary however written (an erf GELU, ``torch.where(x > 0, x, x * s)``): every
    node between x and J reads only x, nodes of the region and constants, has x's shape and no reader
    outside the region. The region is evaluated in float64 on ``_PROBE`` and compared with each of
    ``REGION_CANDIDATES`` (leaky_relu's slope read off its value at -1); where none matches at any join, the first
    region an ``expression`` computes (``_region_expression``: a custom form such as ``x * torch.tanh(x)``), unless
    the vocabulary's own ops take the readers otherwise (``_expression_fallback``). Returns (the region's nodes, J
    last; the op's entry; J), or None."""
    gm, shape = site.gm, site.shape_in
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    region: list[torch.fx.Node] = []
    frontier = sorted(readers, key=order.__getitem__)
    seen: set[torch.fx.Node] = set()
    fallback: tuple[list[torch.fx.Node], Entry, torch.fx.Node] | None = None  # the first region an expression takes
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
            if fallback is None and (expression := _region_expression(gm, site, region, join)) is not None:
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


def _region_expression(gm: torch.fx.GraphModule, site: Site, region: list[torch.fx.Node],
                       join: torch.fx.Node) -> Entry | None:
    """The region as an ``expression`` entry (x, numbers, arithmetic and the vocabulary's parameter-free functions),
    accepted where it computes the region's own values on ``_PROBE`` in float64; None where a node has no form in
    the grammar or the values differ."""
    from fusetune.ops.expression import ExpressionError, canonical_text, evaluate, parse_expression

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
    readers: the convolution's output read twice is read by name after it (``by: producer``), and walk_chain tries an
    idiom (match_idiom, x * f(x) as silu, mish, hardswish) after the regions."""
    if fallback is None or site.cur & site.producer or match_idiom(site, readers) is not None:
        return None
    return fallback


#: Ops that return their input's value: the chain's value under another name (``r = x.clone()``).
IDENTITY_METHODS = ("clone", "detach", "contiguous")
IDENTITY_FUNCTIONS = (torch.clone, torch.detach)
#: Reads of a tensor's metadata, not its values (x.size(0) in x.view(x.size(0), -1)).
SHAPE_METHODS = ("size", "dim")
SHAPE_ATTRIBUTES = ("shape", "ndim", "dtype", "device")


def stochastic_depth(site: Site) -> Mapped:
    """torchvision.ops.stochastic_depth(input, p, mode, training): torch.fx.wrap'ed, so a call of its own in the
    trace (torchvision's EfficientNet, ConvNeXt, Swin before their residual add); the identity in eval mode or at
    p = 0, as a dropout."""
    a = bind_op(site, ["p", "mode", "training"], {"training": True})
    return _one(site, _dropout_entry(_num(a["p"]), bool(a["training"])))


#: Functions of other packages that torch.fx keeps as calls of their own (``torch.fx.wrap``), by module and name:
#: matched without importing the package (a model that uses one has imported it).
NAMED_FUNCTIONS: dict[tuple[str, str], Builder] = {
    ("torchvision.ops.stochastic_depth", "stochastic_depth"): stochastic_depth,
}


def frozen_batch_norm(site: Site) -> Mapped:
    """A FrozenBatchNorm2d (torchvision's, detectron2's: the detection backbones'): an eval-mode batch norm of its
    buffers weight, bias, running_mean and running_var, which its forward folds into x * scale + bias."""
    module_input(site)
    names = ("weight", "bias", "running_mean", "running_var")
    return Mapped([{"op": "batch_norm", "eps": float(getattr(site.module, "eps", 1e-5)), "affine": True,
                    "training": False}], site.node, weights={n: f"{site.node.target}.{n}" for n in names})


#: Modules of other packages the vocabulary takes whole, by module and class name: the trace keeps them as calls
#: (_Tracer), matched without importing the package.
NAMED_MODULES: dict[tuple[str, str], Builder] = {
    ("torchvision.ops.misc", "FrozenBatchNorm2d"): frozen_batch_norm,
    ("detectron2.layers.batch_norm", "FrozenBatchNorm2d"): frozen_batch_norm,
}


def _named_module(module: nn.Module) -> Builder | None:
    cls = type(module)
    return NAMED_MODULES.get((cls.__module__, cls.__qualname__))


def _hooked(module: nn.Module) -> str | None:
    """Why a module called whole cannot be a chain's op: forward hooks or pre-hooks on it (or global ones) run
    around its call, and a fused chain never calls it. torch.nn.utils.weight_norm and spectral_norm are such hooks:
    they recompute ``module.weight`` at each call, so a kernel bound to that attribute would read a stale weight
    once the user's weight_g / weight_orig change, and a user's hook that records or edits the output would never
    run. None where the call is the module's forward alone."""
    from torch.nn.modules import module as torch_module

    hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values(),
             *torch_module._global_forward_pre_hooks.values(), *torch_module._global_forward_hooks.values()]
    if not hooks:
        return None
    names = sorted({getattr(h, "__qualname__", type(h).__name__) for h in hooks})
    return f"{type(module).__name__} has forward hooks ({', '.join(names)}) that a fused chain would not run"


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


def _is_convolution(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return type(module) in _CONV_MODULES or parametrized_convolution(module, _CONV_MODULES)
    return node.op == "call_function" and node.target in _CONV_FUNCTIONS


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


def _dtype(node: Any) -> torch.dtype | None:
    """The traced dtype of a node's value (None where it is not a tensor or was not traced)."""
    meta = getattr(node, "meta", {}).get("tensor_meta") if isinstance(node, torch.fx.Node) else None
    return getattr(meta, "dtype", None)


def _is_shape_read(node: torch.fx.Node) -> bool:
    if node.op == "call_method" and node.target in SHAPE_METHODS:
        return True
    return node.op == "call_function" and node.target is getattr and node.args[1] in SHAPE_ATTRIBUTES


def _is_size_arithmetic(node: torch.fx.Node) -> bool:
    """``x.shape[2] * x.shape[3]``, ``b.shape[1:]``: a number or a size computed from shape reads and numbers alone."""
    if node.op != "call_function" or node.target not in _METADATA_FUNCTIONS or _shape(node) is not None:
        return False
    return bool(node.all_input_nodes) and all(_is_shape_read(n) or _is_size_arithmetic(n) for n in node.all_input_nodes)


def _read_what(node: torch.fx.Node) -> str:
    """What a metadata read reads: x.shape, x.dtype, x.size(2), x.dim()."""
    if node.op == "call_function":
        return str(node.args[1])
    return {"size": "shape", "dim": "rank"}.get(str(node.target), "metadata")


def _describe(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"{type(gm.get_submodule(node.target)).__name__} ({node.target})"
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):  # torch.export's ATen level (fusetune/exported.py)
            return f"torch.ops.{target.name().replace('::', '.')}"
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__name__", str(target))
        module = {"torch._C._nn": "torch.nn.functional", "_operator": "operator",
                  "torch._C._VariableFunctions": "torch"}.get(module, module)
        return f"{module}.{name}" if module else name
    return node.op


# --------------------------------------------------------------------------------------------------
# Chains


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


#: What the forward computes from a shape (b, c, d, h, w = x.shape; x.size(2) * x.size(3)): its parts and sizes.
_METADATA_FUNCTIONS = (operator.getitem, operator.mul, operator.floordiv, operator.add, operator.sub)


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


def _channel_import():
    """fusetune/channel_import.py: the norms over the channels' patterns (it imports this module's helpers)."""
    from fusetune import channel_import

    return channel_import


def _slice_import():
    """fusetune/slice_import.py: the slice op's forms (it imports this module's helpers)."""
    from fusetune import slice_import

    return slice_import


def _gate_import():
    """fusetune/gate_import.py: the gated activations' patterns (it imports this module's helpers)."""
    from fusetune import gate_import

    return gate_import


def _gate(gm: torch.fx.GraphModule, values: list[torch.fx.Node], cur: list[torch.fx.Node],
          producer: list[torch.fx.Node], channels: int, dims: int) -> Any:
    """A gated product of two halves of the chain's value whose first nodes are every reader of it (gate_import's
    match_gate; one op, taken as a layer norm over the channels is), or None. ``channels``: the chain's now."""
    if not values:
        return None
    site = Site(gm, values[0], set(cur), set(producer), channels, dims)
    return _gate_import().match_gate(site, values)


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


def _channel_norm(gm: torch.fx.GraphModule, values: list[torch.fx.Node], cur: list[torch.fx.Node],
                  producer: list[torch.fx.Node], channels: int, dims: int) -> Any:
    """A layer norm over the channels whose first nodes are every reader of the chain's value (channel_import's
    match_channel_norm), or None. ``channels``: the chain's now (half the convolution's after a glu)."""
    if not values:
        return None
    site = Site(gm, values[0], set(cur), set(producer), channels, dims)
    return _channel_import().match_channel_norm(site, values)


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
        if len(values) == 2:
            site = Site(gm, values[0], set(cur), set(producer), channels, dims)
            centring = match_centring(site, values)
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
    chain.output_node = _last_value(chain)
    chain.size_nodes = _size_nodes(gm, chain)
    settle_sizes(chain)
    chain.producer_readers = [r.name for r in _readers(gm, producer)[0]]
    nodes = {n.name: n for n in gm.graph.nodes}
    chain.derived_readers = {name: [u.name for u in nodes[name].users] for step in chain.steps for e in step.entries
                             if isinstance(ref := e.get("by"), DerivedRef) for name in ref.nodes}
    settle_derived(chain)
    outside = [p.name for p in pending if p.name not in chain.nodes]
    if outside:
        return NoChain(node.name, f"the convolution's output is also read by {', '.join(outside)}, outside "
                                  "the chain (a chain's intermediate values are not kept)")
    return chain


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


def _last_value(chain: Chain) -> str:
    """The node holding the chain's output: the last step's value (or the convolution's)."""
    for step in reversed(chain.steps):
        if step.entries or step.nodes:
            return step.value or (step.nodes[-1] if step.nodes else chain.producer_node)
    return chain.producer_node


# --------------------------------------------------------------------------------------------------
# Configs


def _param_name(target: str, taken: Mapping[str, str]) -> str:
    """The config's name of a per-channel parameter: the user's attribute name, where it is a valid
    config name; else made one."""
    base = target.replace(".", "_")
    name = base if base.isidentifier() and not base.startswith("_") and not _reserved(base) else f"param_{base.lstrip('_')}"
    candidate, i = name, 1
    while candidate in taken and taken[candidate] != target:
        candidate, i = f"{name}_{i}", i + 1
    return candidate


def chain_config(chain: Chain, name: str, steps: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The config of the chain's first ``steps`` steps, and the weights (generated Model state key ->
    the user's name)."""
    from fusetune.ops import REGISTRY

    chosen = chain.steps[:steps] if steps is not None else chain.steps
    params: dict[str, str] = {}
    sizes: dict[str, tuple[int, ...]] = {}  # each parameter's shape in the user's model
    weights = dict(chain.weights)
    epilogue: list[Entry] = []
    inputs = chain_inputs(chain, steps)
    names = _operand_names(chosen)
    for s, step in enumerate(chosen):
        first = len(epilogue)
        for e, entry in enumerate(step.entries):
            entry = dict(entry)
            if isinstance(entry.get("by"), InputRef):
                entry["by"] = next(name for name, node in inputs.items() if node == entry["by"].node)
            for key in _operand_keys():
                pname = names.get((s, e, key))
                if pname is None:
                    continue
                ref = entry[key]
                params[pname] = ref.target
                sizes[pname] = ref.derivation.shape if isinstance(ref, DerivedRef) else ref.shape
                if isinstance(ref, ParamRef):  # a DerivedRef's tensor the fused chain computes (chain_derived)
                    weights[pname] = ref.target
                entry[key] = pname
            epilogue.append(entry)
        if step.module is not None:
            i = first  # a module op is one entry: reference_attr's f"{kind}_{i}"
            attr = f"{epilogue[i]['op']}_{i}"
            if REGISTRY[epilogue[i]["op"]].role == "norm":
                weights.update(_norm_weights(attr, step.module, epilogue[i]))
        if step.weights:  # a functional norm's weight and bias, wherever the model keeps them
            attr = f"{epilogue[first]['op']}_{first}"
            weights.update({f"{attr}.{name}": target for name, target in step.weights.items()})
    raw: dict[str, Any] = {"name": name, "producer": dict(chain.producer)}
    if params:
        raw["parameters"] = {p: {"shape": "scalar" if math.prod(sizes[p]) == 1 else "per_channel", "init": "randn"}
                             for p in params}
    if inputs:
        kinds = {ref.node: ref.kind for step in chosen for e in step.entries if isinstance(ref := e.get("by"), InputRef)}
        raw["inputs"] = [name if kinds.get(node, broadcast.FULL) == broadcast.FULL else {"name": name, "shape": kinds[node]}
                         for name, node in inputs.items()]
    raw["epilogue"] = epilogue
    raw["shapes"] = [list(chain.input_shape)]
    return raw, weights


def _operand_keys() -> tuple[str, ...]:
    """The entry keys that may hold a parameter operand: a binary op's ``by``, a layer norm over the channels'
    weight and bias."""
    return ("by", *_channel_import().PARAM_KEYS)


def _operand_names(chosen: Sequence[Step]) -> dict[tuple[int, int, str], str]:
    """(step, entry, key) -> the config name of each parameter operand of these steps (a ParamRef or a DerivedRef
    ``by``, a channel layer norm's ParamRef weight and bias), named in the chain's order, a tensor named twice
    keeping its first name: chain_config writes these names, chain_derived reads them."""
    taken: dict[str, str] = {}
    names: dict[tuple[int, int, str], str] = {}
    for s, step in enumerate(chosen):
        for e, entry in enumerate(step.entries):
            for key in _operand_keys():
                ref = entry.get(key)
                if isinstance(ref, ParamRef) or (key == "by" and isinstance(ref, DerivedRef)):
                    pname = _param_name(ref.target, taken)
                    taken[pname] = ref.target
                    names[(s, e, key)] = pname
    return names


def chain_derived(chain: Chain, steps: int | None = None) -> dict[str, Derivation]:
    """The parameters of the config of the chain's first ``steps`` steps that the fused chain computes from the
    model's tensors (DerivedRef operands), by their config names (_operand_names, as chain_config writes them),
    after the convolution's own tensors the model computes (``producer.weight``, ``producer.bias``:
    Chain.producer_derived)."""
    chosen = chain.steps[:steps] if steps is not None else chain.steps
    out: dict[str, Derivation] = dict(chain.producer_derived)  # the convolution's own (producer.weight, ...)
    for (s, e, key), pname in _operand_names(chosen).items():
        ref = chosen[s].entries[e][key]
        if isinstance(ref, DerivedRef):
            out[pname] = ref.derivation
    return out


def chain_inputs(chain: Chain, steps: int | None = None) -> dict[str, str]:
    """The extra inputs of the config of the chain's first ``steps`` steps (InputRef operands), in the order
    the chain reads them: config name -> the graph node that holds it (what the fused module is called with)."""
    from fusetune.config import INPUT_RESERVED

    taken = {ref.target.replace(".", "_") for step in chain.steps for e in step.entries
             if isinstance(ref := e.get("by"), ParamRef)}
    out: dict[str, str] = {}
    for step in (chain.steps[:steps] if steps is not None else chain.steps):
        for entry in step.entries:
            ref = entry.get("by")
            if not isinstance(ref, InputRef) or ref.node in out.values():
                continue
            name = ref.name if ref.name.isidentifier() and not ref.name.startswith("_") else ref.name.strip("_")
            if not name.isidentifier() or name in INPUT_RESERVED or keyword.iskeyword(name) or _reserved(name):
                name = f"{_INPUT_PREFIX}{name}"
            candidate, i = name, 1
            while candidate in out or candidate in taken:
                candidate, i = f"{name}_{i}", i + 1
            out[candidate] = ref.node
    return out


def _norm_weights(attr: str, module: str, entry: Entry) -> dict[str, str]:
    names: list[str] = []
    if entry.get("affine", entry.get("elementwise_affine", False)):
        names += ["weight", "bias"]
    if entry["op"] == "batch_norm":
        names += ["running_mean", "running_var", "num_batches_tracked"]
    return {f"{attr}.{n}": f"{module}.{n}" for n in names}


@dataclasses.dataclass
class Written:
    chain: Chain
    config: Path
    name: str
    steps: int  # how many of the chain's steps the config takes
    weights: dict[str, str]
    parameters: dict[str, str]  # config name -> the user's attribute
    epilogue: list[Entry]
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # config name -> how the user's shape binds
    #: The config's extra inputs (inputs:): config name -> the graph node the fused module is called with.
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The parameters computed from the model's tensors at each call (DerivedRef): config name -> how.
    derived: dict[str, Derivation] = dataclasses.field(default_factory=dict)


def _shape_note(gm: torch.fx.GraphModule, target: str, raw: Mapping[str, Any], name: str | None = None) -> str:
    """", shape [1, 5, 1, 1], bound as a view of shape [5, 1, 1]" where the user's tensor is not of the shape the
    config declares ((C, 1, ..., 1) per channel), and ", a single value (shape: scalar)" for a scalar one (0-dim,
    the user's (1, 1, 1) bound as a 0-dim view)."""
    value = fetch(gm, target)
    producer = raw["producer"]
    if value.numel() == 1:  # a scalar parameter (chain_config)
        return ", a single value (shape: scalar)" + (", bound as a 0-dim view" if value.dim() else "")
    declared = [_gate_import().read_channels(raw, name)] + [1] * KINDS[producer["op"]].spatial_dims
    if list(value.shape) == declared:
        return ""
    return f", shape {list(value.shape)}, bound as a view of shape {declared}"


def fit_chain(chain: Chain, name: str, path: Path) -> tuple[int, dict[str, Any], dict[str, str]] | str:
    """The longest prefix of the chain whose config validates: (steps, raw config, weights), or why none does."""
    if not chain.steps:
        return f"no op of the vocabulary follows the convolution: {chain.end}"
    last_error = ""
    for k in range(len(chain.steps), 0, -1):
        raw, weights = chain_config(chain, name, k)
        if not raw["epilogue"]:
            continue
        refused = _refusal(raw, path)
        if refused is not None:
            last_error = refused
            if k == len(chain.steps):
                step = chain.steps[-1]
                chain.end = f"{step.nodes[-1] if step.nodes else '?'} is refused by the config's validation: {last_error}"
                chain.end_node = step.nodes[0] if step.nodes else None
            continue
        if k < len(chain.steps):
            kept = {n for step in chain.steps[:k] for n in step.nodes}
            outside = [r for r in chain.producer_readers if r not in kept]
            if outside:
                return (f"the config's validation refuses {chain.steps[k].nodes[0] if chain.steps[k].nodes else '?'} "
                        f"({last_error}), and without it the convolution's output is also read by "
                        f"{', '.join(outside)}, outside the chain (a chain's intermediate values are not kept)")
            chain.end_node = chain.steps[k].nodes[0] if chain.steps[k].nodes else None
            chain.end = f"the config's validation refuses what follows: {last_error}"
            chain.steps = chain.steps[:k]
            chain.output_node = _last_value(chain)
            settle_derived(chain)
            settle_sizes(chain)
        return k, raw, weights
    # steps of no op (nn.Identity, a same-dtype cast): the chain's end says what stopped it after them
    return last_error or f"no op of the vocabulary follows the convolution: {chain.end}"


def _in_model_dtype(raw: dict[str, Any], dtype: torch.dtype, path: Path) -> tuple[dict[str, Any], str]:
    """The config at the dtype its convolution computes in (traced in float32, its chain is the same at any), and a
    header line saying so; float32 where the kernels do not take that dtype (float64) or the config at it does not
    plan, said."""
    from fusetune.dtypes import DTYPES

    name = next((n for n, d in DTYPES.items() if getattr(torch, d.torch) == dtype), None)
    if dtype == torch.float32:
        return raw, ""
    if name is None:
        return raw, (f"# The model computes in {str(dtype).removeprefix('torch.')}; the kernels take "
                     f"{', '.join(DTYPES)}: this config is float32.\n")
    refused = _refusal({**raw, "dtype": name}, path)
    if refused is not None:
        return raw, f"# The model computes in {name}; at {name} the config does not plan ({refused}): float32 here.\n"
    return {**raw, "dtype": name}, f"# dtype {name}: the convolution's, as the model keeps it (traced in float32).\n"


def _refusal(raw: Mapping[str, Any], path: Path) -> str | None:
    """Why the config would not be written: its validation's message, or the planner's error (a config the
    planner cannot take stays in PyTorch with that reason rather than failing the import); None where it plans."""
    from fusetune.plan import make_plan

    try:
        spec = parse_config(raw, str(path))
    except ConfigError as exc:
        return exc.message if not exc.key else f"{exc.key}: {exc.message}"
    try:
        make_plan(spec)
    except Exception as exc:  # noqa: BLE001 - any planner failure keeps the chain in PyTorch, named
        return f"the planner fails on it ({type(exc).__name__}: {exc})"
    return None


def _dump(raw: Mapping[str, Any], header: str) -> str:
    text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=120)
    return header + text


def write_config(path: Path, text: str) -> None:
    """Write a config atomically, after ``load_config`` accepts it (never a half-written or invalid file), with the
    mode a plain write gives (cache.atomic_write_text)."""
    from fusetune.cache import atomic_write_text

    def validates(tmp: Path) -> None:
        try:
            load_config(tmp)
        except ConfigError as exc:
            raise FusetuneError(f"{path}: the generated config does not validate: {exc.message}") from None
    atomic_write_text(path, text, check=validates)


# --------------------------------------------------------------------------------------------------
# The import


@dataclasses.dataclass
class ImportResult:
    loaded: LoadedModel
    gm: torch.fx.GraphModule
    written: list[Written]
    pytorch: dict[str, str]  # node -> why it stays in PyTorch
    map_path: Path
    lines: list[str]


def find_chains(gm: torch.fx.GraphModule) -> tuple[list[Chain], list[NoChain]]:
    chains: list[Chain] = []
    refused: list[NoChain] = []
    for node in gm.graph.nodes:
        try:
            match = match_producer(gm, node)
        except Exception as exc:  # noqa: BLE001 - arguments no case foresaw: the convolution stays in PyTorch
            match = f"its arguments could not be read ({type(exc).__name__}: {exc})"
        if match is None:
            continue
        wrong = _input_rank(gm, node)  # an unbatched example input PyTorch takes (Conv2d on [C, H, W])
        if wrong is not None:
            match = wrong[0]
        if isinstance(match, str):
            refused.append(NoChain(node.name, f"a convolution fusetune does not take: {match}"))
            continue
        try:
            found: Chain | NoChain = walk_chain(gm, node, match)
        except Exception as exc:  # noqa: BLE001 - a graph no case foresaw: this convolution stays in PyTorch, named
            found = NoChain(node.name, f"the importer could not follow its output ({type(exc).__name__}: {exc})")
        (chains if isinstance(found, Chain) else refused).append(found)
    return chains, refused


def import_model(spec: str, out_dir: Path, input_shapes: Sequence[Shape] = (), force: bool = False) -> ImportResult:
    """Load, trace, find the chains, write one config per chain and the map (``force``: over configs edited since
    an earlier import wrote them too: _check_overwrites)."""
    loaded = load_model(spec, input_shapes)
    model = _copy(loaded.model)
    try:
        gm = trace(model, loaded.inputs, spec)
    except TraceError as exc:
        raise TraceError(f"{exc}{_cast_note(loaded)}") from None
    differs = trace_differs(model, gm, loaded.inputs)
    if differs is not None:  # configs of a chain the model does not compute would be tuned for nothing, or worse
        raise TraceError(f"{spec}: the model's {differs}")
    return import_traced(loaded, gm, Path(out_dir), force)


def _cast_note(loaded: LoadedModel) -> str:
    """Where the model holds tensors of other dtypes than float32, that load_model cast them to float32 for the
    trace: a forward casting by itself (``self.conv(x.half())``) then meets float32 weights, which the user's model
    does not; a failure to run the trace may be that."""
    others = sorted({str(d).removeprefix("torch.") for d in loaded.tensor_dtypes.values()} - {"float32"})
    if not others:
        return ""
    return (f"; note: the model's {', '.join(others)} tensors were cast to float32 for the trace (on the CPU), so a "
            "forward that casts its own values (x.half(), .to(torch.bfloat16)) fails where the model does not: "
            "remove those casts to import it")


def _copy(model: nn.Module) -> nn.Module:
    """A copy to trace and run: the user's model (a training-mode batch norm's statistics) is left as it was."""
    import copy

    from fusetune.computed_weights import hook_tensors

    try:  # a hook's computed weight (weight_norm, prune) is shared: the hook computes it again at each call
        return copy.deepcopy(model, hook_tensors(model))
    except Exception:
        return model


def import_traced(loaded: LoadedModel, gm: torch.fx.GraphModule, out_dir: Path, force: bool = False) -> ImportResult:
    """Write one config per chain and the map, after every config is made and checked against what the folder holds
    (_check_overwrites): a refusal writes nothing."""
    chains, refused = find_chains(gm)
    written: list[Written] = []
    texts: dict[Path, str] = {}
    for chain in chains:
        name = f"{loaded.stem}_chain{len(written)}"
        path = out_dir / f"{name}.yaml"
        try:
            fitted = fit_chain(chain, name, path)
        except Exception as exc:  # noqa: BLE001 - a chain no case foresaw stays in PyTorch, named; the others go on
            fitted = f"writing its config failed ({type(exc).__name__}: {exc})"
        if isinstance(fitted, str):
            refused.append(NoChain(chain.producer_node, f"no config validates: {fitted}"))
            continue
        k, raw, weights = fitted
        nodes = ", ".join(chain.nodes)
        header = (f"# Imported by `fusetune import {loaded.source}`: fx nodes {nodes}.\n"
                  f"# Ends: {chain.end}.\n")
        raw, note = _in_model_dtype(raw, _chain_dtype(loaded, chain), path)
        header += note
        derived = chain_derived(chain, k)
        bound = [p for p in raw.get("parameters", {}) if p not in derived]
        if bound:
            header += ("# Parameters: init randn here; the trained values come from the model's "
                       + ", ".join(f"{weights[p]} ({p}{_shape_note(gm, weights[p], raw, p)})" for p in bound) + ".\n")
        computed = [f"{p} = {d.describe()}" for p, d in derived.items() if p in chain.producer_derived]
        operands = [f"{p} = {d.describe()}" for p, d in derived.items() if p not in chain.producer_derived]
        if computed:
            header += ("# Computed weights: at each call the fused chain computes the convolution's from the model's "
                       "tensors as the model does: " + "; ".join(computed) + ".\n")
        if operands:
            header += ("# Derived parameters: init randn here; at each call the fused chain computes them from the "
                       "model's tensors as the forward does: " + "; ".join(operands) + ".\n")
        inputs = chain_inputs(chain, k)
        if inputs:
            header += ("# Inputs: the model's tensors the chain reads beside the convolution's input, as forward "
                       "arguments after x: " + ", ".join(f"{n} (fx node {node})" for n, node in inputs.items()) + ".\n")
        texts[path] = _dump(raw, header)
        written.append(Written(chain, path, name, k, weights, {p: weights[p] for p in bound}, raw["epilogue"],
                               {p: _shape_note(gm, weights[p], raw, p).lstrip(", ") for p in bound}, inputs, derived))
    pytorch = _pytorch_reasons(gm, written, refused)
    map_path = out_dir / f"{loaded.stem}.map.json"
    edited, stale = _check_overwrites(map_path, texts, force)
    for path, text in texts.items():
        write_config(path, text)
    _write_map(map_path, loaded, written, pytorch, {p.name: _digest(t.encode("utf-8")) for p, t in texts.items()})
    lines = _map_lines(loaded, gm, written, pytorch, map_path)
    lines += [f"overwrote {path} (--force): it was edited since an import wrote it" for path in edited]
    lines += [f"left {path} as it is: an earlier import wrote it, this one finds no such chain (delete it if the "
              "model no longer has it)" for path in stale]
    return ImportResult(loaded, gm, written, pytorch, map_path, lines)


class OverwriteError(FusetuneError):
    """An import would overwrite configs edited since an earlier import wrote them (or that no import recorded):
    exit 2, nothing written."""

    exit_code = 2


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _recorded(map_path: Path) -> dict[str, str]:
    """The configs the map of an earlier import names, by file name: the sha256 of the text it wrote ("" where
    the map predates the record); empty where there is no map or it is not one."""
    try:
        doc = json.loads(map_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    chains = doc.get("chains") if isinstance(doc, dict) else None
    return {Path(str(c["config"])).name: str(c.get("sha256", "")) for c in chains or []
            if isinstance(c, dict) and "config" in c}


def _check_overwrites(map_path: Path, texts: Mapping[Path, str], force: bool) -> tuple[list[Path], list[Path]]:
    """Which configs this import may overwrite: one that does not exist, holds what it would write, or holds what
    the earlier import wrote (its sha256 in the map: a re-import after the model changed, or the importer). Any
    other (a user's edit of a config, or a file no import recorded) is refused, naming them all, unless ``force``
    (then they are returned, to be said). Also returned: the configs the earlier map names that this import does
    not write, left as they are (a chain the model no longer has)."""
    recorded = _recorded(map_path)
    edited: list[Path] = []
    for path, text in texts.items():
        try:
            current = path.read_bytes()
        except OSError:  # none yet (or unreadable: writing it says why)
            continue
        if current != text.encode("utf-8") and recorded.get(path.name) != _digest(current):
            edited.append(path)
    if edited and not force:
        raise OverwriteError(
            f"{map_path.parent}: {len(edited)} config(s) differ from what an earlier `fusetune import` wrote (edited "
            f"since, or not written by an import): {', '.join(str(p) for p in edited)}; nothing was written. Pass "
            "--force to overwrite them, or import into another folder (-o)")
    names = {p.name for p in texts}
    stale = [map_path.parent / name for name in recorded if name not in names and (map_path.parent / name).exists()]
    return edited, stale


def _pytorch_reasons(gm: torch.fx.GraphModule, written: list[Written], refused: list[NoChain]) -> dict[str, str]:
    covered = {n for w in written for n in w.chain.nodes}
    enders: dict[str, str] = {}
    for i, w in enumerate(written):
        if w.chain.end_node:
            why = f"ends chain{i} ({w.chain.end})"
            enders[w.chain.end_node] = f"{enders[w.chain.end_node]}; {why}" if w.chain.end_node in enders else why
    convs = {r.node: r.reason for r in refused}
    outputs = {w.chain.output_node: i for i, w in enumerate(written)}  # a value read past its chain's end
    out: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.name in covered:
            continue
        if node.op == "placeholder":
            out[node.name] = "the model's input"
        elif node.op == "output":
            out[node.name] = "the model's output"
        elif node.op == "get_attr":
            out[node.name] = "a parameter or constant of the model"
        elif node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none":
            out[node.name] = ("torch.fx's check that the argument is None, as the example leaves it (optimize runs the "
                              "model's own forward for a call that gives it)")
        elif node.op == "call_module" and node.target == "_guards_fn":
            out[node.name] = ("torch.export's check that the inputs have the example's shapes (its trace is "
                              "specialized to them)")
        elif node.name in convs:
            out[node.name] = convs[node.name]
        elif node.name in enders:
            out[node.name] = enders[node.name]
        elif _is_shape_read(node):
            out[node.name] = (f"{_describe(gm, node)} reads a tensor's {_read_what(node)}, not its values: free in "
                              "PyTorch")
        elif _is_size_arithmetic(node):
            out[node.name] = f"{_describe(gm, node)} computes on sizes read off tensors, not on values: free in PyTorch"
        elif _pads_a_convolution(gm, node):
            out[node.name] = f"{_describe(gm, node)} {_PAD_NOT_TAKEN}"
        elif lookup(gm, node) is None and not _is_identity(gm, node):
            out[node.name] = f"{_describe(gm, node)} is not in the vocabulary"
        elif any(n.name in outputs for n in node.all_input_nodes):
            i = next(outputs[n.name] for n in node.all_input_nodes if n.name in outputs)
            out[node.name] = (f"{_describe(gm, node)} is in the vocabulary, but it reads chain{i}'s value, where "
                              f"that chain ends ({written[i].chain.end})")
        elif any(n.name in convs for n in node.all_input_nodes):
            conv = next(n.name for n in node.all_input_nodes if n.name in convs)
            out[node.name] = (f"{_describe(gm, node)} is in the vocabulary, but it reads the output of {conv}, a "
                              f"convolution without a chain (see {conv})")
        else:
            out[node.name] = f"{_describe(gm, node)} is in the vocabulary, but its input is not a chain's last value"
    return out


def _write_map(path: Path, loaded: LoadedModel, written: list[Written], pytorch: Mapping[str, str],
               digests: Mapping[str, str]) -> None:
    """The map: each chain's config, nodes, bindings, and the sha256 of the config's text as written (an import
    into the folder again overwrites a config that still holds it, and refuses one edited since)."""
    from fusetune.cache import atomic_write_text

    doc = {
        "model": loaded.source,
        "chains": [{"config": str(w.config), "sha256": digests.get(w.config.name, ""), "name": w.name,
                    "producer": w.chain.producer_node,
                    "nodes": w.chain.nodes, "output": w.chain.output_node, "input_shape": list(w.chain.input_shape),
                    "epilogue": w.epilogue, "ends": w.chain.end, "ends_before": w.chain.end_node,
                    "weights": w.weights, "inputs": w.inputs,
                    "parameters": {p: {"from": t, "note": "trained values come from the model (init randn in "
                                                          "the config)" + (f"; {w.notes[p]}" if w.notes.get(p) else "")}
                                   for p, t in w.parameters.items()},
                    "derived": {p: {"computes": d.describe(), **d.to_json()} for p, d in w.derived.items()}}
                   for w in written],
        "pytorch": dict(pytorch),
    }
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def _map_lines(loaded: LoadedModel, gm: torch.fx.GraphModule, written: list[Written], pytorch: Mapping[str, str],
               map_path: Path) -> list[str]:
    owner = {n: i for i, w in enumerate(written) for n in w.chain.nodes}
    lines = [f"{loaded.source}: {len(written)} chain(s), map in {map_path}" if written else
             f"{loaded.source}: no chain found (no convolution followed by an op of the vocabulary); map in {map_path}"]
    for i, w in enumerate(written):
        ops = " -> ".join([w.chain.producer["op"]] + [e["op"] for e in w.epilogue])
        reads = "".join(f"; reads {node} as input {name}" for name, node in w.inputs.items())
        lines.append(f"chain{i} -> {w.config}: {ops}{reads}; ends: {w.chain.end}")
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.name in owner:
            i = owner[node.name]
            lines.append(f"  {node.name}: chain{i} ({written[i].config.name})")
        else:
            lines.append(f"  {node.name}: PyTorch: {pytorch[node.name]}")
    return lines
