"""GPU tests of dtype and precision (issue 24) on the seeds' variants in benchmarks/half/: float16 and
bfloat16 (the cuDNN world's kernels at the dtype verify against float64 within 8x eager PyTorch's own
error at that dtype, in both layouts and every vector width; so do fusetune's convolution worlds, the
tensor-core ones included, each way their kernels stage the input; a search with a small budget tunes), and
float32 with precision ieee (a search tunes, and the winner is allclose(1e-4, 1e-4) to eager float32 on fresh
inputs; the tensor-core worlds, in split TF32, verify each way they are compiled); the K-tiled tensor-core
worlds on FP16/BF16 MMAs and in split TF32 on chains of tests/wide_numerics/; and `fusetune bench` at the dtype.

Skipped without a CUDA GPU: pytest -m gpu tests/test_gpu_precision.py (FUSETUNE_TEST_CACHE=DIR shares
builds with tests/test_gpu.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.build import build_and_load  # noqa: E402
from fusetune.codegen import plan_space, render  # noqa: E402
from fusetune.config import load_config  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.runner import GpuBenchmarker  # noqa: E402
from fusetune.search import Machine, _nearest, shape_facts, tune_shape  # noqa: E402
from fusetune.worlds import WORLDS  # noqa: E402

HALF_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "half"
HALF = sorted(HALF_DIR.glob("*_fp16.yaml")) + sorted(HALF_DIR.glob("*_bf16.yaml"))
IEEE = sorted(HALF_DIR.glob("*_ieee.yaml"))
#: The worlds refused under precision ieee (a tensor-core world with no split-TF32 form): none now.
IEEE_REFUSED = {name for name, world in WORLDS.items() if "ieee" not in world.precisions}


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
    assert "cudnn" in plan.impl_stages and all(spec.dtype in WORLDS[name].dtypes for name in plan.impl_stages)
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
    """No world refused under ieee is offered; a small search tunes (verification enforcing the config's
    allclose); the winner, on fresh inputs, is allclose(1e-4, 1e-4) to eager float32 (TF32 off, as
    PRECISION asks), and leaves torch's TF32 switch as it found it."""
    spec = load_config(config)
    plan = make_plan(spec)
    assert not IEEE_REFUSED & set(plan.impl_stages)
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
    owner, name, _off = generated._conv_tf32_switch()
    before = getattr(owner, name)
    for _ in range(3):
        x = torch.rand(shape, device="cuda")
        with torch.no_grad():
            got, want = fused(x), reference(x)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (winner["candidate"], (got - want).abs().max().item())
    assert getattr(owner, name) == before


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


#: The half seeds whose convolution fusetune's own kernels compute at the dtype: the direct world where the
#: weights fit in constant memory (x and the output in the dtype, the weights widened to float in constant
#: memory), after group norm (direct_stats, a map), instance norm (a reduction over channels) and a max pool
#: (a spatial mean); and the spectral world, where batch norm's statistics are the whole output (x and the
#: weights widened to float32 for the spectra).
HALF_WORLDS = [(config, "direct") for config in HALF if config.stem.startswith(
    ("convt3d_scale_maxpool_gap_clamp", "conv2d_groupnorm_scale_maxpool_clamp", "conv3d_mul_instancenorm_clamp_mul_max"))]
HALF_WORLDS += [(config, "spectral") for config in HALF if config.stem.startswith("convt3d_scale_batchnorm_gap")]
#: The tensor-core worlds whose kernels take the half types, and the half seeds' pairs of them: the
#: whole-weights kernels on FP16/BF16 MMAs (m16n8k16, float accumulation) as gemm, gemm_store and gemm_cluster
#: for the conv2d and conv3d seeds, and gemm_extrema after the conv2d seed's max pool; the K-tiled kernels
#: (x and the weights kept in the dtype in their workspace, FP16/BF16 MMAs) as gemm_wide for the batch norm seed.
TENSOR_CORE_HALF = {name for name, world in WORLDS.items() if world.tf32 and "float16" in world.dtypes}
GEMM_HALF_WORLDS = [(config, world) for config in HALF for world in make_plan(load_config(config)).impl_stages
                    if world in TENSOR_CORE_HALF]
HALF_WORLDS += GEMM_HALF_WORLDS


def _world_candidates(space, facts, world: str) -> list[dict]:
    """The world's default, and each value of each compile-time parameter of its stages, feasible ones
    nearest to that."""
    feasible = [c for c in space.all({"producer.impl": world}) if not space.violations(c, facts)]
    default = space.canonical({**space.default(), "producer.impl": world})
    wanted = [default] + [{**default, f"{family.family}.{p.name}": v} for family in space.active(default)
                          if family.family != "producer" for p in family.compile_params for v in p.choices]
    found = [_nearest(space.canonical(c), feasible) for c in wanted]
    unique = {repr(sorted(c.items())): c for c in found if c is not None}
    return list(unique.values())


@pytest.mark.parametrize(("config", "world"), HALF_WORLDS, ids=lambda v: getattr(v, "stem", v))
def test_half_seed_verifies_in_fusetunes_convolution_worlds(config, world, cache, worker):
    """The world at the dtype, at both configured shapes (the seed's and one no tile divides; for direct, the
    seed's rows of even length it reads in pairs, the other's odd rows one value at a time): its default and
    each value of each of its stages' compile-time parameters verify against float64 within 8x eager's error
    at the dtype."""
    spec = load_config(config)
    plan = make_plan(spec)
    assert world in plan.impl_stages
    machine = Machine.detect()
    space = plan_space(plan)
    if world == "direct":
        assert spec.shapes[0][-1] % 2 == 0 and spec.shapes[-1][-1] % 2 == 1  # pairs, then one at a time
    verified = 0
    for shape in spec.shapes:
        candidates = _world_candidates(space, shape_facts(spec, plan, shape, machine.capability), world)
        if not candidates:  # the world does not take this shape (gemm_cluster: a plane too large for a cluster)
            continue
        assert len(candidates) >= 3, candidates
        bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
        bench.prepare()
        verified += 1
        for candidate in candidates:
            outcome = bench.verify(candidate)
            assert outcome["status"] == "ok", (shape, candidate, outcome)
            assert outcome["eager_error_rel"] > 1e-5  # eager's error is half precision's, not float32's
    assert verified, f"{world} takes none of {spec.path}'s shapes"


@pytest.mark.parametrize("config", [c for c, world in HALF_WORLDS if world == "direct" and c.stem.startswith("convt3d")],
                         ids=lambda p: p.stem)
def test_half_direct_world_reads_a_misaligned_input_one_value_at_a_time(config, cache):
    """An input 2 bytes past a 4-byte boundary (a contiguous view one element into its storage), at the seed
    shape whose rows the direct kernels would read in pairs: they read it one value at a time, and verify
    against float64 as the aligned input does, with one window a thread and with several."""
    from fusetune.build import build
    from fusetune.evaluate import Session

    spec = load_config(config)
    plan = make_plan(spec)
    space = plan_space(plan)
    machine = Machine.detect()
    built = build(render(plan), cache, arch=machine.capability)
    assert built.ok, built.log[-3000:]
    session = Session(str(built.module_dir), str(built.build_dir), tuple(spec.shapes[0]), seed=0,
                      arch=machine.capability)
    storage = torch.empty(session.x.numel() + 1, device="cuda", dtype=session.x.dtype)
    storage[1:].copy_(session.x.reshape(-1))
    session.x = storage[1:].view(session.x.shape)
    assert session.x.is_contiguous() and session.x.data_ptr() % 4 == 2
    facts = shape_facts(spec, plan, tuple(spec.shapes[0]), machine.capability)
    for cells in (1, 2):
        candidate = space.canonical({**space.default(), "producer.impl": "direct", "direct_main.cells": cells})
        assert not space.violations(candidate, facts), candidate
        outcome = session.verify(space.stage_values(candidate))
        assert outcome["status"] == "ok", (candidate, outcome)


def _gemm_staging_shapes(shape: tuple) -> dict[str, tuple]:
    """Shapes beside the configured ones at which the tensor-core kernels stage the input at half precision
    each way (gemm.cuh.j2's ft_gemm_prefetch_input): rows of an even width that is not a multiple of 8 are
    copied in 4-byte pairs; rows of a multiple of 8, 16 bytes at a time (the seed shapes; the odd shapes:
    one value at a time)."""
    width = shape[-1] // 8 * 8
    small = (2, *shape[1:-1])
    return {"pairs": (*small, width + 6), "eights": (*small, width + 8)}


@pytest.mark.parametrize("config", sorted({config for config, world in GEMM_HALF_WORLDS if world == "gemm"}),
                         ids=lambda p: p.stem)
def test_half_gemm_worlds_stage_pairs_eights_and_misaligned_inputs(config, cache):
    """Each tensor-core world's default at the dtype verifies against float64 within 8x eager's error where its
    kernels stage the input in 4-byte pairs (an even width not a multiple of 8), where an input 16-byte aligned
    rows would take 16 bytes at a time is only 4-byte aligned (2 values into its storage: pairs), and where it
    is only 2-byte aligned (1 value into its storage: one value at a time)."""
    from fusetune.build import build
    from fusetune.evaluate import Session

    spec = load_config(config)
    plan = make_plan(spec)
    worlds = [world for world in plan.impl_stages if world in TENSOR_CORE_HALF]
    assert {"gemm", "gemm_store", "gemm_cluster"} <= set(worlds), worlds
    space = plan_space(plan)
    machine = Machine.detect()
    built = build(render(plan), cache, arch=machine.capability)
    assert built.ok, built.log[-3000:]
    shapes = _gemm_staging_shapes(tuple(spec.shapes[-1]))
    for case, shape, offset in (("pairs", shapes["pairs"], 0), ("4-byte aligned", shapes["eights"], 2),
                                ("2-byte aligned", shapes["eights"], 1)):
        session = Session(str(built.module_dir), str(built.build_dir), shape, seed=0, arch=machine.capability)
        if offset:
            storage = torch.empty(session.x.numel() + offset, device="cuda", dtype=session.x.dtype)
            storage[offset:].copy_(session.x.reshape(-1))
            session.x = storage[offset:].view(session.x.shape)
            assert session.x.is_contiguous() and session.x.data_ptr() % 16 == 2 * offset
        facts = shape_facts(spec, plan, shape, machine.capability)
        feasible = [c for c in space.all() if not space.violations(c, facts)]
        for world in worlds:  # its default, or the feasible candidate nearest to it (a main kernel's vector loads)
            candidate = _nearest(space.canonical({**space.default(), "producer.impl": world}), feasible)
            assert candidate is not None, (case, world)
            outcome = session.verify(space.stage_values(candidate))
            assert outcome["status"] == "ok", (case, shape, world, outcome)
            assert outcome["eager_error_rel"] > 1e-5  # half precision's error, not float32's


#: Chains of the corpus (tests/chains/) whose convolution fusetune's tensor-core kernels take at a half type
#: (float16 and bfloat16 in turn): at 2 bytes the whole-weights kernels fit the 64-channel ones (1-D, a padded
#: 2-D convolution under a max pool, a 3-D one before eval-mode batch norm and a spatial mean); the K-tiled ones
#: take the rest (wide_main alone over a transposed convolution's classes, after wide_stats and a norm, strided).
HALF_CORPUS = ("conv1d_wide64_instancenorm_softplus_amax_keepdim", "conv2d_wide64_gelu_maxpool",
               "conv3d_wide64_scale_batchnorm_eval_tanh_gap_squeeze", "conv3d_wide72_batchnorm_selu_maxpool",
               "convt2d_wide96_outpad_hardswish_amax_channels", "conv2d_wide96_strided_batchnorm_hardtanh_mean_keepdim",
               "convt3d_wide64_stride1_groupnorm_relu_adaptiveavgpool_grid")


@pytest.mark.parametrize("index", range(len(HALF_CORPUS)), ids=lambda i: HALF_CORPUS[i])
def test_half_tensor_core_worlds_verify_on_the_corpus(index, cache, worker):
    """Each tensor-core world the chain takes at the half type (gemm and its kin, gemm_wide and gemm_wide_recompute,
    all on FP16/BF16 MMAs of x and the weights as they are): the
    feasible candidate nearest its default verifies against float64 within 8x eager's error at the dtype, at
    every configured shape of the chain (none of which a tile divides)."""
    import yaml

    from fusetune.config import parse_config

    path = Path(__file__).resolve().parent / "chains" / f"{HALF_CORPUS[index]}.yaml"
    raw = {**yaml.safe_load(path.read_text()), "dtype": ("float16", "bfloat16")[index % 2]}
    spec = parse_config(raw, str(path))
    plan = make_plan(spec)
    worlds = [world for world in plan.impl_stages if world in TENSOR_CORE_HALF]
    assert worlds, plan.impl_stages
    machine = Machine.detect()
    space = plan_space(plan)
    for shape in spec.shapes:
        bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
        bench.prepare()
        facts = shape_facts(spec, plan, shape, machine.capability)
        for world in worlds:
            feasible = [c for c in space.all({"producer.impl": world}) if not space.violations(c, facts)]
            candidate = _nearest(space.canonical({**space.default(), "producer.impl": world}), feasible)
            assert candidate is not None, (shape, world)
            outcome = bench.verify(candidate)
            assert outcome["status"] == "ok", (shape, world, candidate, outcome)
            assert outcome["eager_error_rel"] > 1e-5


#: The ieee seeds' tensor-core worlds: the whole-weights kernels (gemm, gemm_extrema, gemm_store, gemm_cluster)
#: and the K-tiled ones (gemm_wide at the batch norm seed) multiplying in split TF32, three TF32 MMAs a product
#: (templates/mma.cuh.j2's ft_mma_split).
IEEE_TENSOR_CORE_WORLDS = [(config, world) for config in IEEE for world in make_plan(load_config(config)).impl_stages
                           if WORLDS[world].tf32]


@pytest.mark.parametrize(("config", "world"), IEEE_TENSOR_CORE_WORLDS, ids=lambda v: getattr(v, "stem", v))
def test_ieee_tensor_core_worlds_verify_in_split_tf32(config, world, cache, worker):
    """precision ieee, at both configured shapes (the seed's and one no tile divides): the world's default and
    each value of each of its stages' compile-time parameters verify against float64 within 8x eager float32's
    error (TF32 off) and are allclose(1e-4, 1e-4) to eager float32 (the config's tolerance, which verification
    enforces); their error is a small part of TF32's (products rounded to TF32, not split, would be at it)."""
    spec = load_config(config)
    plan = make_plan(spec)
    assert spec.precision == "ieee" and (spec.tolerance.atol, spec.tolerance.rtol) == (1e-4, 1e-4)
    assert world in plan.impl_stages
    machine = Machine.detect()
    space = plan_space(plan)
    verified = 0
    for shape in spec.shapes:
        candidates = _world_candidates(space, shape_facts(spec, plan, shape, machine.capability), world)
        if not candidates:  # the world does not take this shape (gemm_cluster: a plane too large for a cluster)
            continue
        bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
        bench.prepare()
        verified += 1
        for candidate in candidates:
            outcome = bench.verify(candidate)
            assert outcome["status"] == "ok", (shape, candidate, outcome)
            assert "eager_diff_max" in outcome  # verification checked allclose(1e-4, 1e-4) to eager float32
            assert outcome["error_rel"] < 0.1 * outcome["tf32_error_rel"], (shape, candidate, outcome)
    assert verified, f"{world} takes none of {spec.path}'s shapes"


#: Chains for the K-tiled worlds' numerics (tests/wide_numerics/): odd counts of input channels (at a half dtype
#: the last channel pair of the padded input and the packed weights is half padding), more output channels than
#: the whole-weights kernels take, a strided transposed convolution whose output classes fold into the pool's
#: windows; gemm_wide (wide_stats storing the convolution, then a main kernel) and gemm_wide_recompute (wide_stats,
#: then wide_main with the whole chain, pooled) each.
WIDE_CHAINS = sorted((Path(__file__).resolve().parent / "wide_numerics").glob("*.yaml"))
#: What each numerics adds to a chain's config: the half dtypes; float32 with precision ieee and the ieee seeds'
#: tolerance (verification enforces allclose(1e-4, 1e-4) to eager float32).
WIDE_NUMERICS = {"float16": {"dtype": "float16"}, "bfloat16": {"dtype": "bfloat16"},
                 "ieee": {"precision": "ieee", "tolerance": {"atol": 1e-4, "rtol": 1e-4}}}
K_TILED = ("gemm_wide", "gemm_wide_recompute")


@pytest.mark.parametrize("numerics", list(WIDE_NUMERICS))
@pytest.mark.parametrize("chain", WIDE_CHAINS, ids=lambda p: p.stem)
def test_k_tiled_worlds_verify_at_half_and_in_split_tf32(chain, numerics, cache, worker):
    """Each K-tiled world the chain takes, forced (producer.impl), at both configured shapes (none of which a tile
    divides): its default and each value of each of its stages' compile-time parameters verify against float64
    within 8x eager's error at the numerics. At a half dtype (FP16/BF16 MMAs) eager's error is half precision's;
    under ieee (split TF32) the output is also allclose(1e-4, 1e-4) to eager float32 (TF32 off), and its error a
    small part of TF32's (products rounded to TF32, not split, would be at it)."""
    import yaml

    from fusetune.config import parse_config

    spec = parse_config({**yaml.safe_load(chain.read_text()), **WIDE_NUMERICS[numerics]}, str(chain))
    plan = make_plan(spec)
    worlds = [world for world in K_TILED if world in plan.impl_stages]
    assert worlds == list(K_TILED), plan.impl_stages  # both: the chains are chosen so
    machine = Machine.detect()
    space = plan_space(plan)
    for shape in spec.shapes:
        bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
        bench.prepare()
        facts = shape_facts(spec, plan, shape, machine.capability)
        for world in worlds:
            candidates = _world_candidates(space, facts, world)
            assert len(candidates) >= 3, (shape, world, candidates)
            for candidate in candidates:
                assert candidate["producer.impl"] == world
                outcome = bench.verify(candidate)
                assert outcome["status"] == "ok", (shape, candidate, outcome)
                if numerics == "ieee":
                    assert "eager_diff_max" in outcome  # verification checked allclose(1e-4, 1e-4) to eager float32
                    assert outcome["error_rel"] < 0.1 * outcome["tf32_error_rel"], (shape, candidate, outcome)
                else:
                    assert outcome["eager_error_rel"] > 1e-5  # eager's error is half precision's, not float32's
