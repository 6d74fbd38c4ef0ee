"""Loading the model ``fusetune import`` is given: a KernelBench-style file (class Model, get_inputs, get_init_inputs:
CONVENTION) or a ``package.module:factory``, built on the CPU in float32 for tracing, with the dtypes it keeps recorded
(LoadedModel), so that each chain's config takes the dtype its convolution computes in. Bad input is a ConfigError (exit
2) naming the file and what was expected.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import io
import itertools
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from fusetune.errors import ConfigError
from fusetune.ops import Shape
from fusetune.paths import decode_text, read_bytes


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


def _float32(model: nn.Module) -> nn.Module:
    return model.to(device="cpu").float()


def _float32_inputs(inputs: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(x.detach().to("cpu", torch.float32) if isinstance(x, torch.Tensor) and x.is_floating_point()
                 else x for x in inputs)
