"""``fusetune bench``: eager PyTorch, torch.compile and the tuned winner, in one process.

Same inputs, same weights, same timing method for all (CUDA events, L2 flushed, median).
The fused epilogue is also timed alone against the bytes it must move, at the copy
bandwidth measured here, so its distance from the memory floor is explicit.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

from fusetune.build import build_and_load
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import ProblemSpec
from fusetune.errors import FusetuneError
from fusetune.evaluate import median_ms
from fusetune.export import find_winner
from fusetune.ops import Shape
from fusetune.plan import Plan, make_plan
from fusetune.search import Machine


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second."""
    import torch

    src = torch.rand(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=20)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def epilogue_bytes(spec: ProblemSpec, plan: Plan, shape: Shape) -> int:
    """The fewest bytes the fused epilogue must move: each pass reads the producer output once,
    the output is written once (per-(n, c) statistics and maps are negligible and left out)."""
    y = math.prod(spec.producer.out_shape(shape)) * 4
    out = math.prod(spec.output_shape(shape)) * 4
    passes = int(plan.needs_stats) + int(plan.family is not None)
    return passes * y + out


def run_bench(spec: ProblemSpec, shape: Shape, cache: Cache, *, reps: int = 50, compile_modes: tuple[str, ...] = (
        "default", "max-autotune-no-cudagraphs"), echo: Callable[[str], None] = print) -> dict[str, Any]:
    import torch

    machine = Machine.detect()
    plan = make_plan(spec)
    rendered = render(plan)
    entry = find_winner(cache, spec, shape, rendered.source_hash, machine.gpu)
    if entry is None or entry.winner is None:
        raise FusetuneError(f"{spec.path}: no tuned winner for {list(shape)} on {machine.gpu}; "
                            f"run `fusetune search {spec.path} --shape {','.join(map(str, shape))}` first")
    generated = build_and_load(rendered, cache, machine.capability)
    torch.manual_seed(0)
    reference = generated.Model().cuda()
    fused = generated.ModelNew(variant=entry.winner["variant"]).cuda()
    fused.load_state_dict(reference.state_dict())
    x = torch.rand(shape, device="cuda")
    with torch.no_grad():
        ref64 = copy.deepcopy(reference).double()(x.double())
        err_fused = ((fused(x).double() - ref64).norm() / ref64.norm()).item()
        err_eager = ((copy.deepcopy(reference)(x).double() - ref64).norm() / ref64.norm()).item()
        del ref64
    result: dict[str, Any] = {
        "config": spec.name, "shape": list(shape), "gpu": machine.gpu, "cuda": machine.cuda, "torch": machine.torch,
        "driver": _driver(), "winner": entry.winner["candidate"], "error_rel": err_fused, "eager_error_rel": err_eager}
    echo(f"{spec.name} {list(shape)} on {machine.gpu}: timing eager")
    result["eager_ms"] = median_ms(lambda: reference(x), reps=reps)
    for mode in compile_modes:
        echo(f"  torch.compile mode={mode} (compiling...)")
        compiled = torch.compile(copy.deepcopy(reference), mode=mode)
        with torch.no_grad():
            compiled(x)
        result[f"compile_{mode}_ms"] = median_ms(lambda: compiled(x), reps=reps)
        torch._dynamo.reset()
    result["fusetune_ms"] = median_ms(lambda: fused(x), reps=reps)
    result["producer_ms"] = median_ms(lambda: fused.produce(x), reps=reps)
    with torch.no_grad():
        y = fused.produce(x)
    result["epilogue_ms"] = median_ms(lambda: fused.epilogue(y), reps=reps)
    bandwidth = copy_bandwidth_gbs()
    nbytes = epilogue_bytes(spec, plan, shape)
    result.update(copy_gbs=bandwidth, epilogue_bytes=nbytes,
                  epilogue_floor_ms=nbytes / (bandwidth * 1e9) * 1e3)
    result["epilogue_floor_fraction"] = result["epilogue_floor_ms"] / result["epilogue_ms"]
    result["speedup_vs_eager"] = result["eager_ms"] / result["fusetune_ms"]
    for mode in compile_modes:
        result[f"speedup_vs_compile_{mode}"] = result[f"compile_{mode}_ms"] / result["fusetune_ms"]
    return result


def _driver() -> str:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def table(results: list[dict[str, Any]]) -> str:
    header = ("config", "shape", "eager", "compile", "max-autotune", "fusetune", "vs eager", "vs m-a",
              "epilogue", "floor", "of floor")
    rows = [header]
    for r in results:
        rows.append((r["config"], "x".join(map(str, r["shape"])), f"{r['eager_ms']:.3f}",
                     f"{r.get('compile_default_ms', float('nan')):.3f}",
                     f"{r.get('compile_max-autotune-no-cudagraphs_ms', float('nan')):.3f}",
                     f"{r['fusetune_ms']:.3f}", f"{r['speedup_vs_eager']:.2f}x",
                     f"{r.get('speedup_vs_compile_max-autotune-no-cudagraphs', float('nan')):.2f}x",
                     f"{r['epilogue_ms']:.3f}", f"{r['epilogue_floor_ms']:.3f}", f"{100 * r['epilogue_floor_fraction']:.0f}%"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    gpu = results[0]["gpu"] if results else "?"
    return "\n".join(lines) + f"\n(ms, median; {gpu}; copy bandwidth {results[0]['copy_gbs']:.0f} GB/s)" if results else ""


def _main(paths: list[str]) -> None:
    """Print the table of saved ``fusetune bench --json`` results."""
    import json

    print(table([r for p in paths for r in json.loads(open(p).read())]))


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
