"""Configs: a chain's first steps as a config (chain_config, with its parameters, extra inputs and derived operands
named: chain_inputs, chain_derived), the longest prefix whose config validates and plans (fit_chain), the dtype it is
written at, and the atomic write of a config that load_config accepts (write_config).
"""
from __future__ import annotations

import dataclasses
import keyword
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import yaml

from fusetune import broadcast
from fusetune.config import _reserved, load_config, parse_config
from fusetune.derived import Derivation
from fusetune.errors import ConfigError, FusetuneError
from fusetune.importer.chains import Chain, Step, _last_value, producer_outside, settle_derived, settle_sizes
from fusetune.importer.graph import Entry, fetch
from fusetune.importer.matching import _channel_import, _gate_import
from fusetune.importer.operands import DerivedRef, InputRef, ParamRef
from fusetune.producers import KINDS


#: Names an extra input of the config may not take (config.INPUT_RESERVED); one that would is prefixed.
_INPUT_PREFIX = "input_"


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
    if producer_outside(chain, steps):  # ops outside read the convolution's output: the fused chain returns it too
        raw["outputs"] = ["chain", "producer"]
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
        if k < len(chain.steps):  # the cut-off ops that read the convolution's output read the one it returns
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
