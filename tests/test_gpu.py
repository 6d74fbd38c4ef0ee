"""GPU tests: end to end on the seeds, kernel correctness beyond them, fault injection.

Skipped without a CUDA GPU. Run on the device with: pytest -m gpu tests/test_gpu.py (about an
hour on an H100). In parts: -k "gemm_wide-" (one world), -k conv2d_wide_bneval (one chain), with
FUSETUNE_TEST_CACHE=DIR so that parts run one after another share their builds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.build import build_many  # noqa: E402
from fusetune.codegen import plan_space, render  # noqa: E402
from fusetune.config import load_config, parse_config  # noqa: E402
from fusetune.evaluate import ERROR_RATIO  # noqa: E402
from fusetune.export import export  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.worlds import WORLDS  # noqa: E402
from fusetune.runner import GpuBenchmarker  # noqa: E402
from fusetune.search import Machine, tune_shape  # noqa: E402
from fusetune.space import candidate_key  # noqa: E402
from fusetune.worker import Worker  # noqa: E402

from conftest import REFERENCE_WORLDS, chain_files  # noqa: E402
from export_run import run_export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted((ROOT / "configs").glob("*.yaml"))


def _bench_factory(cache, machine, worker, **kwargs):
    return lambda plan, shape: GpuBenchmarker(plan, shape, cache, machine, worker, echo=print, **kwargs)


@pytest.mark.parametrize("config", SEEDS, ids=lambda p: p.stem)
def test_seed_end_to_end(config, cache, worker, tmp_path):
    """Search every configured shape with a small budget, then export and run the export."""
    spec = load_config(config)
    machine = Machine.detect()
    for shape in spec.shapes:
        result = tune_shape(spec, shape, cache, machine, _bench_factory(cache, machine, worker), trials=3)
        assert result.status == "tuned", result
        assert result.time_ms and result.time_ms > 0
        again = tune_shape(spec, shape, cache, machine, _bench_factory(cache, machine, worker), trials=3)
        assert again.status == "cached" and again.candidate == result.candidate
    # A winner must also run correctly at a shape it was not tuned for (export and deploy use the
    # first shape's winner there): the defaults' 16-byte loads meet planes that are not aligned.
    first = tune_shape(spec, spec.shapes[0], cache, machine, _bench_factory(cache, machine, worker), trials=3)
    plan = make_plan(spec)
    default = plan_space(plan).default()
    other = GpuBenchmarker(plan, spec.shapes[-1], cache, machine, worker, echo=print)
    other.prepare()
    space = plan_space(plan)
    candidates = [first.candidate, default, {**default, "producer.layout": "channels_last"}]
    from fusetune.search import _nearest, shape_facts
    facts = shape_facts(spec, plan, spec.shapes[-1], machine.capability)
    feasible = [c for c in space.all() if not space.violations(c, facts)]
    for impl in set(plan.impl_stages) - {"cudnn"}:
        # The default with the convolution inside, or the feasible candidate nearest to it (ct == C
        # for a direct channel reduction).
        candidates.append(_nearest(space.canonical({**default, "producer.impl": impl}), feasible))
    for candidate in candidates:
        outcome = other.verify(candidate)
        assert outcome["status"] == "ok", (candidate, outcome)
    target = export(spec, list(spec.shapes), cache, tmp_path, machine.gpu)
    record = json.loads((target / "winner.json").read_text())
    assert [s["input_shape"] for s in record["shapes"]] == [list(s) for s in spec.shapes]
    got = run_export(target, spec.shapes[-1], {**os.environ, "FUSETUNE_BUILD_DIR": str(target / "build")})
    assert got["error"] < 1e-2, got
    assert got["float64"] is not None and "float32" in got["float64"], got  # float64 input is refused


#: Chains beyond the seeds (tests/gpu_chains/, each file's header says what it covers and why): other ops, kernel
#: sizes, strides, odd sizes, 2-D and 3-D, and chains written for each world's kernels (direct, spectral, gemm,
#: gemm_extrema, gemm_cluster, gemm_wide, wide_main), logsumexp, softmax and log_softmax over channels.
EXTRA = chain_files("gpu_chains")
SPECS = {name: load_config(path) for name, path in EXTRA.items()}
IMPLS = [impl for impl, world in WORLDS.items() if not world.runs_reference]  # every world with kernels of its own (or cuDNN's)
#: (impl, chain) for every chain whose plan offers the impl: one test each, so a run can take a part
#: of them (-k), and a failure names its chain.
OFFERED = [(impl, name) for impl in IMPLS for name, spec in SPECS.items() if impl in make_plan(spec).impl_stages]


def test_every_world_has_chains_beyond_the_seeds():
    assert {impl for impl, _ in OFFERED} == set(IMPLS)
    # the chains written for a world still reach it (a plan that stopped offering it drops the test)
    assert {("gemm_wide", name) for name in EXTRA if "_wide_" in name} <= set(OFFERED)
    assert {("gemm_wide_recompute", name) for name in ("conv3d_wide_bn_relu_map", "conv3d_wide_bn_maxpool_gap",
            "convt3d_wide_stride1_groupnorm_maxpool_clamp", "convt3d_wide_mixed_strides_instancenorm_maxpool")} <= set(OFFERED)


def _covering(space, facts, impl: str | None = None) -> list:
    """Feasible candidates that between them run every compiled variant and every run-time choice
    of every stage that can run here, in each world the plan offers or in ``impl``'s alone (greedy:
    the sum of the stages' spaces, not their product)."""
    covered, out = set(), []
    for candidate in space.all({"producer.impl": impl} if impl else None):
        if space.violations(candidate, facts):
            continue
        # Keyed by world: a stage shared by two worlds may run other code in each (gemm_stats also
        # writes extremes for gemm_extrema, the convolution output for gemm_store).
        world = candidate.get("producer.impl", "cudnn")
        parts = {(world, f.family, p.name, candidate[f"{f.family}.{p.name}"]) for f in space.active(candidate)
                 for p in f.params if not p.compile_time}
        parts |= {(world, f.family, repr(sorted((p.name, candidate[f"{f.family}.{p.name}"]) for p in f.compile_params)))
                  for f in space.active(candidate)}
        if not parts <= covered:
            covered |= parts
            out.append(candidate)
    return out


def _tf32_refused_where_eager_is_exact(candidate, outcome) -> bool:
    """Verification bounds a candidate's error by a multiple of eager PyTorch's own. At some shapes
    cuDNN picks a convolution without TF32; the tensor-core kernels, TF32 by design, are then rightly
    refused there, which is not a fault of the kernels so long as their error is TF32's: within the
    same multiple of what eager's error would be on input and weights rounded to TF32."""
    return (candidate["producer.impl"].startswith("gemm") and outcome["status"] == "wrong_result"
            and outcome.get("eager_error_rel", 1.0) < outcome.get("tf32_error_rel", 0.0) / 2
            and outcome["error_rel"] <= ERROR_RATIO * outcome["tf32_error_rel"]
            and outcome["error_max"] <= ERROR_RATIO * outcome["tf32_error_max"])


@pytest.mark.parametrize("impl,name", OFFERED, ids=[f"{impl}-{name}" for impl, name in OFFERED])
def test_families_beyond_the_seeds(impl, name, cache, worker):
    """Every compiled variant of every stage of a world verifies on a chain and shape the seeds do not
    cover (the module is built once for all its worlds: the cache is the test module's)."""
    machine = Machine.detect()
    spec = SPECS[name]
    plan = make_plan(spec)
    (built,) = build_many([render(plan)], cache, arch=machine.capability)
    assert built.ok, built.log
    bench = GpuBenchmarker(plan, spec.shapes[0], cache, machine, worker, echo=print)
    bench.prepare()
    space = plan_space(plan)
    from fusetune.search import shape_facts
    facts = shape_facts(spec, plan, spec.shapes[0], machine.capability)
    failures, verified, refused, refusal = [], 0, 0, ""
    started, in_worker = time.perf_counter(), 0.0
    for candidate in _covering(space, facts, impl):
        outcome = bench.verify(candidate)
        verified += 1
        in_worker += outcome.get("verify_s", 0.0)
        if _tf32_refused_where_eager_is_exact(candidate, outcome):
            refused += 1
            refusal = (f"eager's own error here is {outcome['eager_error_rel']:.1e} (no TF32), one kernel's "
                       f"{outcome['error_rel']:.1e}, eager's on TF32-rounded operands {outcome['tf32_error_rel']:.1e}")
        elif outcome["status"] != "ok":
            failures.append((candidate_key(candidate), outcome))
    # Where a test's time goes: the kernels' runs and comparisons in the worker, or around them.
    print(name, plan.describe(), verified, f"{impl} variants verified in {time.perf_counter() - started:.1f} s, "
          f"{in_worker:.1f} s of it verifying in the worker")
    if refused:
        print(f"  {name}: {refused} TF32 candidates refused, as they should be: {refusal}")
    assert verified > 0, (name, impl)
    assert not failures, failures[:5]


@pytest.mark.parametrize("impl", [name for name, world in WORLDS.items() if world.computes_conv_inside])
@pytest.mark.parametrize("config", SEEDS, ids=lambda p: p.stem)
def test_inside_kernels_at_seed_shapes(config, impl, cache, worker):
    """Every variant with the convolution inside the kernels (on CUDA cores: direct; on tensor cores:
    gemm) verifies at the seed's own (large) shape; prints its time beside cuDNN's."""
    spec = load_config(config)
    plan = make_plan(spec)
    if impl not in plan.impl_stages:
        pytest.skip(f"{spec.name}: the plan offers no {impl} kernels")
    machine = Machine.detect()
    from fusetune.search import shape_facts
    shape = spec.shapes[0]
    space = plan_space(plan)
    bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
    bench.prepare()
    inside = _covering(space, shape_facts(spec, plan, shape, machine.capability), impl)
    if not inside and impl == "gemm_cluster":  # offered by the plan, but a sample's output is too large here
        pytest.skip(f"{spec.name}: a sample's output at {shape} does not fit a cluster's shared memory")
    assert inside
    failures, times = [], {}
    for candidate in inside:
        outcome = bench.evaluate(candidate)
        if outcome["status"] != "ok":
            failures.append((candidate_key(candidate), outcome))
        else:
            times[candidate_key(candidate)] = outcome["time_ms"]
    cudnn = bench.evaluate(space.default())
    best = min(times.items(), key=lambda kv: kv[1]) if times else None
    print(f"{spec.name} {shape}: {len(inside)} {impl} variants, best {best}; cuDNN default {cudnn.get('time_ms')}")
    assert not failures, failures[:3]


def test_fault_injection(cache, monkeypatch):
    """Bad variants (out of bounds, endless loop, no compile, wrong values, bad launch) cost only themselves."""
    monkeypatch.setenv("FUSETUNE_TEMPLATE_PATH", str(ROOT / "tests" / "fault_templates"))
    spec = parse_config({"name": "fault_injection",
                         "producer": {"op": "conv3d", "in_channels": 3, "out_channels": 5, "kernel_size": 3},
                         "epilogue": [{"op": "mul", "by": 0.5}, {"op": "relu"}],
                         "shapes": [[2, 3, 9, 11, 13]]}, "<fault>")
    # The worlds that compute the convolution inside refuse a main family they do not implement: cuDNN's alone.
    plan = dataclasses.replace(make_plan(spec), family="fault_map")
    assert set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}
    machine = Machine.detect()
    with Worker() as worker:
        result = tune_shape(spec, spec.shapes[0], cache, machine,
                            _bench_factory(cache, machine, worker, job_timeout=20), trials=12, plan=plan)
        restarts = worker.restarts
    entry = cache.load(result.key)
    by_fault = {o["candidate"]["fault_map.fault"]: o["status"] for o in entry.outcomes.values()}
    print("outcomes:", by_fault, "worker restarts:", restarts)
    logs = {o["candidate"]["fault_map.fault"]: o.get("log", "")[-3000:] for o in entry.outcomes.values()}
    for fault, log in logs.items():
        print(f"--- {fault}: {log}")
    assert by_fault == {"none": "ok", "oob_write": "crash", "spin": "timeout", "compile_error": "compile_error",
                        "wrong_value": "wrong_result", "launch_error": "launch_error"}, logs
    assert result.status == "tuned" and result.candidate["fault_map.fault"] == "none"
    assert restarts >= 2  # the crash and the hang each cost one worker


def test_bench_profiles_each_epilogue_kernel(cache):
    """`fusetune bench` reports the epilogue's kernels one by one: the profiler sees the statistics
    and finalize kernels of a batch-norm chain under their names, each with its time per forward."""
    from fusetune.bench import kernel_rows, profile_kernels_ms
    from fusetune.build import build_and_load

    spec = load_config(ROOT / "configs" / "convt3d_scale_batchnorm_gap.yaml")
    shape = tuple(spec.shapes[-1])
    generated = build_and_load(render(make_plan(spec)), cache, Machine.detect().capability)
    fused = generated.ModelNew().cuda()
    x = torch.rand(shape, device="cuda")
    with torch.no_grad():
        y = fused.produce(x)
    times = profile_kernels_ms(lambda: fused.epilogue(y), reps=5)
    assert set(times) == {"ft_stats_kernel", "ft_finalize_kernel"}, times
    assert all(0 < ms < 10 for ms in times.values())
    rows = kernel_rows(times, make_plan(spec), shape, bandwidth_gbs=1000.0)
    assert {r["kernel"]: r["bytes"] is None for r in rows} == {"ft_stats_kernel": False, "ft_finalize_kernel": True}


def test_a_shape_beyond_a_kernels_shared_memory_is_refused_by_name(cache, caplog):
    """A launcher that cannot take a shape says why (FT_TOO_BIG, described by the binding), not
    "invalid argument": spectral_stats' weights kernel holds its twiddle tables and one row of its
    second stage in 48 KB, which an output 1406 wide with 7 x 7 taps a plane exceeds (the tables and
    first stage alone take 49.6 KB; at 1206 wide one row still fits, and the shape runs). The model's
    forward then runs the cuDNN world's default kernels instead (nothing ran before the refusal), and says
    so in its log, once."""
    import logging

    from fusetune.build import build_and_load

    spec = parse_config({"name": "wide_spectral", "producer": {"op": "conv_transpose3d", "in_channels": 1,
                                                               "out_channels": 2, "kernel_size": [1, 7, 7]},
                         "epilogue": [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
                         "shapes": [[2, 1, 1, 2, 1400]]}, "<wide_spectral>")
    plan = make_plan(spec)
    assert ("spectral" in plan.impl_stages)
    generated = build_and_load(render(plan), cache, Machine.detect().capability)
    fused = generated.ModelNew(variant={"producer": {"impl": "spectral"}}).cuda()
    x = torch.rand(spec.shapes[0], device="cuda")
    reference = generated.Model().cuda()
    reference.load_state_dict(fused.state_dict())
    caplog.set_level(logging.WARNING)
    out, expected = fused(x), reference(x)
    torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)  # cuDNN's convolution in both
    assert fused._refusals[tuple(x.shape)]["impl"] == "cudnn"
    said = [r.getMessage() for r in caplog.records if r.name == f"fusetune.generated.{generated.MODULE_NAME}"]
    assert len(said) == 1 and "more shared memory" in said[0] and "the cudnn world" in said[0], said


@pytest.mark.parametrize("impl", ["cudnn", "gemm"])
def test_the_output_has_the_inputs_memory_layout_whatever_the_variant_runs_in(impl, cache):
    """eager PyTorch's output follows its input's layout; so does ModelNew's, whether the variant convolves in
    channels last or not: a contiguous input gives a contiguous output (a .view() after it works, the next
    layer reads what it expects), a channels-last input a channels-last output, the values the same."""
    from fusetune.build import build_and_load

    spec = load_config(ROOT / "configs" / "conv2d_groupnorm_scale_maxpool_clamp.yaml")
    generated = build_and_load(render(make_plan(spec)), cache, Machine.detect().capability)
    variant = {"producer": {"impl": impl, "layout": "channels_last" if impl == "cudnn" else "contiguous"}}
    model = generated.ModelNew(variant=variant).cuda().eval()
    x = torch.randn(3, spec.shapes[0][1], 37, 29, device="cuda")
    with torch.no_grad():
        flat, last = model(x), model(x.contiguous(memory_format=torch.channels_last))
    assert flat.is_contiguous() and flat.view(-1).numel() == flat.numel()
    assert last.is_contiguous(memory_format=torch.channels_last) and not last.is_contiguous()
    assert torch.allclose(flat, last, rtol=1e-4, atol=1e-4)
