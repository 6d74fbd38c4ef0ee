"""GPU tests of dtype and precision (issue 24) on the seeds' variants in benchmarks/half/: float16 and
bfloat16 (the cuDNN world's kernels at the dtype verify against float64 within 8x eager PyTorch's own
error at that dtype, in both layouts and every vector width; a search with a small budget tunes), and
float32 with precision ieee (a search tunes, no TF32 world is offered, and the winner is allclose(1e-4,
1e-4) to eager float32 on fresh inputs); and `fusetune bench` at the dtype.

Skipped without a CUDA GPU: pytest -m gpu tests/test_gpu_precision.py (FUSETUNE_TEST_CACHE=DIR shares
builds with tests/test_gpu.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.build import build_and_load  # noqa: E402
from fusetune.cache import Cache  # noqa: E402
from fusetune.codegen import plan_space, render  # noqa: E402
from fusetune.config import load_config  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.runner import GpuBenchmarker  # noqa: E402
from fusetune.search import Machine, _nearest, shape_facts, tune_shape  # noqa: E402
from fusetune.worker import Worker  # noqa: E402

HALF_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "half"
HALF = sorted(HALF_DIR.glob("*_fp16.yaml")) + sorted(HALF_DIR.glob("*_bf16.yaml"))
IEEE = sorted(HALF_DIR.glob("*_ieee.yaml"))
TF32_WORLDS = {"gemm", "gemm_extrema", "gemm_store", "gemm_cluster", "gemm_wide", "gemm_wide_recompute"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Cache:
    root = tmp_path_factory.mktemp("cache")
    shared = os.environ.get("FUSETUNE_TEST_CACHE")
    if shared:
        for part in ("modules", "builds"):
            (Path(shared) / part).mkdir(parents=True, exist_ok=True)
            (root / part).symlink_to(Path(shared) / part, target_is_directory=True)
    return Cache(root)


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


def _factory(cache, machine, worker):
    return lambda plan, shape: GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)


def _vector_candidates(space, facts, default: dict) -> list[dict]:
    """The default in both layouts, and for every stage parameter named vec each of its widths (the
    kernels' 2- and 8-byte loads of halves, and the scalar fallback), feasible ones nearest to that."""
    feasible = [c for c in space.all() if not space.violations(c, facts)]
    wanted = [default, {**default, "producer.layout": "channels_last"}]
    for family in space.families:
        for p in family.params:
            if p.name == "vec":
                for layout in ("contiguous", "channels_last"):
                    wanted += [{**default, "producer.layout": layout, f"{family.family}.vec": v} for v in p.choices]
    found = [_nearest(space.canonical(c), feasible) for c in wanted]
    unique = {repr(sorted(c.items())): c for c in found if c is not None}
    return list(unique.values())


@pytest.mark.parametrize("config", HALF, ids=lambda p: p.stem)
def test_half_seed_verifies_and_tunes(config, cache, worker):
    """At both configured shapes (the seed's and one no tile divides): every vector width in both layouts
    verifies against float64 within 8x eager's error at the dtype; a small search tunes and caches."""
    spec = load_config(config)
    plan = make_plan(spec)
    assert set(plan.impl_stages) == {"cudnn", "eager"}
    machine = Machine.detect()
    space = plan_space(plan)
    for shape in spec.shapes:
        bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
        bench.prepare()
        facts = shape_facts(spec, plan, shape, machine.capability)
        # ... and the default as it is, vector loads and all, at a shape whose planes they do not fit (the
        # kernels fall back to scalar loads: a winner meets shapes it was not tuned for).
        candidates = _vector_candidates(space, facts, space.default()) + [space.default()]
        assert len(candidates) >= 3
        for candidate in candidates:
            outcome = bench.verify(candidate)
            assert outcome["status"] == "ok", (shape, candidate, outcome)
            assert outcome["eager_error_rel"] > 1e-5  # eager's error is half precision's, not float32's
            assert "tf32_error_rel" not in outcome
    shape = spec.shapes[-1]
    result = tune_shape(spec, shape, cache, machine, _factory(cache, machine, worker), trials=4)
    assert result.status == "tuned" and result.time_ms > 0, result
    again = tune_shape(spec, shape, cache, machine, _factory(cache, machine, worker), trials=4)
    assert again.status == "cached" and again.candidate == result.candidate


@pytest.mark.parametrize("config", IEEE, ids=lambda p: p.stem)
def test_ieee_seed_tunes_and_is_allclose_to_eager_float32(config, cache, worker):
    """No TF32 tensor-core world is offered; a small search tunes (verification enforcing the config's
    allclose); the winner, on fresh inputs, is allclose(1e-4, 1e-4) to eager float32 (TF32 off, as
    PRECISION asks), and leaves torch's TF32 switch as it found it."""
    spec = load_config(config)
    plan = make_plan(spec)
    assert not TF32_WORLDS & set(plan.impl_stages)
    machine = Machine.detect()
    shape = spec.shapes[-1]
    result = tune_shape(spec, shape, cache, machine, _factory(cache, machine, worker), trials=4)
    assert result.status == "tuned", result
    generated = build_and_load(render(plan), cache, machine.capability)
    torch.manual_seed(3)
    reference = generated.Model().cuda()
    winner = cache.load(result.key).winner
    fused = generated.ModelNew(variant=winner["variant"]).cuda()
    fused.load_state_dict(reference.state_dict())
    before = torch.backends.cudnn.allow_tf32
    for _ in range(3):
        x = torch.rand(shape, device="cuda")
        with torch.no_grad():
            got, want = fused(x), reference(x)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (winner["candidate"], (got - want).abs().max().item())
    assert torch.backends.cudnn.allow_tf32 == before


def test_bench_times_every_column_at_the_dtype(cache, worker):
    """`fusetune bench` at float16: eager, torch.compile and the winner all run on float16 input, and the
    result says so."""
    from fusetune.bench import run_bench

    spec = load_config(HALF_DIR / "conv2d_groupnorm_scale_maxpool_clamp_fp16.yaml")
    shape = spec.shapes[-1]
    machine = Machine.detect()
    assert tune_shape(spec, shape, cache, machine, _factory(cache, machine, worker), trials=3).status in (
        "tuned", "cached")
    result = run_bench(spec, shape, cache, reps=5, compile_modes=("default",))
    assert result["dtype"] == "float16" and result["precision"] is None
    assert result["eager_ms"] > 0 and result["compile_default_ms"] > 0 and result["fusetune_ms"] > 0
    assert result["error_rel"] < 8 * result["eager_error_rel"] + 1e-5
