"""The import: the chains of a traced model (find_chains), one config per chain and the map beside them (import_model,
import_traced), each node of the model said where it stays in PyTorch and why; an import refuses to overwrite a config
edited since an earlier import wrote it (OverwriteError, exit 2) unless forced.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping, Sequence

import torch
import torch.nn as nn

from fusetune.errors import FusetuneError
from fusetune.importer.builders.identities import _is_identity
from fusetune.importer.chains import Chain, NoChain, producer_outside, walk_chain
from fusetune.importer.configs import (Written, _dump, _in_model_dtype, _shape_note, chain_derived, chain_inputs,
                                       fit_chain, write_config)
from fusetune.importer.graph import _describe, _is_shape_read, _is_size_arithmetic, _read_what
from fusetune.importer.loading import LoadedModel, load_model
from fusetune.importer.producers import _PAD_NOT_TAKEN, _pads_a_convolution, match_producer
from fusetune.importer.table import lookup
from fusetune.importer.tracing import TraceError, _input_rank, matching_trace, trace
from fusetune.ops import Shape


def _chain_dtype(loaded: LoadedModel, chain: Chain) -> torch.dtype:
    """The dtype a chain computes in: its convolution weight's (the user's tensor, or the first one its
    computation reads), else the model's."""
    weight = chain.weights.get("producer.weight")
    if weight is None and "producer.weight" in chain.producer_derived:
        weight = next(iter(chain.producer_derived["producer.weight"].reads), None)
    return loaded.tensor_dtypes.get(weight or "", loaded.dtype)


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


def import_model(spec: str, out_dir: Path, input_shapes: Sequence[Shape] = (), force: bool = False,
                 eval_mode: bool = False) -> ImportResult:
    """Load, trace, find the chains, write one config per chain and the map (``force``: over configs edited since
    an earlier import wrote them too: _check_overwrites). ``eval_mode``: the model is imported as ``model.eval()``
    runs it (batch norms from their running statistics, dropout off), as a service runs it; else in the mode it is
    built in (training, for a module just constructed)."""
    loaded = load_model(spec, input_shapes)
    if eval_mode:
        loaded.model.eval()
    model = _copy(loaded.model)
    try:
        gm = trace(model, loaded.inputs, spec)
    except TraceError as exc:
        raise TraceError(f"{exc}{_cast_note(loaded)}") from None
    # configs of a chain the model does not compute would be tuned for nothing, or worse: the trace that computes it
    gm = matching_trace(model, gm, loaded.inputs, spec)
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
    returned = {name: i for i, w in enumerate(written) if producer_outside(w.chain) for name in w.chain.producer_values}
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
        elif any(n.name in returned for n in node.all_input_nodes):
            i = next(returned[n.name] for n in node.all_input_nodes if n.name in returned)
            out[node.name] = (f"{_describe(gm, node)} is in the vocabulary, but it reads chain{i}'s convolution "
                              "output, which that chain returns beside its own value (outputs: [chain, producer])")
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
                    # where the fused chain returns the convolution's output too (outputs: [chain, producer]): the
                    # ops outside that read it there
                    **({"producer_read_by": producer_outside(w.chain)} if producer_outside(w.chain) else {}),
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
        outside = producer_outside(w.chain)
        reads += f"; returns its convolution's output too, for {', '.join(outside)}" if outside else ""
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
