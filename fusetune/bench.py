"""``fusetune bench``: eager PyTorch, torch.compile and the tuned winner, in one process.

Same inputs, same weights, same timing method for all (CUDA events, L2 flushed, median).
With cuDNN as the producer, the fused epilogue is also timed alone against the bytes it must
move, at the copy bandwidth measured here, so its distance from the memory floor is explicit,
and each of its kernels is profiled the same way (torch.profiler).
With the convolution inside the kernels (direct on CUDA cores, gemm on tensor cores), there is
no epilogue to time alone: the convolution's useful FLOP rate is reported against the peak of
the units that compute it (FP32 FMA, or dense TF32 MMA) instead.
"""
from __future__ import annotations

import contextlib
import copy
import math
import re
from typing import Any, Callable

from fusetune import broadcast
from fusetune.build import build_and_load
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import ProblemSpec
from fusetune.dtypes import DTYPES
from fusetune.errors import FusetuneError
from fusetune.evaluate import draw_extra_inputs, median_ms, outputs_of
from fusetune.export import find_winner
from fusetune.ops import Shape
from fusetune.plan import Plan, make_plan
from fusetune.search import Machine
from fusetune.worlds import DEFAULT, WORLDS, conv_passes


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second."""
    import torch

    src = torch.rand(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=20)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def epilogue_bytes(spec: ProblemSpec, plan: Plan, shape: Shape) -> int:
    """The fewest bytes the fused epilogue must move: each pass reads the producer output once,
    the output is written once, and an extra input the kernels read (Plan.extra, of the output's size) read once
    (per-(n, c) statistics and maps, and an input that broadcasts per (n, c), are negligible and left out)."""
    word = DTYPES[spec.dtype].bytes
    y = math.prod(spec.producer.out_shape(shape)) * word
    out = math.prod(plan.fused_output_shape(shape)) * word
    passes = int(plan.needs_stats) + int(plan.family is not None)
    full_input = getattr(plan, "extra", None) and broadcast.kind_of(spec, plan.extra) is None
    return passes * y + out * (2 if full_input else 1)


#: Kernels that read the producer output once (their pass's floor is those bytes), by base name;
#: the main families also write the model output.
PASS_KERNELS = {"ft_stats_kernel": False, "ft_stats_cl_kernel": False}
MAIN_KERNELS = {f"ft_{family}{layout}_kernel": True for family in ("window_map", "plane_reduce", "channel_reduce")
                for layout in ("", "_cl")}


def kernel_bytes(name: str, plan: Plan, shape: Shape) -> int | None:
    """The fewest bytes one of the epilogue's kernels must move: a pass over the producer output
    reads it once (and the main pass writes the output); None for the kernels that move only
    per-(sample, channel) values (finalize, the combine of a split plane reduction)."""
    kind = {**PASS_KERNELS, **MAIN_KERNELS}.get(name)
    if kind is None:
        return None
    word = DTYPES[plan.spec.dtype].bytes
    y = math.prod(plan.spec.producer.out_shape(shape)) * word
    out = math.prod(plan.fused_output_shape(shape)) * word * (2 if getattr(plan, "extra", None) else 1)  # + extra
    return y + (out if kind else 0)


def kernel_base_name(profiled: str) -> str:
    """``void ft_stats_kernel<512, 4, 0>(FtArgs)`` -> ``ft_stats_kernel``, as the profiler names it."""
    match = re.search(r"\b(ft_\w+?)\s*[<(]", profiled)
    return match.group(1) if match else profiled


def kernel_rows(times_ms: dict[str, float], plan: Plan, shape: Shape, bandwidth_gbs: float) -> list[dict[str, Any]]:
    """Per fused kernel: its time per forward, the bytes it must move and the fraction of the copy
    floor it reaches (None where it moves only per-channel values)."""
    rows = []
    for name, ms in sorted(times_ms.items(), key=lambda item: -item[1]):
        nbytes = kernel_bytes(name, plan, shape)
        floor = nbytes / (bandwidth_gbs * 1e9) * 1e3 if nbytes is not None else None
        rows.append({"kernel": name, "ms": ms, "bytes": nbytes, "floor_ms": floor,
                     "floor_fraction": floor / ms if floor is not None and ms > 0 else None})
    return rows


def profile_kernels_ms(fn: Callable[[], Any], reps: int = 10) -> dict[str, float]:
    """Device time per call of ``fn`` of each of fusetune's kernels (``ft_*``) it launches, from
    torch.profiler (warmed up first; no L2 flush between calls, unlike ``median_ms``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        name = kernel_base_name(event.key)
        if name.startswith("ft_") and event.self_device_time_total > 0:
            times[name] = times.get(name, 0.0) + event.self_device_time_total / 1e3 / reps  # us -> ms per call
    return times


def conv_flops(spec: ProblemSpec, shape: Shape) -> int:
    """Useful floating-point operations of the convolution (2 per multiply-add, no zero taps):
    every output of a convolution, every input of a transposed one, meets every tap once (of its
    group's channels: the geometry's weight count)."""
    producer = spec.producer
    points = math.prod(shape[2:]) if producer.transposed else math.prod(producer.out_shape(shape)[2:])
    return 2 * shape[0] * points * producer.geometry()["weights"]


def spectral_flops(spec: ProblemSpec, shape: Shape) -> int:
    """The products spectral_stats computes instead of the convolution: N * CIN * C complex
    multiply-adds (8 flops) per bin of the output's half spectrum."""
    out = spec.producer.out_shape(shape)
    bins = math.prod(out[2:-1]) * (out[-1] // 2 + 1)
    return 8 * shape[0] * spec.producer.in_channels * spec.producer.out_channels * bins


#: Dense flops per multiprocessor per clock on Hopper, by the units that compute them; TF32x3 counts the
#: useful products of split TF32 (three TF32 MMAs each, precision ieee).
PEAK_FLOPS_PER_SM_CLOCK = {"FP32": 128 * 2, "TF32": 1024 * 2, "TF32x3": 1024 * 2 / 3, "FP16": 2048 * 2}


def compute_units(impl: str, spec: ProblemSpec | None = None) -> str:
    """The units a world's convolution (or what stands for it) runs on: the gemm_* worlds' implicit GEMMs on
    the tensor cores (World.tf32): in TF32, in split TF32 under precision ieee, on FP16/BF16 MMAs at a half
    dtype they take as it is (World.native_mma); the direct kernels and spectral's products on CUDA cores."""
    world = WORLDS[impl]
    if not world.tf32:
        return "FP32"
    if spec is not None and spec.precision == "ieee":
        return "TF32x3"
    if spec is not None and spec.dtype in world.native_mma:
        return "FP16"
    return "TF32"


def peak_tflops(flops_per_sm_clock: int) -> float | None:
    """A peak at the maximum SM clock (nvidia-smi): multiprocessors x flops per clock x clock."""
    import subprocess

    import torch

    try:
        mhz = float(subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=10).stdout.split()[0])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return sms * flops_per_sm_clock * mhz * 1e6 / 1e12


def run_bench(spec: ProblemSpec, shape: Shape, cache: Cache, *, reps: int = 50, compile_modes: tuple[str, ...] = (
        "default", "max-autotune-no-cudagraphs"), echo: Callable[[str], None] = print) -> dict[str, Any]:
    machine = Machine.detect()
    plan = make_plan(spec)
    rendered = render(plan)
    entry = find_winner(cache, spec, shape, rendered.source_hash, machine.gpu)
    if entry is None or entry.winner is None:
        raise FusetuneError(f"{spec.path}: no tuned winner for {list(shape)} on {machine.gpu}; "
                            f"run `fusetune search {spec.path} --shape {','.join(map(str, shape))}` first")
    generated = build_and_load(_winner_or_full(plan, rendered, entry.winner["variant"], cache, machine.capability),
                               cache, machine.capability)
    # precision ieee: every column with TF32 off in cuDNN (and in what torch.compile generates for the
    # convolution), as the models' own forwards run it; restored after.
    precision = generated._ConvPrecision() if spec.precision == "ieee" else contextlib.nullcontext()
    with precision:
        return _run_bench(spec, shape, plan, generated, entry, machine, reps, compile_modes, echo, cache)


def _winner_or_full(plan: Plan, rendered: Any, variant: dict[str, Any], cache: Cache, arch: str) -> Any:
    """The module to bench the winner in: the module of every variant where a build of it is finished, else
    the winner's alone (fusetune.lazy.winner_module). A search builds per batch (fusetune.lazy), so the module
    of every variant is seldom built, and building it for one variant cost a minute of nvcc."""
    from fusetune.build import finished
    from fusetune.lazy import winner_module

    if finished(cache.build_dir(f"{rendered.name}-sm{arch.replace('.', '')}"), arch):
        return rendered
    return winner_module(plan, variant)


def _flat(out: Any) -> Any:
    """A forward's outputs (one tensor, or each a model returns: ``outputs: [chain, producer]``) as one flat float64
    tensor: the errors and the allclose below then take every output."""
    import torch

    return torch.cat([o.double().flatten() for o in outputs_of(out)])


def _run_bench(spec: ProblemSpec, shape: Shape, plan: Plan, generated: Any, entry: Any, machine: Machine, reps: int,
               compile_modes: tuple[str, ...], echo: Callable[[str], None], cache: Cache) -> dict[str, Any]:
    import torch

    from fusetune.later import attach_later

    torch.manual_seed(0)
    reference = generated.Model().cuda()
    fused = generated.ModelNew(variant=entry.winner["variant"]).cuda()
    fused.load_state_dict(reference.state_dict())
    later = attach_later(fused, plan, cache, machine.gpu, machine.capability)  # the later regions' tuned kernels
    x = torch.rand(shape, device="cuda", dtype=generated.DTYPE)  # every column at the config's dtype
    inputs = draw_extra_inputs(generated, plan.spec.input_shapes(shape))  # the forward's arguments after x, if any
    kernel_extra = dict(zip(getattr(generated, "INPUTS", []), inputs)).get(getattr(generated, "KERNEL_INPUT", None))
    with torch.no_grad():
        ref64 = _flat(copy.deepcopy(reference).double()(x.double(), *(t.double() for t in inputs)))
        out, eager_out = _flat(fused(x, *inputs)), _flat(copy.deepcopy(reference)(x, *inputs))
        err_fused = ((out - ref64).norm() / ref64.norm()).item()
        err_eager = ((eager_out - ref64).norm() / ref64.norm()).item()
        # What a user's acceptance test against eager at the dtype sees (the config's tolerance, if any).
        eager_diff = (out - eager_out).abs().max().item()
        allclose = (torch.allclose(out, eager_out, atol=spec.tolerance.atol, rtol=spec.tolerance.rtol)
                    if spec.tolerance else None)
        del ref64, out, eager_out
    result: dict[str, Any] = {
        "config": spec.name, "shape": list(shape), "gpu": machine.gpu, "cuda": machine.cuda, "torch": machine.torch,
        "driver": _driver(), **spec.numerics(), "winner": entry.winner["candidate"], "error_rel": err_fused,
        "eager_error_rel": err_eager, "eager_diff_max": eager_diff, "allclose_to_eager": allclose,
        "later_regions": later}
    echo(f"{spec.name} {list(shape)} on {machine.gpu}: timing eager")
    result["eager_ms"] = median_ms(lambda: reference(x, *inputs), reps=reps)
    for mode in compile_modes:
        echo(f"  torch.compile mode={mode} (compiling...)")
        compiled = torch.compile(copy.deepcopy(reference), mode=mode)
        with torch.no_grad():
            compiled(x, *inputs)
        result[f"compile_{mode}_ms"] = median_ms(lambda: compiled(x, *inputs), reps=reps)
        torch._dynamo.reset()
    result["fusetune_ms"] = median_ms(lambda: fused(x, *inputs), reps=reps)
    bandwidth = copy_bandwidth_gbs()
    result["copy_gbs"] = bandwidth
    impl = entry.winner["candidate"].get("producer.impl", DEFAULT)
    if not WORLDS[impl].own_kernels:
        # nothing beat PyTorch's own forward (eager) or torch.compile's of it (inductor), or cuDNN's fused
        # convolution of the folded chain (cudnn_fused): no kernels of fusetune's to measure apart; the
        # fusetune column is that forward.
        result["impl"] = impl
    elif WORLDS[impl].computes_conv_inside:
        # The convolution runs inside the kernels: no producer output, so no epilogue to time alone.
        # What bounds it is arithmetic: the convolution's FMAs, once per pass that computes it (or,
        # spectral, the products of spectra that stand for it).
        passes = conv_passes(plan, impl)
        kind = compute_units(impl, spec)
        peak = peak_tflops(PEAK_FLOPS_PER_SM_CLOCK[kind])
        result.update(impl=impl, conv_passes=passes, conv_gflop=conv_flops(spec, shape) / 1e9)
        work = spectral_flops(spec, shape) / 1e9 if impl == "spectral" else passes * result["conv_gflop"]
        result["conv_tflops"] = work / result["fusetune_ms"]  # GFLOP per ms = TFLOP/s
        if peak:
            result.update(peak_kind=kind, peak_tflops=peak, peak_fraction=result["conv_tflops"] / peak)
    else:  # cuDNN computes the convolution, the kernels the chain on its output
        result["impl"] = impl
        result["producer_ms"] = median_ms(lambda: fused.produce(x), reps=reps)
        with torch.no_grad():
            y = fused.produce(x)
        result["epilogue_ms"] = median_ms(lambda: fused.epilogue(y, extra=kernel_extra), reps=reps)
        nbytes = epilogue_bytes(spec, plan, shape)
        result.update(epilogue_bytes=nbytes, epilogue_floor_ms=nbytes / (bandwidth * 1e9) * 1e3)
        result["epilogue_floor_fraction"] = result["epilogue_floor_ms"] / result["epilogue_ms"]
        result["kernels"] = kernel_rows(profile_kernels_ms(lambda: fused.epilogue(y, extra=kernel_extra)), plan, shape,
                                        bandwidth)
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
    """One row per result. A cuDNN winner shows its epilogue against the memory floor; a winner with
    the convolution inside the kernels its convolution throughput against the peak of its units (the
    spectral world: its products of spectra)."""
    header = ("config", "shape", "eager", "compile", "max-autotune", "fusetune", "vs eager", "vs m-a", "impl",
              "epilogue", "floor", "of floor", "conv TFLOP/s", "of peak")
    rows = [header]
    for r in results:
        reference = WORLDS.get(r.get("impl", DEFAULT))
        eager = reference is not None and not reference.own_kernels  # eager, inductor, cudnn_fused: none of ours
        direct = not eager and (reference is None or reference.computes_conv_inside)
        rows.append((r["config"], "x".join(map(str, r["shape"])), f"{r['eager_ms']:.3f}",
                     f"{r.get('compile_default_ms', float('nan')):.3f}",
                     f"{r.get('compile_max-autotune-no-cudagraphs_ms', float('nan')):.3f}",
                     f"{r['fusetune_ms']:.3f}", f"{r['speedup_vs_eager']:.2f}x",
                     f"{r.get('speedup_vs_compile_max-autotune-no-cudagraphs', float('nan')):.2f}x",
                     r.get("impl", DEFAULT),
                     "-" if direct or eager else f"{r['epilogue_ms']:.3f}",
                     "-" if direct or eager else f"{r['epilogue_floor_ms']:.3f}",
                     "-" if direct or eager else f"{100 * r['epilogue_floor_fraction']:.0f}%",
                     f"{r['conv_tflops']:.1f} ({_work(r)})" if direct else "-",
                     f"{100 * r['peak_fraction']:.0f}% {r['peak_kind']}" if direct and "peak_fraction" in r else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    gpu = results[0]["gpu"] if results else "?"
    if not results:
        return ""
    text = "\n".join(lines) + f"\n(ms, median; {gpu}; copy bandwidth {results[0]['copy_gbs']:.0f} GB/s)"
    return text + "".join(_kernel_lines(r) for r in results if r.get("kernels"))


def _work(result: dict[str, Any]) -> str:
    """What the throughput counts: the convolution's passes, or the products of spectra."""
    return "spectra" if result["impl"] == "spectral" else f"{result['conv_passes']} pass"


def _kernel_lines(result: dict[str, Any]) -> str:
    """The epilogue's kernels one by one (torch.profiler, per forward): time, bytes, floor."""
    lines = [f"\n{result['config']} {'x'.join(map(str, result['shape']))}: epilogue kernels (torch.profiler)"]
    for k in result["kernels"]:
        moved = "per-channel values only" if k["bytes"] is None else (
            f"{k['bytes'] / 1e6:.0f} MB, floor {k['floor_ms']:.4f} ms, {100 * k['floor_fraction']:.0f}% of it")
        lines.append(f"  {k['kernel']:<28} {k['ms']:.4f} ms  {moved}")
    return "\n".join(lines)


def _main(paths: list[str]) -> None:
    """Print the table of saved ``fusetune bench --json`` results."""
    import json

    print(table([r for p in paths for r in json.loads(open(p).read())]))


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
