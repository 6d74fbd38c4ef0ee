"""The chain corpus (tests/chains/*.yaml): realistic convolution-led chains, every op and producer of the
vocabulary among them, on CPU.

For each chain: the config loads, the planner plans it (never raising: what the kernels do not take runs in
PyTorch, region by region), the module renders, the generated reference ``Model`` runs in float64 on the first
shape's input with the output shape the spec promises, and ``fusetune plan`` names every region. One nvcc run
(a translation unit per core) compiles every chain's rendered common header (at its dtype), the chain's device
functions, each in a namespace of its own with a small kernel that calls them, for sm_90 without spills. The corpus
covers the whole vocabulary (REGISTRY, producers.KINDS): an op added without a chain fails here.
scripts/verify-chains runs the corpus on a GPU (every world of every chain against float64); its argument
parsing and the dealing of chains over cards are tested here too.
"""
from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import yaml
from click.testing import CliRunner

from fusetune import codegen
from fusetune.cli import main
from fusetune.config import TOP_KEYS, load_config
from fusetune.dtypes import DTYPES
from fusetune.pipeline import later_segments
from fusetune.plan import make_plan

from conftest import ROOT, import_file, import_script

CHAINS_DIR = ROOT / "tests" / "chains"
CHAINS = sorted(CHAINS_DIR.glob("*.yaml"))
IDS = [path.stem for path in CHAINS]
#: Largest tensor (input or any intermediate) of a chain's first shape: its float64 reference runs on a CPU
#: in well under a second.
MAX_FIRST_ELEMENTS = 2_000_000
NVCC = shutil.which("nvcc")


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@functools.lru_cache(maxsize=None)
def _spec(stem: str):
    return load_config(CHAINS_DIR / f"{stem}.yaml")


@functools.lru_cache(maxsize=None)
def _plan(stem: str):
    return make_plan(_spec(stem))


@functools.lru_cache(maxsize=None)
def _rendered(stem: str):
    """The module's files and the Jinja context render() gave its units (codegen._units' argument), for the
    common header alone."""
    captured: dict = {}
    units = codegen._units

    def capture(env, plan, variants, context):
        captured.update(context)
        return units(env, plan, variants, context)
    with mock.patch.object(codegen, "_units", capture):
        module = codegen.render(_plan(stem))
    return module, captured


# ------------------------------------------------------------------------------------------------------
# The corpus itself
# ------------------------------------------------------------------------------------------------------

def test_corpus_is_large_and_named_by_content():
    assert len(CHAINS) >= 64
    producers = {_raw(path)["producer"]["op"] for path in CHAINS}
    for path in CHAINS:  # a name says its producer first, as the seeds' do (after the sweep that found it:
        kind = _raw(path)["producer"]["op"]  # sweep3_, or sweep4_half_ for its half-precision chains)
        prefix = {"conv_transpose1d": "convt1d", "conv_transpose2d": "convt2d", "conv_transpose3d": "convt3d"}
        assert re.sub(r"^sweep\d+_(half_)?", "", path.stem).startswith(prefix.get(kind, kind) + "_"), path.name
    assert len(producers) >= 6
    # some chains in the K-tiled world (64 channels and more), some with two shapes, some with one
    assert sum(_raw(p)["producer"]["out_channels"] >= 64 for p in CHAINS) >= 8
    assert {len(_raw(p)["shapes"]) for p in CHAINS} == {1, 2}


@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_chain_file_is_well_formed(path):
    """A one-line comment saying what the chain covers, its name its file's stem, known top-level keys, one or
    two shapes, and a first shape small enough for a CPU reference (checked in PyTorch terms: no fusetune)."""
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# ") and len(first) > 10, "the file starts with a one-line '# ' comment"
    raw = _raw(path)
    assert raw["name"] == path.stem
    assert set(raw) <= set(TOP_KEYS) and {"name", "producer", "epilogue", "shapes"} <= set(raw)
    assert 1 <= len(raw["shapes"]) <= 2
    assert math.prod(raw["shapes"][0]) <= MAX_FIRST_ELEMENTS


def test_corpus_covers_the_vocabulary():
    """Every op name of the registry and every producer kind appears in some chain: the corpus grows with the
    vocabulary (read from the files, so a chain that does not load yet still counts)."""
    from fusetune.ops import REGISTRY
    from fusetune.producers import KINDS

    ops = {entry["op"] for path in CHAINS for entry in _raw(path)["epilogue"]}
    producers = {_raw(path)["producer"]["op"] for path in CHAINS}
    assert sorted(set(REGISTRY) - ops) == [], "ops no chain uses"
    assert sorted(set(KINDS) - producers) == [], "producers no chain uses"
    assert sorted(ops - set(REGISTRY)) == [], "ops the corpus uses that the registry does not know"


#: Activations (pointwise ops with no operand), for "a norm after an activation".
ACTIVATIONS = {"relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "sigmoid",
               "hardsigmoid", "hardswish", "hardtanh", "tanh"}


def test_corpus_covers_compositions():
    """The compositions the corpus exists for: pools in a row, a norm after a pool, two norms, a reduction
    after a reduction, keepdim, softmax and logsumexp over channels, flatten last, residuals on the producer,
    batch norm in both modes, group norm by num_groups, strided, padded, dilated, grouped and 'same'
    convolutions, transposed ones with output padding."""
    roles = {"max_pool": "pool", "avg_pool": "pool", "adaptive_avg_pool": "pool", "adaptive_max_pool": "pool",
             "batch_norm": "norm", "group_norm": "norm", "instance_norm": "norm", "layer_norm": "norm",
             **{r: "reduce" for r in ("sum", "mean", "max", "min", "amax", "amin", "logsumexp")}}
    seen = set()
    for path in CHAINS:
        raw = _raw(path)
        chain, producer = raw["epilogue"], raw["producer"]
        kinds = [roles.get(entry["op"], entry["op"]) for entry in chain if entry["op"] not in ("dropout",)]
        pairs = set(zip(kinds, kinds[1:]))
        if ("pool", "pool") in pairs:
            seen.add("pools in a row")
        if ("pool", "norm") in pairs:
            seen.add("norm after pool")
        if any(b == "norm" and a in ACTIVATIONS for a, b in pairs):
            seen.add("norm after activation")
        if kinds.count("norm") >= 2:
            seen.add("two norms")
        if ("reduce", "reduce") in pairs:
            seen.add("reduction after reduction")
        for entry in chain:
            if entry.get("keepdim"):
                seen.add("keepdim")
            if entry["op"] in ("softmax", "log_softmax", "logsumexp") and entry.get("dim") == 1:
                seen.add(f"{entry['op']} over channels")
            if entry.get("by") == "producer":
                seen.add("by producer")
            if entry.get("by") in raw.get("inputs", []):
                seen.add("by input")
            if entry["op"] == "batch_norm":
                seen.add(f"batch norm training={entry.get('training', True)}")
            if entry["op"] == "group_norm" and "num_groups" in entry:
                seen.add("num_groups")
        if chain[-1]["op"] == "flatten":
            seen.add("flatten last")
        for key in ("stride", "padding", "dilation", "groups", "output_padding"):
            if producer.get(key, 0) not in (0, 1, [1, 1], [1, 1, 1]):
                seen.add(f"producer {key}")
        if producer.get("padding") == "same":
            seen.add("padding same")
        if any(isinstance(producer.get(k), list) for k in ("kernel_size", "stride", "padding")):
            seen.add("non-square producer")
    for op in ("relu", "gelu"):  # an activation between a norm and a pool, as most blocks have one
        assert any(entry["op"] == op for path in CHAINS for entry in _raw(path)["epilogue"])
    assert seen >= {"pools in a row", "norm after pool", "two norms", "reduction after reduction", "keepdim",
                    "softmax over channels", "logsumexp over channels", "log_softmax over channels", "by producer",
                    "by input",
                    "batch norm training=True", "batch norm training=False", "num_groups", "flatten last",
                    "norm after activation", "producer stride", "producer padding", "producer dilation", "producer groups",
                    "producer output_padding", "padding same", "non-square producer"}, seen


# ------------------------------------------------------------------------------------------------------
# Each chain: load, plan, render, reference model, CLI
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_chain_loads(path):
    spec = _spec(path.stem)
    assert spec.name == path.stem
    first = spec.shapes[0]
    biggest = max(math.prod(s) for s in [first, *spec.shapes_through(first)])
    assert biggest <= MAX_FIRST_ELEMENTS, f"the first shape's largest tensor has {biggest} elements"


@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_chain_plans_into_regions(path):
    """make_plan never raises for a valid config; every op of the chain is in the fused region or the PyTorch
    tail after it, but what the rewrites drop (Plan.dropped, which ``fusetune plan`` lists): dropout that does
    nothing, an add or a centring that a norm after it cancels."""
    from fusetune.ops import Add, MeanCentre, Sub

    spec = _spec(path.stem)
    plan = _plan(path.stem)
    covered = {i for step in (*plan.head, *plan.tail) for i in step.entries}
    dropped = {step.entries[0] for step in plan.dropped}
    assert covered | dropped == set(range(len(spec.epilogue))) and not covered & dropped, (plan.regions(),
                                                                                           sorted(covered))
    cancelled = {"norm_cancels_input", "norm_cancels_centring"} & set(plan.rules)
    for step in plan.dropped:
        assert step.op.role == "identity" or (isinstance(step.op, (Add, Sub, MeanCentre)) and cancelled), step.where
    assert (plan.ends is None) == (not plan.tail), plan.ends
    assert plan.regions() and plan.regions()[0].startswith("region 0")


@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_chain_renders(path):
    module, context = _rendered(path.stem)
    assert "model.py" in module.files and module.cuda_sources
    assert context, "render() no longer hands codegen._units its context: the header test below needs it"


@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_chain_reference_model_runs_on_cpu(path, tmp_path):
    """The generated model.py imports without CUDA; its Model runs in float64 on the first shape's random
    input, finite, with the output shape the spec promises; ModelNew has the same parameters and buffers (what
    verification loads from the reference)."""
    import torch

    spec = _spec(path.stem)
    module, _ = _rendered(path.stem)
    generated = import_file(module.write(tmp_path / "module") / "model.py")
    torch.manual_seed(0)
    model = generated.Model().double()
    shape = spec.shapes[0]
    inputs = [torch.randn(s, dtype=torch.float64) for s in spec.input_shapes(shape)]  # the extra inputs, if any
    with torch.no_grad():
        out = model(torch.rand(shape, dtype=torch.float64), *inputs)
    outs = out if len(spec.outputs) > 1 else (out,)  # a tuple where the convolution's output is returned too
    assert [tuple(o.shape) for o in outs] == [tuple(s) for s in spec.output_shapes(shape)]
    assert all(torch.isfinite(o).all() for o in outs), "the chain's reference is not finite: verification never passes"
    fused = generated.ModelNew()
    assert sorted(fused.state_dict()) == sorted(generated.Model().state_dict())


@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_why_region_zero_ends_names_the_op_and_where_it_goes(path):
    """Plan.ends names the entry region 0 stops at, and says no op runs in PyTorch where a later region of kernels
    takes it (fusetune/pipeline.py's segments say which; 'after this region (in a later one, ..., or in PyTorch)'
    leaves it to them)."""
    plan = _plan(path.stem)
    if plan.ends is None:
        return
    assert re.search(r"epilogue\[\d+\]", plan.ends), plan.ends
    working = [s for s in later_segments(plan) if any(step.op.role != "view" for step in s.steps)]
    if working and working[0].kernels:
        assert "runs in PyTorch" not in plan.ends.replace("or in PyTorch)", ""), (plan.ends, working[0].steps)


@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_cli_plan_names_every_region(path):
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert result.output.startswith(f"{path.stem}: ")
    for line in _plan(path.stem).regions():
        assert line in result.output, line


# ------------------------------------------------------------------------------------------------------
# nvcc: every chain's device functions in one or a few translation units
# ------------------------------------------------------------------------------------------------------

#: The chain's device functions: those of the common header taking only values, channels, samples and the
#: argument block, which the probe kernel can call with what it has.
_DEVICE_FN = re.compile(r"__device__\s+(?:__forceinline__\s+|inline\s+)*float\s+(ft_\w+)\s*\(([^)]*)\)\s*\{")


def _probe_args(params: str) -> str | None:
    """Arguments for a device function's parameters from the probe's (v, y, c, n, a), None if it takes others."""
    args = []
    for param in filter(None, (p.strip() for p in params.split(","))):
        words = param.replace("&", " & ").split()
        name, ptype = words[-1], " ".join(words[:-1])
        if "FtArgs" in ptype:
            args.append("a")
        elif ptype == "float":
            args.append("y" if name in ("y", "ft_y", "producer", "r", "raw") else "v")
        elif ptype in ("int64_t", "int", "const int64_t", "const int"):
            args.append("n" if name == "n" else "c")
        else:
            return None
    return ", ".join(args)


def _header_stage(plan) -> str:
    """The stage whose header is compiled: the cuDNN world's main kernel (no convolution inside it), else its
    statistics pass."""
    stages = [s for s in plan.impl_stages["cudnn"] if s != "finalize"]
    return stages[-1] if stages else "window_map"


def _chain_section(index: int, stem: str) -> str:
    """Chain ``stem``'s common header and a kernel calling its device functions, in namespace ftc<index>x; the
    macros it defines undefined after it (so the next chain's header defines its own)."""
    plan = _plan(stem)
    _, context = _rendered(stem)
    from fusetune.templates import environment

    header = environment().get_template("common.cuh.j2").render(stage=_header_stage(plan), **context)
    calls = []
    for name, params in _DEVICE_FN.findall(header):
        args = _probe_args(params)
        if args is not None:
            calls.append(f"  v = {name}({args});")
    assert calls, f"{stem}: no device functions in the common header"
    # (not the reserved names a header defines away for a host compiler, which nvcc's own headers need)
    macros = sorted({m for m in re.findall(r"^\s*#\s*define\s+(\w+)", header, re.M) if not m.startswith("_")})
    probe = "\n".join([
        f'extern "C" __global__ void ft_chain_probe_{index}(FtArgs a, float* out) {{',
        "  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
        "  if (i >= a.N * a.C) return;",
        "  const int64_t c = i % a.C, n = i / a.C;",
        "  const float y = __ldg(a.y + i);",
        "  float v = y;",
        *calls,
        "  out[i] = v;",
        "}"])
    # At a half dtype the header overloads __ldg for its ft_t: in a namespace that would hide CUDA's own
    # overloads (at global scope, where the kernels compile, it adds to them), so those are declared in it.
    return "\n".join([f"// ---- chain {index}: {stem}", f"namespace ftc{index}x {{", "using ::__ldg;", header, probe,
                      f"}}  // namespace ftc{index}x", *(f"#undef {m}" for m in macros), ""])


def _compile_sections(sections: dict[str, str], folder: Path, tag: str) -> tuple[dict, dict]:
    """The sections dealt over one translation unit per core (up to 4), compiled in parallel: per unit nvcc's
    result (stdout and stderr together), and per chain its unit and line range there."""
    units = max(1, min(4, os.cpu_count() or 1, len(sections)))
    # The half dtypes' CUDA headers at file scope first: a chain's header includes its own inside its
    # namespace, which their include guards then make a no-op.
    halves = "".join(f"#include <{header}>\n" for header in sorted({d.header for d in DTYPES.values() if d.header}))
    texts, where = ["#include <cuda_runtime.h>\n#include <math.h>\n#include <stdint.h>\n" + halves] * units, {}
    for k, (stem, text) in enumerate(sections.items()):
        u = k % units
        start = texts[u].count("\n") + 1
        texts[u] += text
        where[stem] = (f"chains_{tag}{u}.cu", start, texts[u].count("\n") + 1)

    def compile_unit(u: int) -> tuple[str, str]:
        source = folder / f"chains_{tag}{u}.cu"
        source.write_text(texts[u])
        done = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-Xptxas", "-warn-spills",
                               "-c", str(source), "-o", str(source.with_suffix(".o"))],
                              capture_output=True, text=True, timeout=600)
        return source.name, ("" if done.returncode == 0 else "FAILED\n") + done.stdout + done.stderr
    with concurrent.futures.ThreadPoolExecutor(units) as pool:
        logs = dict(pool.map(compile_unit, range(units)))
    return logs, where


def _errors_of(log: str, unit: str, first: int, last: int) -> list[str]:
    """nvcc's errors on lines [first, last) of ``unit``, with the line that follows each (the code)."""
    lines = log.splitlines()
    return [" / ".join(lines[i:i + 2]) for i, line in enumerate(lines)
            if (m := re.search(re.escape(unit) + r"\((\d+)\): error", line)) and first <= int(m.group(1)) < last]


@pytest.fixture(scope="module")
def headers_compiled(tmp_path_factory):
    """Every chain that renders, compiled at once (_compile_sections); where some chains' lines have errors,
    the others again without them, so that one chain's error does not hide the rest's spills. Per chain:
    the errors of its lines, or the log of the unit it compiled in and its line range there."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    folder = tmp_path_factory.mktemp("chain_headers")
    sections, outcome = {}, {}
    for i, stem in enumerate(IDS):
        try:
            sections[stem] = _chain_section(i, stem)
        except Exception as exc:  # the chain's own tests say why
            outcome[stem] = {"render": f"{type(exc).__name__}: {exc}"}
    for tag in ("a", "b"):
        if not sections:
            break
        logs, where = _compile_sections(sections, folder, tag)
        broken = {}
        for stem, (unit, first, last) in where.items():
            errors = _errors_of(logs[unit], unit, first, last)
            if errors:
                broken[stem] = errors
            outcome[stem] = {"errors": errors, "log": logs[unit], "unit": unit, "lines": (first, last)}
        if not broken or not any(logs[u].startswith("FAILED") for u in logs):
            break
        sections = {stem: text for stem, text in sections.items() if stem not in broken}
    return outcome


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("path", CHAINS, ids=IDS)
def test_chain_header_compiles_for_sm90_without_spills(headers_compiled, path):
    """The chain's common header (its elementwise chains as device functions, and what every stage shares)
    with a kernel calling each device function, compiled for sm_90: no errors, no register spills."""
    stem = path.stem
    found = headers_compiled[stem]
    if "render" in found:
        pytest.fail(f"the chain's header did not render: {found['render']}")
    assert not found["errors"], "\n".join(found["errors"][:10])
    log = found["log"]
    assert not log.startswith("FAILED"), f"{found['unit']} failed to compile (not on this chain's lines):\n{log[-3000:]}"
    index = IDS.index(stem)
    mine = re.compile(rf"ft_chain_probe_{index}\b|ftc{index}x")
    entries = [fn for fn in re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", log) if mine.search(fn)]
    assert f"ft_chain_probe_{index}" in entries, log[-2000:]
    spills = [line for line in log.splitlines() if "spilled" in line and mine.search(line)]
    props = re.findall(r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores", log)
    spills += [f"{fn}: {n} bytes spill stores" for fn, n in props if mine.search(fn) and int(n)]
    assert not spills, spills


# ------------------------------------------------------------------------------------------------------
# scripts/verify-chains, the part that needs no GPU
# ------------------------------------------------------------------------------------------------------

def _verify_chains():
    return import_script("verify-chains")


def test_verify_chains_arguments():
    script = _verify_chains()
    args = script.parse_args([])
    assert args.gpus == 1 and args.k is None and args.configs == [] and args.out
    assert script.select(args) == CHAINS  # the corpus by default, in order
    args = script.parse_args(["--out", "x.json", "-k", "convt3d", "--gpus", "4"])
    assert (args.out, args.k, args.gpus) == ("x.json", "convt3d", 4)
    chosen = script.select(args)
    assert chosen and all("convt3d" in p.stem for p in chosen)
    assert set(chosen) == {p for p in CHAINS if "convt3d" in p.stem}
    seeds = sorted((ROOT / "configs").glob("*.yaml"))
    args = script.parse_args([str(p) for p in seeds] + ["-k", "batchnorm"])
    assert script.select(args) == [p for p in seeds if "batchnorm" in p.stem]
    with pytest.raises(SystemExit):
        script.parse_args(["--gpus", "0"])
    assert os.access(ROOT / "scripts" / "verify-chains", os.X_OK)
    assert (ROOT / "scripts" / "verify-chains").read_text().startswith("#!/usr/bin/env python3\n")
    # a world or a choice that names nothing is a usage error, before any GPU is looked for
    fp16 = [ROOT / "benchmarks" / "half" / "conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml"]
    assert script.main(["--impl", "gemmm", str(fp16[0])]) == 2
    assert script.main(["--set", "gemm_stats.tapz=2", str(fp16[0])]) == 2
    assert script.main(["--set", "gemm_stats.taps=3", str(fp16[0])]) == 2  # not among its choices
    assert script.unknown_choices(fp16, script.parse_args(["--set", "gemm_stats.taps=2", "--impl", "gemm"])) is None


def test_verify_chains_deals_chains_over_cards():
    script = _verify_chains()
    costs = {CHAINS[i]: cost for i, cost in enumerate([9, 1, 1, 4, 3, 3, 2, 2, 1])}
    for cards in (1, 2, 3, 8, 20):
        shares = script.deal(list(costs), cards, cost=costs.__getitem__)
        assert sorted(p for share in shares for p in share) == sorted(costs)  # each chain once
        assert all(shares) and len(shares) == min(cards, len(costs))  # no card idles while another has two
        for share in shares:  # a share keeps the corpus order
            assert share == sorted(share, key=list(costs).index)
    loads = sorted(sum(costs[p] for p in share) for share in script.deal(list(costs), 2, cost=costs.__getitem__))
    assert loads == [13, 13]  # largest first to the least loaded card
    # the card numbers a share runs on: the parent's visible devices, in order
    assert script.card_ids(3, "4,5,6,7") == ["4", "5", "6"]
    assert script.card_ids(2, None) == ["0", "1"]


def test_verify_chains_line_and_failure():
    script = _verify_chains()
    ok = {"name": "c", "impl": "gemm", "status": "ok", "error_rel": 1e-6, "error_max": 2e-6,
          "eager_error_rel": 1e-6, "eager_error_max": 3e-6}
    line = script.format_line(ok)
    assert "c" in line and "gemm" in line and "ok" in line and "1.0e-06" in line and "3.0e-06" in line
    assert not script.failed(ok)
    assert script.failed({**ok, "status": "wrong_result"})
    assert script.failed({"name": "c", "impl": "-", "status": "config_error", "log": "bad"})
    # TF32 kernels rightly refused where eager's convolution ran without TF32 (tests/test_gpu.py's rule)
    refused = {**ok, "impl": "gemm", "status": "wrong_result", "eager_error_rel": 1e-7, "tf32_error_rel": 1e-4,
               "tf32_error_max": 1e-4, "error_rel": 2e-4, "error_max": 2e-4}
    assert script.tf32_refused(refused) and not script.failed(refused)
    assert not script.tf32_refused({**refused, "impl": "direct"})
