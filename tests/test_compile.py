"""The rendered kernels (one .cu per stage) of every seed (and of chains the seeds do not cover) compiles for sm_90,
with every compile-time variant of every stage, no register spills, and no torch headers."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
import re
import shutil
import subprocess

import pytest
import yaml

from fusetune.codegen import PER_VARIANT_UNITS, plan_facts, render
from fusetune.config import load_config, parse_config
from fusetune.dtypes import DTYPES
from fusetune.plan import make_plan
from fusetune.worlds.facts import wide_main_refusal
from fusetune.space import load_family

from conftest import ROOT, SEEDS, chain_files

NVCC = shutil.which("nvcc")

#: Chains the seed configs do not cover (tests/compile_chains/, each file's header says what it adds): avg_pool,
#: relu, eval-mode batch norm, sum/mean/min over channels, a 2-D plane_reduce, the K-tiled kernels' statistics pass
#: that also stores the convolution, wide_main's ways to end a chain, logsumexp and log_softmax over channels.
EXTRA = chain_files("compile_chains")
#: What each of them plans to in the cuDNN world: name -> {stages, reduce, pool, norm} (mode or scope, null if none).
EXPECTED_EXTRA = yaml.safe_load((ROOT / "tests" / "compile_expected.yaml").read_text())
#: Chains of the corpus (tests/chains/) compiled whole here: padded pools (window_map after a 1-D
#: convolution's batch norm; plane_reduce after a grouped one) and adaptive pools to a grid, whose windows
#: vary (window_map averaging them in 2-D; plane_reduce after their max in 3-D), which only the kernels that
#: read the convolution's output take; a var over the channels (its four-float accumulator, in
#: channel_reduce and in the kernels that compute the convolution and reduce over the channels). One cheap
#: unit each: adaptive windows under a mish (window_map spilled around its float divisions where the windows'
#: loops were unrolled), dilated pools (window_map's padded ones in 2-D, plane_reduce's in 3-D), and softmax
#: over the channels in float32, after a log and before a sigmoid (channel_softmax's vec 2 and 4 at unroll 4
#: spilled around the softmax's and the sigmoid's float divisions), and silu before a std and mish before a var over
#: the channels (channel_reduce spilled around their float divisions: elementwise.cuh's ft_div_fast).
CORPUS = ("conv1d_batchnorm_relu_maxpool_padded", "conv2d_grouped_strided_relu_maxpool_gap",
          "conv2d_relu6_adaptiveavgpool_grid_flatten", "conv3d_hardtanh_adaptivemaxpool_grid_mean_keepdim",
          "conv3d_groupnorm_gelu_var_channels_keepdim", "convt2d_dilated_mish_adaptiveavgpool_grid",
          "conv2d_relu_maxpool_dilated_padded_ceil", "conv3d_tanh_maxpool_dilated_mean_spatial",
          "convt2d_softmax_channels_bias_scale_sigmoid", "conv1d_grouped_abs_log_softmax_channels",
          "conv2d_silu_std_channels", "conv2d_mish_var_channels_uncorrected")
#: Half precision (benchmarks/half/): the cuDNN world's kernels, each main family and norm scope once (window_map
#: after group norm, channel_reduce after instance norm, finalize alone after batch norm, plane_reduce after a
#: pool), both types; the direct world's where the weights fit in constant memory (a map after group norm in
#: float16; a reduction over channels after instance norm, and a transposed convolution's pooled mean, in
#: bfloat16); the spectral world's (batch norm's statistics alone, float16); the tensor-core worlds' on
#: FP16/BF16 MMAs (gemm_stats, gemm_main, gemm_cluster and extrema_map: the conv2d seed in float16, the conv3d
#: seed in bfloat16). Of the stages with a unit per variant (direct, spectral, gemm, wide), the first config
#: of each dtype compiles every variant, the others a sample (_units).
HALF = ("conv2d_groupnorm_scale_maxpool_clamp_fp16", "conv3d_mul_instancenorm_clamp_mul_max_bf16",
        "convt3d_scale_batchnorm_gap_fp16", "convt3d_scale_maxpool_gap_clamp_bf16")
#: Half-precision chains of the corpus (tests/chains/), after HALF so that those keep compiling every variant: a
#: layer norm's per-element affine before a max pool in float16 (direct_main spilled at ct 8 with the plane's size
#: a run-time value; ct 16 is left out by direct_main.yaml's direct_element_values rule); an image's 3 input
#: channels in float16, whose last gemm_main variant packs two taps a half k step (taps 2; HALF's bfloat16 conv3d
#: compiles every packed variant of the three families).
HALF_CORPUS = ("conv2d_layernorm_chw_relu_maxpool_fp16", "conv2d_fp16_cin3_relu_maxpool")
#: Later regions (fusetune/pipeline.py): the cuDNN world's kernels on an earlier region's output, no convolution
#: (a group norm after a max pool, a 3-D reduction over channels of a pooled tensor), by chain and region.
#: And on views of their input (fusetune/views.py): a softmax over a flattened 2-D tensor (channel_softmax on
#: (N, F, 1)), a logsumexp over every dim but the batch's (channel_reduce, its channel count a run-time size), a
#: std over (H, W) (channel_reduce's var accumulator on the channels view).
LATER = {"conv2d_relu6_maxpool_groupnorm_r1": ("conv2d_relu6_maxpool_groupnorm", 1),
         "convt3d_maxpool_maxpool_sum_channels_r1": ("convt3d_maxpool_maxpool_sum_channels", 1),
         "conv1d_elu_dropout_train_p0_max_time_softmax_r2": ("conv1d_elu_dropout_train_p0_max_time_softmax", 2),
         "conv3d_hardsigmoid_max_channels_logsumexp_r1": ("conv3d_hardsigmoid_max_channels_logsumexp", 1),
         "conv2d_instancenorm_affine_gelu_std_spatial_r1": ("conv2d_instancenorm_affine_gelu_std_spatial", 1)}
NAMES = sorted(SEEDS) + sorted(EXTRA) + list(CORPUS) + list(HALF) + list(HALF_CORPUS) + list(LATER)


def _spec(name: str):
    if name in LATER:
        from fusetune.pipeline import later_segments

        chain, index = LATER[name]
        segments = later_segments(make_plan(load_config(ROOT / "tests" / "chains" / f"{chain}.yaml")))
        return next(s.spec for s in segments if s.index == index)
    if name in SEEDS:
        return load_config(SEEDS[name])
    if name in CORPUS or name in HALF_CORPUS:
        return load_config(ROOT / "tests" / "chains" / f"{name}.yaml")
    if name in HALF:
        return load_config(ROOT / "benchmarks" / "half" / f"{name}.yaml")
    return load_config(EXTRA[name])


@pytest.fixture(scope="module")
def rendered():
    return {name: (make_plan(_spec(name)), render(make_plan(_spec(name)))) for name in NAMES}


#: The units of each stage with a unit per variant: every variant the plan compiles, for the first config (in
#: NAMES' order: the seeds first) whose plan has that stage at its dtype; for every later one, the first and
#: the last variant (the smallest and the largest choices, so the most values a thread holds). Between chains a
#: variant's text differs in the chain's device functions and the problem's constants, where the largest
#: choice is the one a heavier chain pushes into spills; so each world's variants compile once, not once per
#: chain (690 units became 312).
def _full_variants(rendered) -> dict[tuple[str, str], str]:
    """(stage, dtype) -> the config that compiles all that stage's variants."""
    owner: dict[tuple[str, str], str] = {}
    for name in NAMES:
        plan = rendered[name][0]
        for stage in (s for s in plan.stages if s in PER_VARIANT_UNITS):
            owner.setdefault((stage, plan.spec.dtype), name)
    return owner


def _units(name: str, plan, module, owner: dict[tuple[str, str], str]) -> dict[str, str]:
    """The units a config compiles here (see _full_variants)."""
    keep = set()
    for stage in (s for s in plan.stages if s in PER_VARIANT_UNITS):
        built = [i for i in range(len(load_family(stage).variants())) if f"{stage}_{i}.cu" in module.cuda_sources]
        if owner[(stage, plan.spec.dtype)] == name:
            keep |= {f"{stage}_{i}.cu" for i in built}
        else:
            keep |= {f"{stage}_{built[0]}.cu", f"{stage}_{built[-1]}.cu"}
    per_variant = re.compile(rf"({'|'.join(PER_VARIANT_UNITS)})_\d+\.cu")
    return {unit: text for unit, text in module.cuda_sources.items() if unit in keep or not per_variant.fullmatch(unit)}


@pytest.fixture(scope="module")
def compiled(rendered, tmp_path_factory, request):
    """Start every nvcc of the selected configs at once (one per translation unit, as many at a time as
    there are cores, up to 8); each test waits for its own. A config whose compile test is deselected
    (``-k``) compiles nothing."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    folder = tmp_path_factory.mktemp("nvcc")
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.originalname == "test_kernels_compile_for_sm90_without_spills"}

    def compile_one(name: str, unit: str, text: str) -> subprocess.CompletedProcess:
        source = folder / f"{name}-{unit}"
        source.write_text(text)
        return subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                               "-c", str(source), "-o", str(source.with_suffix(".o"))],
                              capture_output=True, text=True, timeout=900)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2))
    owner = _full_variants(rendered)
    futures = {name: [pool.submit(compile_one, name, unit, text)
                      for unit, text in _units(name, plan, module, owner).items()]
               for name, (plan, module) in rendered.items() if name in selected}
    yield folder, futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_split_tf32_statistics_that_spill_everywhere_are_not_compiled():
    """gemm_stats in split TF32 (precision ieee) of a 3-D convolution of 24 channels and stride 2 spilled registers
    in every variant its other rules leave (nvcc -Xptxas -v, CUDA 13.0): gemm_stats.yaml's compile_if leaves them all
    out, and the search's constraint says why; at 32 channels of the same convolution they compile (and the
    compile test above holds the ieee variants of the other chains to no spills)."""
    spec = load_config(ROOT / "tests" / "chains" / "conv3d_strided24_instancenorm_relu_ieee.yaml")
    module = render(make_plan(spec))
    assert "gemm_stats.cu" in module.cuda_sources and not any(
        re.fullmatch(r"gemm_stats_\d+\.cu", unit) for unit in module.cuda_sources)
    family = load_family("gemm_stats")
    names = {"C": 24, **plan_facts(make_plan(spec))}
    assert not any(family.compiles(v, names) for v in family.variants())
    wider = make_plan(dataclasses.replace(spec, producer=dataclasses.replace(spec.producer, out_channels=32)))
    assert any(family.compiles(v, {"C": 32, **plan_facts(wider)}) for v in family.variants())


def test_a_per_element_affine_bounds_direct_mains_channel_tile():
    """direct_main with a layer norm's weight and bias per element of (C, H, W) before a 2 x 2 max pool, its cell's
    inputs in registers: ct 8 compiles in float16 (without spills, the compile test above holds it to) and ct 16
    does not (it spilled); in float32, where ptxas held those loads beside the inputs, ct 4 and not ct 8
    (direct_main.yaml's direct_element_values rule)."""
    spec = load_config(ROOT / "tests" / "chains" / "conv2d_layernorm_chw_relu_maxpool_fp16.yaml")
    family = load_family("direct_main")

    def tiles(spec) -> list[int]:
        names = {"C": spec.producer.out_channels, **plan_facts(make_plan(spec))}
        return sorted({v["ct"] for v in family.variants() if family.compiles(v, names)})
    assert plan_facts(make_plan(spec))["direct_element_values"] == 8
    assert tiles(spec) == [2, 4, 8]
    assert tiles(dataclasses.replace(spec, dtype="float32")) == [2, 4]


def test_extra_configs_cover_what_they_claim(rendered):
    corpus = [rendered[name][0] for name in CORPUS]
    assert {plan.family for plan in corpus} == {"window_map", "plane_reduce", "channel_reduce", "channel_softmax"}
    assert all(any(rendered[name][0].pool_padding) for name in CORPUS[:2])
    adaptive = [plan for plan in corpus if plan.pool_output is not None]
    assert {(plan.family, plan.pool.mode) for plan in adaptive} == {("window_map", "avg"), ("plane_reduce", "max")}
    assert any(op.kind == "mish" for plan in adaptive for op in plan.pre)
    dilated = [plan for plan in corpus if plan.pool_dilation != (1, 1, 1)]
    assert {(plan.family, any(plan.pool_padding)) for plan in dilated} == {("window_map", True), ("plane_reduce", False)}
    softmax = [plan for plan in corpus if plan.family == "channel_softmax"]
    assert {plan.spec.dtype for plan in softmax} == {"float32"} and {plan.channel_map.kind for plan in softmax} == {
        "softmax"} and any(op.kind == "sigmoid" for plan in softmax for op in plan.final)
    half = [rendered[name][0] for name in HALF]
    assert {plan.spec.dtype for plan in half} == {"float16", "bfloat16"}
    assert {plan.family for plan in half} == {"window_map", "channel_reduce", "plane_reduce", None}
    assert {plan.norm.scope for plan in half if plan.norm} == {"group", "instance", "batch"}
    assert {plan.spec.dtype for plan in half if "direct" in plan.impl_stages} == {"float16", "bfloat16"}
    assert {(plan.family, plan.spec.producer.transposed) for plan in half if "direct" in plan.impl_stages} == {
        ("window_map", False), ("channel_reduce", False), ("plane_reduce", True)}
    assert any("spectral" in plan.impl_stages for plan in half)
    assert set(EXPECTED_EXTRA) == set(EXTRA), "one entry in compile_expected.yaml for each of compile_chains/"
    for name, want in EXPECTED_EXTRA.items():
        plan = rendered[name][0]
        assert plan.impl_stages["cudnn"] == tuple(want["stages"]), name
        assert (plan.reduce.mode if plan.reduce else None) == want["reduce"], name
        assert (plan.pool.mode if plan.pool else None) == want["pool"], name
        assert (plan.norm.scope if plan.norm else None) == want["norm"], name
    # wide_main in each way a chain ends, with and without a pool: alone, and after group norm (a channel
    # reduction)
    assert {(rendered[name][0].family, rendered[name][0].pool is not None) for name in EXTRA
            if wide_main_refusal(rendered[name][0]) is None} == {("plane_reduce", False), ("window_map", False), ("channel_reduce", False),
                                                ("plane_reduce", True), ("window_map", True)}
    assert "gemm_wide_recompute" in rendered["conv2d_wide_relu_groupnorm_sum_channels"][0].impl_stages
    assert rendered["conv2d_wide_bneval_relu_maxpool"][0].impl_stages["gemm_wide"] == ("finalize", "wide_main")
    kinds = {op.kind for name in EXTRA for op in rendered[name][0].spec.epilogue}
    assert {"avg_pool", "relu", "batch_norm"} <= kinds
    assert rendered["conv2d_bneval_relu_avgpool_gap"][0].spec.producer.spatial_dims == 2


def _launcher(source: str, stage: str) -> str:
    """The text of ``ft_launch_<stage>`` up to the next launcher (or the end)."""
    start = source.index(f'extern "C" int ft_launch_{stage}(')
    following = source.find('extern "C"', start + 1)
    return source[start:following if following != -1 else len(source)]


@pytest.mark.parametrize("name", NAMES)
def test_every_variant_has_a_case_in_its_launcher(rendered, name):
    plan, module = rendered[name]
    source = "\n".join(module.cuda_sources.values())
    for stage in plan.stages:
        body = _launcher(source, stage)
        cases = [int(n) for n in re.findall(r"^\s*case (\d+):", body, re.M)]
        family = load_family(stage)
        if not family.params:  # finalize: one fixed kernel, nothing to choose
            assert cases == [], stage
            continue
        assert cases == list(range(len(family.variants()))), stage
        assert len(family.variants()) > 1
    for stage in ("stats", "finalize", "window_map", "plane_reduce", "channel_reduce", "direct_stats", "direct_main",
                  "gemm_stats", "gemm_main", "extrema_map", "spectral_stats", "wide_stats", "wide_main"):
        assert (f"ft_launch_{stage}(" in source) is (stage in plan.stages), stage
    # A unit per stage; the direct stages' variants have a unit each (compiled in parallel).
    per_stage = {re.sub(r"_\d+\.cu$", ".cu", unit) for unit in module.cuda_sources}
    assert per_stage == {f"{stage}.cu" for stage in plan.stages}
    for stage in PER_VARIANT_UNITS:
        if stage in plan.stages:
            units = [u for u in module.cuda_sources if re.fullmatch(rf"{stage}_\d+\.cu", u)]
            skipped = module.cuda_sources[f"{stage}.cu"].count("not compiled")
            assert units and len(units) + skipped == len(load_family(stage).variants())


@pytest.mark.parametrize("name", NAMES)
def test_kernels_do_not_include_torch(rendered, name):
    source = "\n".join(rendered[name][1].cuda_sources.values())
    includes = re.findall(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", source, re.M)
    assert includes, "expected at least the CUDA runtime header"
    for header in includes:
        assert not header.startswith(("torch/", "ATen/", "c10/", "pybind11/")), header
        assert header != "Python.h"
    assert "at::" not in source and "torch::" not in source


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_kernels_compile_for_sm90_without_spills(rendered, compiled, name):
    folder, futures = compiled
    results = [future.result() for future in futures[name]]
    log = "".join(result.stdout + result.stderr for result in results)
    for result in results:
        assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    # The units link into one library: nothing is defined twice across them (torch's build links them so).
    units = _units(name, *rendered[name], _full_variants(rendered))
    objects = [str(folder / f"{name}-{unit}").replace(".cu", ".o") for unit in units]
    linked = subprocess.run([NVCC, "-arch=sm_90", "-shared", "-o", str(folder / f"{name}.so"), *objects],
                            capture_output=True, text=True, timeout=300)
    assert linked.returncode == 0, linked.stdout + linked.stderr
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", log)
    props = dict(re.findall(r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores", log))
    assert entries, log[-3000:]
    assert set(entries) <= set(props), "ptxas reported no properties for some kernels"
    spilling = {fn: int(n) for fn, n in props.items() if int(n)}
    assert spilling == {}, f"register spills (bytes stored) in {spilling}"
    plan = rendered[name][0]
    for stage in plan.stages:  # every stage's kernels were compiled
        assert any(f"ft_{stage}_" in fn for fn in entries), stage
    searched = [s for s in plan.stages if load_family(s).params]
    # Every variant is compiled, but those the plan's constraints rule out (said so in the launcher).
    skipped = sum(text.count("not compiled") for text in rendered[name][1].cuda_sources.values())
    sampled_out = len(rendered[name][1].cuda_sources) - len(units)  # a sample of the variants (_units)
    assert len(entries) >= sum(len(load_family(s).variants()) for s in searched) - skipped - sampled_out


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_tensor_core_units_compile_for_gpus_without_them(rendered, tmp_path):
    """A module holds every world; on a GPU older than sm_80 (no TF32 mma.sync, no cp.async; no
    clusters before sm_90) its gemm units must still compile, or the whole module fails and every variant is built alone.
    Their device code traps there and their launchers refuse; the search does not offer them."""
    module = rendered["groupnorm"][1]
    units = {u: t for u, t in module.cuda_sources.items() if re.fullmatch(r"gemm_(stats|main|cluster)_\d+\.cu", u)}
    wide = rendered["batchnorm"][1].cuda_sources
    units["wide_stats_0.cu"] = wide["wide_stats_0.cu"]  # the K-tiled kernels' too
    units["wide_main_0.cu"] = rendered["convt3d_wide_stride2_relu_gap"][1].cuda_sources["wide_main_0.cu"]
    assert all(any(u.startswith(f"gemm_{stage}_") for u in units) for stage in ("stats", "main", "cluster"))
    for unit in [sorted(u for u in units if u.startswith(f"gemm_{stage}_"))[0] for stage in ("stats", "main", "cluster")] + [
            "wide_stats_0.cu", "wide_main_0.cu"]:
        source = tmp_path / unit
        source.write_text(units[unit])
        result = subprocess.run([NVCC, "-arch=sm_75", "-O1", "-std=c++17", "-c", str(source), "-o",
                                 str(source.with_suffix(".o"))], capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        assert "ft_arch_at_least(" in units[unit]  # the launcher refuses before launching
        if unit.startswith("gemm_cluster_"):  # clusters need sm_90: refused there too
            assert "ft_arch_at_least(9)" in units[unit]


GXX = shutil.which("g++")
#: Axes (kernel, stride, padding, transposed) whose wide_geometry.h the host compiler checks against tiles.py.
GEOMETRY_AXES = [(5, 1, 0, True), (5, 1, 4, False), (3, 2, 1, True), (4, 2, 1, True), (2, 3, 0, True),
                 (3, 1, 3, True), (7, 3, 2, False), (1, 2, 0, True)]
#: Pooling windows (kernel, stride; d, h, w) of the header test's bricks, at an output as deep as it
#: is high and wide: 2-D ones, and 3-D ones that grow bricks along d.
BRICK_WINDOWS = [((1, 2, 2), (1, 2, 2)), ((1, 3, 3), (1, 2, 2)), ((2, 2, 2), (2, 2, 2)), ((3, 1, 2), (2, 3, 1))]


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_wide_geometry_header_agrees_with_tiles(tmp_path):
    """wide_geometry.h.j2 (what the launcher, the kernels and the binding's workspace size use) and
    tiles.WideAxis (what the constraints and tests use) are the same arithmetic: every class's size,
    offset, taps, padding and first output, the padded extent, the most rows a stage of bm outputs
    stages (a row of taps, a plane), and wide_main's brick of whole pooling windows (tiles.wide_brick),
    at outputs 1 to 60 high and wide, compiled by the host compiler as binding.cpp is."""
    from fusetune.templates import environment
    from fusetune.tiles import wide_axes, wide_brick, wide_slab_stride, wide_staged_rows

    template = environment().get_template("wide_geometry.h.j2")
    parts, convs = ["#include <cstdint>\n#include <cstdio>\n"], []
    for i, (k, s, p, transposed) in enumerate(GEOMETRY_AXES):
        conv = {"kernel": (1, k, k), "stride": (1, s, s), "padding": (0, p, p), "transposed": transposed}
        convs.append(conv)
        header = template.render(wide={"axes": wide_axes(conv), "ck": 16, "cin_pad": 16, "workspace": 0},
                                 dtype=DTYPES["float32"])
        parts.append(f"namespace c{i} {{\n{header}\n}}\n")
    lines = ["int main() {", "  for (int out = 1; out <= 60; ++out) {"]
    for i in range(len(convs)):
        staged = ", ".join(f"(long long)c{i}::ft_wide_staged_rows({bm}, out, out, {plane})"
                           for bm in (128, 256) for plane in ("false", "true"))
        lines += [f'    printf("%d %d %lld %lld %lld %lld %lld", {i}, out, (long long)c{i}::FtWideW::extent(out), {staged});']
        # wide_main's brick of whole pooling windows, at the pooled output of each window
        for (k, s_), bm, staging in itertools.product(BRICK_WINDOWS, (128, 256), ("row", "plane")):
            cs = wide_slab_stride(convs[i], bm, staging)
            pooled = ", ".join(f"(out < {a} ? 0 : (out - {a}) / {b} + 1)" for a, b in zip(k, s_))
            call = (f"c{i}::ft_wide_brick({bm}, {cs}, {'true' if staging == 'plane' else 'false'}, "
                    f"{', '.join(map(str, k))}, {', '.join(map(str, s_))}, {pooled}, c{i}::ft_wide_padded(out, out, out).IWP)")
            lines.append(f'    {{ const c{i}::FtWideBrick b = {call}; printf(" %d %d %d", b.pd, b.ph, b.pw); }}')
        lines += [f"    for (int r = 0; r < c{i}::FtWideW::CLASSES; ++r) {{",
                  f"      const c{i}::FtWideAxis ax = c{i}::FtWideW::of(r, out);",
                  '      printf(" %d %d %d %d %d", ax.size, ax.off, ax.taps, ax.pad, ax.first);', "    }",
                  '    printf("\\n");']
    lines += ["  }", "  return 0;", "}"]
    source = tmp_path / "geometry.cpp"
    source.write_text("".join(parts) + "\n".join(lines) + "\n")
    build = subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror", str(source), "-o", str(tmp_path / "geometry")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    printed = subprocess.run([str(tmp_path / "geometry")], capture_output=True, text=True, check=True).stdout
    rows = 0
    for line in printed.splitlines():
        i, out, extent, *values = map(int, line.split())
        staged, bricks, classes = values[:4], values[4:4 + 12 * len(BRICK_WINDOWS)], values[4 + 12 * len(BRICK_WINDOWS):]
        want = [v for (k, s_), bm, staging in itertools.product(BRICK_WINDOWS, (128, 256), ("row", "plane"))
                for v in wide_brick(convs[i], bm, staging, (k, s_), [max(0, (out - a) // b + 1) for a, b in zip(k, s_)],
                                    out)]
        assert bricks == want, (GEOMETRY_AXES[i], out)
        axis = wide_axes(convs[i])[2]
        assert extent == axis.extent(out), (GEOMETRY_AXES[i], out)
        assert staged == [wide_staged_rows(convs[i], bm, out, out, staging) for bm in (128, 256)
                          for staging in ("row", "plane")], (GEOMETRY_AXES[i], out)
        assert classes == [v for r in range(axis.classes) for v in (axis.size(r, out), axis.offset(r), axis.taps(r),
                                                                      axis.pad(r), axis.first(r))], (GEOMETRY_AXES[i], out)
        rows += 1
    assert rows == 60 * len(GEOMETRY_AXES)


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_wide_classes_among_windows_place_every_output_once(tmp_path):
    """Where wide_main pools after a strided transposed convolution, each class computes its outputs
    among a brick's windows as one box (FtWideAxisOf::among), and the fold finds each window's
    outputs in the boxes (FtWideAxisOf::place). Along every test axis, at outputs 1 to 40 long, for
    every run of 1 to 9 outputs: the classes' counts add up to the run, and each output is exactly one
    class's, at a place within that class's count whose output is that output."""
    from fusetune.templates import environment
    from fusetune.tiles import wide_axes

    template = environment().get_template("wide_geometry.h.j2")
    parts, checks = ["#include <cstdint>\n#include <cstdio>\n"], []
    for i, (k, s, p, transposed) in enumerate(GEOMETRY_AXES):
        conv = {"kernel": (1, k, k), "stride": (1, s, s), "padding": (0, p, p), "transposed": transposed}
        header = template.render(wide={"axes": wide_axes(conv), "ck": 16, "cin_pad": 16, "workspace": 0},
                                 dtype=DTYPES["float32"])
        parts.append(f"namespace c{i} {{\n{header}\n}}\n")
        checks.append(f"""
  for (int out = 1; out <= 40; ++out)
    for (int o0 = 0; o0 < out; ++o0)
      for (int n = 1; n <= 9 && o0 + n <= out; ++n) {{
        using A = c{i}::FtWideW;
        int total = 0, q0[8], count[8];
        for (int r = 0; r < A::CLASSES; ++r) {{
          count[r] = A::among(A::of(r, out), r, o0, n, q0[r]);
          total += count[r];
        }}
        if (total != n) {{ printf("BAD %d %d %d %d total %d\\n", {i}, out, o0, n, total); ++bad; }}
        for (int o = o0; o < o0 + n; ++o) {{
          int owners = 0;
          for (int r = 0; r < A::CLASSES; ++r) {{
            const c{i}::FtWideAxis ax = A::of(r, out);
            const int at = A::place(ax, r, q0[r], o);
            if (at < 0) continue;
            ++owners;
            if (at >= count[r] || A::output(ax, r, q0[r] + at) != o) {{
              printf("BAD %d %d %d %d o %d r %d at %d\\n", {i}, out, o0, n, o, r, at);
              ++bad;
            }}
          }}
          if (owners != 1) {{ printf("BAD %d %d %d %d o %d owners %d\\n", {i}, out, o0, n, o, owners); ++bad; }}
          ++checked;
        }}
      }}""")
    main = "int main() {\n  long bad = 0, checked = 0;" + "".join(checks) + '\n  printf("checked %ld\\n", checked);\n  return bad != 0;\n}\n'
    source = tmp_path / "among.cpp"
    source.write_text("".join(parts) + main)
    build = subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror", str(source), "-o", str(tmp_path / "among")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(tmp_path / "among")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    outputs = sum(n for out in range(1, 41) for o0 in range(out) for n in range(1, min(9, out - o0) + 1))
    assert run.stdout.split()[-1] == str(outputs * len(GEOMETRY_AXES)), run.stdout[-500:]


def test_the_k_tiled_kernels_read_the_convolutions_output_by_producer(tmp_path):
    """An op that reads the convolution's own output (by: producer) in the pre chain: the K-tiled
    kernels' pre chain (ft_wide_pre) holds that value too, so their units compile (one unit, the
    first variant of wide_main, not all of them)."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    raw = {"name": "conv2d_wide_sigmoid_mul_producer_maxpool",
           "producer": {"op": "conv2d", "in_channels": 32, "out_channels": 64, "kernel_size": 3, "padding": 1},
           "epilogue": [{"op": "sigmoid"}, {"op": "mul", "by": "producer"}, {"op": "max_pool", "kernel_size": 2}],
           "shapes": [[2, 32, 11, 13]]}
    plan = make_plan(parse_config(raw, "<wide_producer>"))
    assert bool(plan_facts(plan)["wide_main"]) and plan.pre[-1].uses_producer()
    source = tmp_path / "wide_main_0.cu"
    source.write_text(render(plan).files["wide_main_0.cu"])
    done = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-c", str(source),
                           "-o", str(tmp_path / "wide_main_0.o")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
