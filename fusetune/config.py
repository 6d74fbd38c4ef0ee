"""YAML config -> validated ``ProblemSpec``.

Validation is complete on load: every later stage may assume a spec is well formed, and
every error names the file, the key path and what was expected.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Mapping

import yaml

from fusetune import broadcast
from fusetune.dtypes import DEFAULT_DTYPE, alias_of
from fusetune.dtypes import DTYPES as ELEMENT_TYPES
from fusetune.errors import ConfigError, count, did_you_mean, suggestion
from fusetune.ops import ALIASES as OP_ALIASES
from fusetune.ops import REGISTRY, BatchNorm, LayerNorm, Norm, Op, OpContext, ParamDecl, Shape
from fusetune.ops.base import is_int, number_text_hint
from fusetune.paths import decode_text, read_bytes
from fusetune.ops.channel import ChannelLayerNorm
from fusetune.ops.gate import Glu
from fusetune.ops.reduce import Softmax
from fusetune.ops.shuffle import PixelShuffle
from fusetune.producers import Producer

#: The element types a config may name; inputs, weights and outputs are in it, the kernels' arithmetic
#: in float (statistics in float and double, as at float32).
DTYPES = tuple(ELEMENT_TYPES)
#: float32 only: how the convolution may multiply. ``tf32``: as eager PyTorch by default (torch lets
#: cuDNN convolutions use TF32, torch.backends.cudnn.allow_tf32), so the tensor-core worlds may too;
#: ``ieee``: float32 products throughout (cuDNN with TF32 off; the TF32 tensor-core worlds leave the search).
PRECISIONS = ("tf32", "ieee")
DEFAULT_PRECISION = "tf32"
TOLERANCE_KEYS = ("atol", "rtol")
PARAM_INITS = ("ones", "zeros", "randn")
#: A parameter's shape: one value per channel, (C, 1, ..., 1); or one value (0-dim), which applies anywhere.
PARAM_SHAPES = ("per_channel", "scalar")
TOP_KEYS = ("name", "dtype", "precision", "tolerance", "producer", "parameters", "inputs", "epilogue", "shapes",
            "outputs", "search")
#: The keys every config gives (the others have defaults): named where a file holds none of them.
REQUIRED_KEYS = ("name", "producer", "epilogue", "shapes")
#: Names an extra input may not take: the generated forwards' own names (the chain's tensor ``x``, the
#: convolution's output ``y``, ``self``) and the modules model.py imports.
INPUT_RESERVED = ("x", "y", "self", "torch", "nn", "F", "os", "json", "producer")
#: What the model may return (``outputs:``), in the order of its returned tuple: the chain's value, and the
#: convolution's own output where the user's model also reads it outside the chain (a VAE block's
#: ``h = conv_in(x); return h + f(silu(group_norm(h)))``). One output (the chain's) returns a bare tensor.
OUTPUTS = ("chain", "producer")
DEFAULT_OUTPUTS = ("chain",)
SEARCH_KEYS = ("trials", "timeout", "seed", "exclude_worlds", "timing")
#: How a candidate's forward is timed: issued op by op from the host (``launch``), or replayed from a CUDA
#: graph (``graph``: what a forward costs inside one, as optimize replays a model and torch.compile's default
#: mode does; the host's cost of issuing each kernel is gone, so a chain of small kernels times as its GPU work).
TIMINGS = ("launch", "graph")
#: Largest element count any one tensor of a tuned shape may have; kernels index with 64-bit
#: offsets, but cuDNN and PyTorch refuse or misbehave past this on some paths.
MAX_ELEMENTS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    trials: int = 32
    timeout: float = 600.0  # seconds per shape
    seed: int = 0
    #: Worlds (producer.impl) the search leaves out, e.g. inductor to see what fusetune's own kernels
    #: reach against torch.compile. Part of the cache key where any: it changes the answer.
    exclude_worlds: tuple[str, ...] = ()
    #: One of TIMINGS. Part of the cache key where not ``launch``: a winner in a graph may lose outside one.
    timing: str = "launch"


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """A user's acceptance test: a winner's output must be ``torch.allclose(out, eager, atol, rtol)``
    against eager PyTorch's own at the config's dtype (and precision), beside the float64 check."""

    atol: float
    rtol: float


@dataclasses.dataclass(frozen=True)
class ProblemSpec:
    """A validated config: a producer, an epilogue chain and the shapes to tune."""

    name: str
    path: str
    dtype: str
    producer: Producer
    parameters: tuple[ParamDecl, ...]
    epilogue: tuple[Op, ...]
    shapes: tuple[Shape, ...]
    search: SearchSettings
    precision: str | None = DEFAULT_PRECISION  # None where the dtype is not float32
    tolerance: Tolerance | None = None
    #: The model's extra input tensors after x (``inputs:``), in forward order: each read at the element by
    #: binary ops (``by: NAME``), of the chain's shape where they read it.
    inputs: tuple[str, ...] = ()
    #: The inputs that broadcast (``inputs: [{name: temb, shape: per_sample_channel}]``, fusetune/broadcast.py):
    #: (name, kind) pairs; an input not here has the chain's shape.
    input_kinds: tuple[tuple[str, str], ...] = ()
    #: What the model returns (``outputs:``, OUTPUTS), in order; a tuple of them where more than one.
    outputs: tuple[str, ...] = DEFAULT_OUTPUTS

    @property
    def returns_producer(self) -> bool:
        """Whether the model also returns the convolution's output: only the worlds that write it may run it
        (World.materializes_producer)."""
        return "producer" in self.outputs

    @property
    def scalar_parameters(self) -> frozenset[str]:
        """The names of the single-value parameters: the same value at every channel (a pixel shuffle's move,
        a view's channels and a region's operands leave them as they are)."""
        return frozenset(p.name for p in self.parameters if p.scalar)

    def canonical(self) -> dict[str, Any]:
        """The problem's canonical form: everything that changes its result or what is accepted as
        one (precision, tolerance), nothing else."""
        out = {**self.numerics(), "producer": self.producer.canonical(),
               "parameters": [p.canonical() for p in self.parameters],
               "epilogue": [op.canonical() for op in self.epilogue]}
        if self.inputs:  # left out where none: the keys of every chain without them stay as they were
            out["inputs"] = list(self.inputs)
        if self.input_kinds:  # likewise: full-shape inputs' keys stay as they were
            out["input_kinds"] = dict(self.input_kinds)
        if self.outputs != DEFAULT_OUTPUTS:  # likewise: one output's keys stay as they were
            out["outputs"] = list(self.outputs)
        return out

    def numerics(self) -> dict[str, Any]:
        """The element type, float32's precision and the user's tolerance: what ``fusetune plan`` shows
        and the export records beside the winners."""
        return {"dtype": self.dtype, "precision": self.precision,
                "tolerance": dataclasses.asdict(self.tolerance) if self.tolerance else None}

    def describe_numerics(self) -> str:
        """One line, as ``fusetune plan`` prints it: the dtype, float32's precision, the tolerance if any."""
        precision = {"tf32": ", precision tf32 (TF32 products allowed, as eager PyTorch's default)",
                     "ieee": ", precision ieee (float32 products only)"}.get(self.precision or "", "")
        tolerance = (f", tolerance allclose(atol={self.tolerance.atol:g}, rtol={self.tolerance.rtol:g}) against eager "
                     f"{self.dtype}" if self.tolerance else "")
        return f"dtype {self.dtype}{precision}{tolerance}"

    def digest(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def shapes_through(self, shape: Shape) -> list[Shape]:
        """The tensor shape after the producer and after each op of the chain."""
        shapes = [self.producer.out_shape(shape)]
        for op in self.epilogue:
            shapes.append(op.out_shape(shapes[-1]))
        return shapes

    def output_shape(self, shape: Shape) -> Shape:
        return self.shapes_through(shape)[-1]

    def output_shapes(self, shape: Shape) -> list[Shape]:
        """The shape of each tensor the model returns (``outputs``, in order) at an input shape."""
        through = self.shapes_through(shape)
        return [through[-1] if name == "chain" else through[0] for name in self.outputs]

    def channels_at(self, i: int) -> int:
        """The channels of epilogue op ``i``'s input: the convolution's, or half of them after a glu over the
        channels (fusetune/ops/gate.py). A per-channel norm's module and parameters are sized by it. A tensor of
        rank 1 (a whole-sample reduction's [N]) has no channel dim: one value a sample, so 1 (no op that reads
        channels stands there: parsing refused it)."""
        shape = self.shapes_through(self.shapes[0])[i]
        return shape[1] if len(shape) > 1 else 1

    def param_channels(self, name: str) -> int:
        """The channels where per-channel parameter ``name`` is read (config validation made every reader of one
        parameter see the same); the convolution's where no op reads it."""
        readers = [i for i, op in enumerate(self.epilogue) if name in getattr(op, "params", lambda: ())()]
        return self.channels_at(readers[0]) if readers else self.producer.out_channels

    def input_shapes(self, shape: Shape) -> list[Shape]:
        """The shape of each extra input (``inputs``, in order) at an input shape: the chain's where an op
        reads it (config validation made every reader of one input see the same)."""
        through = self.shapes_through(shape)
        readers = {op.reads_input(): i for i, op in reversed(list(enumerate(self.epilogue))) if op.reads_input()}
        kinds = dict(self.input_kinds)
        return [broadcast.KINDS[kinds[name]].shape(through[readers[name]]) if name in kinds else through[readers[name]]
                for name in self.inputs]


class _DuplicateKey(Exception):
    def __init__(self, key_path: str, key: Any, line: int, first_line: int) -> None:
        super().__init__(key_path)
        self.key_path, self.key, self.line, self.first_line = key_path, key, line, first_line


class _StrictLoader(yaml.SafeLoader):
    """yaml's SafeLoader, except that a key given twice in one mapping (at any depth) is an error:
    YAML loaders otherwise keep the last value, so a second ``shapes:`` silently drops the first."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self._paths: dict[int, str] = {}
        self._index(node, "")
        return self.construct_document(node)

    def _index(self, node: yaml.Node, path: str) -> None:
        """Record each collection node's key path (``epilogue[2]``, ``producer``) for error messages."""
        if id(node) in self._paths:  # an alias: indexed where it was first defined
            return
        self._paths[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                self._index(value_node, f"{path}.{name}" if path else str(name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._index(item, f"{path}[{i}]")

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *defaults' may be overridden: not a duplicate
                continue
            try:
                key = self.construct_object(key_node, deep=True)
                hash(key)
            except Exception:  # an unhashable key: SafeLoader's own error says so
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                parent = getattr(self, "_paths", {}).get(id(node), "")
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key)
                raise _DuplicateKey(f"{parent}.{name}" if parent else str(name), key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path) -> ProblemSpec:
    """Read and validate one YAML config. Raises ``ConfigError`` naming file and key."""
    path = str(path)
    data = read_bytes(Path(path), path)
    text = decode_text(data, path, "utf-8-sig", "; save the file as UTF-8")  # a leading byte-order mark is allowed
    try:
        raw = yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as dup:
        raise ConfigError(path, dup.key_path, f"duplicate key {dup.key!r} at line {dup.line} (first given at line "
                                              f"{dup.first_line}); YAML would keep only the last one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(path, "", f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return parse_config(raw, path)


def parse_config(raw: Any, path: str = "<config>") -> ProblemSpec:
    """Validate an already-parsed YAML document."""
    if raw is None:  # yaml's reading of a file with no document (empty, or comments only) or a bare null
        raise ConfigError(path, "", f"the file is empty: it holds no YAML document (only comments, whitespace or "
                                    f"null); a config is a mapping that gives at least {', '.join(REQUIRED_KEYS)} "
                                    "(see README.md)")
    _check_keys(raw, TOP_KEYS, path, "", f"a mapping of keys ({', '.join(TOP_KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not name or not all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in name):
        raise ConfigError(path, "name", f"expected a non-empty name of letters, digits, '_' and '-', got {name!r}")
    dtype = raw.get("dtype", DEFAULT_DTYPE)
    if dtype not in DTYPES:
        hint = suggestion(alias_of(dtype) if isinstance(dtype, str) else None)
        raise ConfigError(path, "dtype", f"expected one of {', '.join(DTYPES)}, got {dtype!r}{hint}")
    precision = _parse_precision(raw, dtype, path)
    tolerance = _parse_tolerance(raw.get("tolerance"), path)
    if "producer" not in raw:
        raise ConfigError(path, "producer", "missing; expected the convolution that feeds the chain")
    producer = Producer.parse(raw["producer"], path)
    parameters = _parse_parameters(raw.get("parameters", {}), path)
    inputs, input_kinds = _parse_inputs(raw.get("inputs", []), parameters, path)
    shapes = _parse_shapes(raw.get("shapes"), producer, path)
    epilogue = _parse_epilogue(raw.get("epilogue"), producer, parameters, shapes, path, inputs, dtype)
    search = _parse_search(raw.get("search", {}), path)
    outputs = _parse_outputs(raw.get("outputs", list(DEFAULT_OUTPUTS)), path)
    return ProblemSpec(name=name, path=path, dtype=dtype, producer=producer,
                       parameters=tuple(parameters.values()), epilogue=epilogue,
                       shapes=shapes, search=search, precision=precision, tolerance=tolerance, inputs=inputs,
                       input_kinds=input_kinds, outputs=outputs)


def _parse_outputs(raw: Any, path: str) -> tuple[str, ...]:
    """What the model returns, in order (OUTPUTS): the chain's value always, the convolution's output at most once
    beside it."""
    expected = ("a list of what the model returns, in order: chain, and producer where the convolution's output is "
                "returned too (e.g. outputs: [chain, producer])")
    if isinstance(raw, str) or not isinstance(raw, list) or not raw:
        raise ConfigError(path, "outputs", f"expected {expected}, got {raw!r}")
    for i, entry in enumerate(raw):
        if entry not in OUTPUTS:
            hint = did_you_mean(entry, OUTPUTS) if isinstance(entry, str) else ""
            raise ConfigError(path, f"outputs[{i}]", f"unknown output {entry!r}{hint} (expected one of: "
                                                     f"{', '.join(OUTPUTS)})")
        if entry in raw[:i]:
            raise ConfigError(path, f"outputs[{i}]", f"{entry!r} is listed twice: each output is returned once")
    if "chain" not in raw:
        raise ConfigError(path, "outputs", f"expected the chain's value among the outputs, got {raw!r} (e.g. "
                                           "outputs: [chain, producer])")
    return tuple(raw)


def _check_keys(raw: Any, known: tuple[str, ...], path: str, where: str, expected: str) -> None:
    """A section (``where``; "" for the whole file) must be a mapping whose keys are all ``known``: else
    the error names the section, or the first unknown key with a close match and the keys it takes."""
    if not isinstance(raw, Mapping):
        got = type(raw).__name__ if not where else repr(raw)  # the whole file's text would not fit a line
        raise ConfigError(path, where, f"expected {expected}, got {got}")
    for key in raw:
        if key not in known:
            raise ConfigError(path, f"{where}.{key}" if where else str(key),
                              f"unknown key{did_you_mean(key, known)} (expected one of: {', '.join(known)})")


def _parse_precision(raw: Mapping[str, Any], dtype: str, path: str) -> str | None:
    """float32's precision (default: eager PyTorch's own, TF32 allowed); none for the half types,
    whose products the tensor cores and cuDNN take at their own precision anyway."""
    if dtype != DEFAULT_DTYPE:
        if "precision" in raw:
            raise ConfigError(path, "precision", f"applies to dtype {DEFAULT_DTYPE} only (tf32 or ieee); remove it for "
                                                 f"dtype {dtype}")
        return None
    precision = raw.get("precision", DEFAULT_PRECISION)
    if precision not in PRECISIONS:
        raise ConfigError(path, "precision", f"expected one of {', '.join(PRECISIONS)}, got {precision!r}"
                                             f"{did_you_mean(precision, PRECISIONS)}")
    return precision


def _parse_tolerance(raw: Any, path: str) -> Tolerance | None:
    if raw is None:
        return None
    _check_keys(raw, TOLERANCE_KEYS, path, "tolerance", "a mapping like {atol: 1.0e-4, rtol: 1.0e-4}")
    values = {}
    for key in TOLERANCE_KEYS:
        if key not in raw:
            raise ConfigError(path, f"tolerance.{key}", "missing; expected a non-negative number (torch.allclose's "
                                                        f"{key})")
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            hint = number_text_hint(value) if isinstance(value, str) else ""
            raise ConfigError(path, f"tolerance.{key}", f"expected a non-negative finite number, got {value!r}{hint}")
        values[key] = float(value)
    return Tolerance(**values)


def _parse_parameters(raw: Any, path: str) -> dict[str, ParamDecl]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(path, "parameters", f"expected a mapping of name -> {{init: ...}}, got {raw!r}")
    out: dict[str, ParamDecl] = {}
    for name, decl in raw.items():
        key = f"parameters.{name}"
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ConfigError(path, key, "expected a Python identifier not starting with '_' as the parameter name")
        if _reserved(name):
            raise ConfigError(path, key, f"'{name}' is taken by the generated model (an nn.Module attribute, "
                                         "the producer or an op's submodule); choose another name")
        if not isinstance(decl, Mapping):
            raise ConfigError(path, key, f"expected a mapping like {{shape: per_channel, init: ones}}, got {decl!r}")
        for k in decl:
            if k not in ("shape", "init"):
                raise ConfigError(path, f"{key}.{k}", "unknown key; expected 'shape' or 'init'")
        shape = decl.get("shape", "per_channel")
        if isinstance(shape, list):
            raise ConfigError(path, f"{key}.shape", f"a parameter's shape is written by its kind, not its sizes: "
                                                    f"per_channel (one value per channel of the value it meets, as a "
                                                    f"(C, 1, 1) tensor broadcasts) or scalar (a single value); got "
                                                    f"{shape!r}")
        if shape not in PARAM_SHAPES:
            raise ConfigError(path, f"{key}.shape", f"expected one of {', '.join(PARAM_SHAPES)} (one value per "
                                                    f"channel, or a single value), got {shape!r}")
        init = decl.get("init", "ones")
        if init not in PARAM_INITS:
            raise ConfigError(path, f"{key}.init", f"expected one of {', '.join(PARAM_INITS)}, got {init!r}")
        out[name] = ParamDecl(name=name, init=init, shape=shape)
    return out


def _parse_inputs(raw: Any, parameters: Mapping[str, ParamDecl],
                  path: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The model's extra input tensors: forward arguments after x, by name, in order; and the kinds of those
    that broadcast (an entry ``{name: temb, shape: per_sample_channel}``; a bare name has the chain's shape)."""
    import keyword

    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        raise ConfigError(path, "inputs", f"expected a list of names of the model's extra input tensors (its forward "
                                          f"arguments after x), e.g. [identity], got {raw!r}")
    names: list[str] = []
    kinds: list[tuple[str, str]] = []
    for i, entry in enumerate(raw):
        key = f"inputs[{i}]"
        name = entry
        if isinstance(entry, Mapping):
            for k in entry:
                if k not in ("name", "shape"):
                    raise ConfigError(path, f"{key}.{k}", "unknown key; expected 'name' or 'shape'")
            if "name" not in entry:
                raise ConfigError(path, f"{key}.name", "missing; expected the input's name")
            name, shape = entry["name"], entry.get("shape", broadcast.FULL)
            if shape not in broadcast.SHAPES:
                raise ConfigError(path, f"{key}.shape", f"expected one of {', '.join(broadcast.SHAPES)} (the chain's "
                                                        f"shape where it is read, or "
                                                        f"{'; '.join(k.what for k in broadcast.KINDS.values())}), "
                                                        f"got {shape!r}")
            if shape != broadcast.FULL:
                kinds.append((name, shape))
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or keyword.iskeyword(name):
            raise ConfigError(path, key, f"expected a Python identifier not starting with '_' as the input's name, "
                                         f"got {name!r} (an entry is a name or {{name: NAME, shape: KIND}})")
        if name in INPUT_RESERVED:
            raise ConfigError(path, key, f"'{name}' is taken by the generated forward ({', '.join(INPUT_RESERVED)}); "
                                         "choose another name")
        if name in parameters:
            raise ConfigError(path, key, f"'{name}' is also a declared parameter; `by: {name}` would be ambiguous")
        if name in names:
            raise ConfigError(path, key, f"input '{name}' is listed twice")
        names.append(name)
    return tuple(names), tuple(kinds)


#: Attributes the generated Model/ModelNew define beside nn.Module's own.
_MODEL_ATTRIBUTES = {"producer", "variant", "fill_value", "produce", "epilogue", "share_from", "set_variant"}


def _reserved(name: str) -> bool:
    """A parameter becomes an attribute of the generated model: it must not replace one."""
    import re

    if name in _MODEL_ATTRIBUTES or name in module_attributes():
        return True
    return re.fullmatch(rf"({'|'.join(REGISTRY)})_\d+", name) is not None


#: What ``dir`` of a class holds beside its body's names and object's (read by ``module_attributes``).
_CLASS_ATTRIBUTES = ("__annotations__", "__dict__", "__module__", "__weakref__")


@functools.cache
def module_attributes() -> frozenset[str]:
    """The names ``hasattr(torch.nn.Module, name)`` holds for: torch's own answer where torch is imported, else
    read from its class's source (torch/nn/modules/module.py) without importing torch: reading a config (a
    deploy of stored winners) then needs no torch, seconds with its CUDA libraries."""
    import ast
    import importlib.util
    import sys

    found = importlib.util.find_spec("torch") if "torch" not in sys.modules else None
    try:
        tree = ast.parse((Path(list(found.submodule_search_locations)[0]) / "nn" / "modules" / "module.py")
                         .read_text()) if found and found.submodule_search_locations else None
    except (OSError, SyntaxError):
        tree = None
    body = next((n.body for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef) and n.name == "Module"),
                None)
    if body is None:
        import torch

        return frozenset(dir(torch.nn.Module))
    names = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.target.id for n in body
              if isinstance(n, ast.AnnAssign) and n.value is not None and isinstance(n.target, ast.Name)}
    return frozenset(names | set(dir(object)) | set(_CLASS_ATTRIBUTES))


def _parse_shapes(raw: Any, producer: Producer, path: str) -> tuple[Shape, ...]:
    rank = 2 + producer.spatial_dims
    if not isinstance(raw, list) or not raw:
        raise ConfigError(path, "shapes", f"expected a non-empty list of input shapes {producer.shape_names}")
    if all(is_int(s) for s in raw):  # one shape given bare: the list of shapes is the shape itself
        raise ConfigError(path, "shapes", f"expected a list of shapes, each a list of {rank} integers "
                                          f"{producer.shape_names}, got the flat list {raw!r}: wrap each shape in "
                                          f"its own brackets, e.g. shapes: [{raw!r}] for one shape")
    shapes: list[Shape] = []
    for i, shape in enumerate(raw):
        key = f"shapes[{i}]"
        if (not isinstance(shape, list) or len(shape) != rank
                or not all(is_int(s) for s in shape)):
            raise ConfigError(path, key, f"expected a list of {rank} integers for {producer.kind} "
                                         f"{producer.shape_names}, got {shape!r}")
        if any(s < 1 for s in shape):
            raise ConfigError(path, key, f"expected positive sizes, got {shape}")
        if shape[1] != producer.in_channels:
            raise ConfigError(path, key, f"channel size {shape[1]} does not match producer.in_channels {producer.in_channels}")
        refusal = producer.input_refusal(tuple(shape))
        if refusal is not None:
            raise ConfigError(path, key, f"input {shape}: {refusal}")
        out = producer.out_shape(tuple(shape))
        if any(s < 1 for s in out[2:]):
            raise ConfigError(path, key, f"input {shape} is too small for the producer: its output would be {list(out)}")
        for tensor, size in (("input", math.prod(shape)), ("producer output", math.prod(out))):
            if size > MAX_ELEMENTS:
                raise ConfigError(path, key, f"the {tensor} would have {size:,} elements, more than the "
                                             f"{MAX_ELEMENTS:,} fusetune supports per tensor")
        if tuple(shape) in shapes:
            raise ConfigError(path, key, f"shape {shape} is listed twice")
        shapes.append(tuple(shape))
    return tuple(shapes)


def _parse_epilogue(raw: Any, producer: Producer, parameters: Mapping[str, ParamDecl],
                    shapes: tuple[Shape, ...], path: str, inputs: tuple[str, ...] = (),
                    dtype: str = DEFAULT_DTYPE) -> tuple[Op, ...]:
    """Every op PyTorch would run on its input is valid: whether the kernels take it is the planner's
    question (fusetune/regions.py), not the config's. What is checked here is what PyTorch itself
    would refuse, or what would silently mean something else (a per-channel parameter or a norm
    after the channel structure is gone)."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(path, "epilogue", "expected a non-empty list of ops, e.g. [{op: relu}]")
    ops: list[Op] = []
    current = [producer.out_shape(s) for s in shapes]
    read_at: dict[str, tuple[str, list[Shape]]] = {}  # input -> (its first reader's key, the shapes there)
    channels = producer.out_channels  # the chain's channels: the convolution's, or half after a glu over dim 1
    param_at: dict[str, tuple[str, int]] = {}  # per-channel parameter -> (its first reader's key, channels there)
    model_dtype, cast_at = dtype, None  # the model's dtype; the first softmax that widens it, if any
    for i, entry in enumerate(raw):
        key = f"epilogue[{i}]"
        if not isinstance(entry, Mapping) or "op" not in entry:
            raise ConfigError(path, key, f"expected a mapping with an 'op' key, got {entry!r}")
        kind = entry["op"]
        if not isinstance(kind, str) or kind not in REGISTRY:
            hint = suggestion(OP_ALIASES[kind]) if isinstance(kind, str) and kind in OP_ALIASES else \
                did_you_mean(kind, REGISTRY)
            raise ConfigError(path, f"{key}.op", f"unknown op {kind!r}{hint} (expected one of: "
                                                 f"{', '.join(sorted(REGISTRY))})")
        structured = _structured(current[0], producer, channels)
        if _needs_spatial(REGISTRY[kind]) and len(current[0]) != 2 + producer.spatial_dims:
            raise ConfigError(path, f"{key}.op", f"'{kind}' needs an (N, C, spatial) input of rank "
                                                 f"{2 + producer.spatial_dims}, but {structured}")
        if _needs_channels(REGISTRY[kind]) and structured is not None:
            raise ConfigError(path, f"{key}.op", f"'{kind}' needs the (N, {channels}, spatial) "
                                                 f"input the convolution makes, but {structured}")
        if (isinstance(entry.get("by"), str) and entry["by"] in parameters and structured is not None
                and not parameters[entry["by"]].scalar):
            hint = _per_channel_hint(current[0], producer, channels)
            raise ConfigError(path, f"{key}.by", f"a per-channel parameter of shape ({channels}, 1, ...) "
                                                 f"cannot apply here: {structured}{hint}")
        if entry.get("by") == "producer" and current != [producer.out_shape(s) for s in shapes]:
            raise ConfigError(path, f"{key}.by", f"the convolution's output {list(producer.out_shape(shapes[0]))} "
                                                 f"cannot apply to the input {list(current[0])} here: its shape changed "
                                                 "(PyTorch would broadcast one against the other or fail)")
        ctx = OpContext(path=path, key=key, in_shape=current[0], spatial_dims=producer.spatial_dims,
                        parameters=parameters, inputs=inputs, dtype=dtype)
        op = REGISTRY[kind].parse(entry, ctx)
        held = _tensors_held(op)
        if cast_at is not None and held is not None:
            cast_key, cast_to = cast_at
            raise ConfigError(path, f"{key}.op", f"'{kind}' applies {held} (of the model's dtype, {model_dtype}) to "
                                                 f"the values the softmax at {cast_key} casts to {cast_to}: PyTorch "
                                                 "refuses a norm's input and tensors of different dtypes; put it "
                                                 "before that softmax, or leave the softmax's dtype out (the input's "
                                                 "own is no cast)")
        if isinstance(op, Softmax) and op.widens and cast_at is None:
            cast_at = (key, op.dtype)
        dtype = op.out_dtype(dtype)  # a softmax's dtype: what the ops after it see
        for param in getattr(op, "params", lambda: ())():
            decl = parameters.get(param)
            first = param_at.setdefault(param, (key, channels))
            if decl is not None and not decl.scalar and first[1] != channels:
                raise ConfigError(path, key, f"per-channel parameter '{param}' is read here at "
                                             f"{count(channels, 'channel')}, "
                                             f"but {first[0]} reads it at {first[1]}: a parameter has one shape")
        name = op.reads_input()
        if name is not None:
            first, seen = read_at.setdefault(name, (key, current))
            if seen != current:
                raise ConfigError(path, f"{key}.by", f"input '{name}' is read here at shape {list(current[0])}, "
                                                     f"but {first} reads it at {list(seen[0])}: an input has one "
                                                     "shape (the chain's where it is read)")
        for j, shape in enumerate(current):
            def error(sub: str, message: str, j: int = j) -> None:
                raise ctx.error(sub, f"{message} (for shapes[{j}])")
            op.check_shape(shape, error)
        current = [op.out_shape(s) for s in current]
        if structured is None and ((isinstance(op, Glu) and op.halves_channels()) or isinstance(op, PixelShuffle)):
            channels = current[0][1]  # the chain goes on at half (a glu) or 1 / r^2 (a pixel shuffle) of the channels
        ranks = {len(s) for s in current}
        if len(ranks) > 1:
            raise ConfigError(path, key, f"the output's rank differs between the shapes ({sorted(ranks)}): later dims "
                                         "would mean different things; give squeeze its dim")
        ops.append(op)
    unread = [name for name in inputs if name not in read_at]
    if unread:
        raise ConfigError(path, f"inputs[{inputs.index(unread[0])}]", f"input '{unread[0]}' is declared but no op "
                                                                     f"reads it (expected an op with by: {unread[0]})")
    return tuple(ops)


def _tensors_held(op: Op) -> str | None:
    """The tensors of the model's dtype an op applies through a PyTorch norm, which refuses an input of another
    dtype (a batch norm's running statistics, a norm's affine weight and bias, a channel layer norm's parameters), in
    words; None where it applies none."""
    if isinstance(op, BatchNorm):
        return "its running statistics" + (" and affine weight and bias" if op.affine else "")
    if isinstance(op, Norm) and op.affine:
        return "its affine weight and bias"
    if isinstance(op, ChannelLayerNorm) and op.params():
        return f"parameters {' and '.join(op.params())}"
    return None


def _per_channel_hint(shape: Shape, producer: Producer, channels: int) -> str:
    """What to write instead of a per-channel parameter where the chain lost its (N, C, spatial) structure: keepdim
    where the channels are kept as [N, C]; else a scalar, one value for every position. Where one channel is left
    at the chain's rank (a channel reduction with keepdim), also that C values would broadcast back to C channels,
    a shape no op of a chain makes: a scalar means one channel, not that."""
    if len(shape) == 2 and shape[1] == channels:  # [N, C]: channels kept, spatial dims dropped
        return (" (a per-channel parameter meets values that keep their spatial dims: reduce with keepdim: true "
                "before it, and flatten after)")
    scalar = " (one value for every channel: declare it shape: scalar)"
    if len(shape) == 2 + producer.spatial_dims and shape[1] == 1:
        return (f"; PyTorch would broadcast the one channel left against its {count(channels, 'value')}, back to "
                f"{count(channels, 'channel')}, and no op of a chain widens it again{scalar}")
    return scalar


def _needs_spatial(cls: type[Op]) -> bool:
    """Whether an op works on the spatial dims of an (N, C, spatial) input: the pools."""
    return cls.role in ("pool", "adaptive")


def _needs_channels(cls: type[Op]) -> bool:
    """Whether an op needs the convolution's channels as well: the per-channel norms, whose modules
    hold one value per channel (a layer norm names its own dims), and a layer norm over the channels, whose
    weight and bias are per-channel parameters."""
    return (cls.role == "norm" and not issubclass(cls, LayerNorm)) or issubclass(cls, ChannelLayerNorm)


def _structured(shape: Shape, producer: Producer, channels: int) -> str | None:
    """None where ``shape`` still has the chain's (N, C, spatial) structure (C ``channels``: the convolution's, or
    half of them after a glu over the channels), else what changed it."""
    if len(shape) != 2 + producer.spatial_dims:
        return f"the input is now {list(shape)}, of rank {len(shape)}"
    if shape[1] != channels:
        return f"the input now has {count(shape[1], 'channel')}: {list(shape)}"
    return None


def _parse_search(raw: Any, path: str) -> SearchSettings:
    if raw is None:
        raw = {}
    _check_keys(raw, SEARCH_KEYS, path, "search", f"a mapping with keys {', '.join(SEARCH_KEYS)}")
    defaults = SearchSettings()
    trials = raw.get("trials", defaults.trials)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ConfigError(path, "search.trials", f"expected a positive integer, got {trials!r}")
    timeout = raw.get("timeout", defaults.timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(path, "search.timeout", f"expected a positive number of seconds, got {timeout!r}")
    seed = raw.get("seed", defaults.seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(path, "search.seed", f"expected an integer, got {seed!r}")
    exclude = _parse_exclude_worlds(raw.get("exclude_worlds", []), path)
    timing = raw.get("timing", defaults.timing)
    if timing not in TIMINGS:
        raise ConfigError(path, "search.timing", f"expected one of {', '.join(TIMINGS)}, got {timing!r}")
    return SearchSettings(trials=trials, timeout=float(timeout), seed=seed, exclude_worlds=exclude, timing=timing)


def _parse_exclude_worlds(raw: Any, path: str, where: str = "search.exclude_worlds") -> tuple[str, ...]:
    """A list of world names (fusetune.worlds.WORLDS), each once, that leaves at least one world in."""
    from fusetune.worlds import WORLDS

    if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
        raise ConfigError(path, where, f"expected a list of worlds ({', '.join(WORLDS)}), got {raw!r}")
    for name in raw:
        if not isinstance(name, str) or name not in WORLDS:
            raise ConfigError(path, where, f"unknown world {name!r}{did_you_mean(str(name), tuple(WORLDS))} "
                                           f"(expected some of: {', '.join(WORLDS)})")
    if set(raw) >= set(WORLDS):
        raise ConfigError(path, where, "leaves no world to search")
    return tuple(sorted(set(raw), key=list(WORLDS).index))
