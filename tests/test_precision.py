"""dtype, precision and tolerance without a GPU (issue 24): what a config says, where it goes (the
problem's canonical form and so the cache key, `fusetune plan`, the rendered module), and which worlds
take it. The configs are benchmarks/half/: the four seeds in float16, in bfloat16, and in float32 with
precision ieee and a tolerance."""
from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import DEFAULT_PRECISION, load_config
from fusetune.dtypes import DTYPES
from fusetune.plan import make_plan
from fusetune.tiles import gemm_keeps_b
from fusetune.worlds import WORLDS, refusals

from conftest import ROOT, SEEDS, import_file

HALF = sorted((ROOT / "benchmarks" / "half").glob("*.yaml"))
BY_KIND = {kind: [p for p in HALF if p.stem.endswith(f"_{kind}")] for kind in ("fp16", "bf16", "ieee")}
#: The worlds refused under precision ieee (their products TF32 MMAs with no split-TF32 form): none now.
IEEE_REFUSED = {name for name, world in WORLDS.items() if "ieee" not in world.precisions}
#: The tensor-core worlds that take precision ieee, their products in split TF32 (the whole-weights kernels and
#: the K-tiled ones).
SPLIT_WORLDS = {name for name, world in WORLDS.items() if world.tf32 and "ieee" in world.precisions}
#: The K-tiled tensor-core worlds (wide_stats, wide_main).
WIDE_WORLDS = {"gemm_wide", "gemm_wide_recompute"}
WIDE_UNIT = r"wide_(stats|main)_\d+\.cu"


def test_which_worlds_take_precision_ieee():
    """Every world but the TF32 tensor-core ones multiplies in float32 already; those take ieee in split TF32,
    the whole-weights kernels' worlds and the K-tiled ones alike; a world that did not would say why."""
    assert SPLIT_WORLDS == {"gemm", "gemm_extrema", "gemm_store", "gemm_cluster"} | WIDE_WORLDS
    assert IEEE_REFUSED == set()
    assert all(WORLDS[name].tf32 and WORLDS[name].ieee_refusal.strip() for name in IEEE_REFUSED)
    assert all(set(world.precisions) <= {"tf32", "ieee"} and "tf32" in world.precisions for world in WORLDS.values())


def _seed_of(path: Path) -> Path:
    return ROOT / "configs" / (path.stem.rsplit("_", 1)[0] + ".yaml")


def test_every_seed_has_its_three_variants():
    assert {_seed_of(p) for p in HALF} == set(SEEDS.values())
    assert all(len(paths) == len(SEEDS) for paths in BY_KIND.values())


@pytest.mark.parametrize("path", HALF, ids=lambda p: p.stem)
def test_variant_is_its_seed_but_for_the_numerics(path):
    """Same problem as the seed (producer, parameters, chain, shapes), another dtype or precision:
    another canonical form, so another cache key."""
    spec, seed = load_config(path), load_config(_seed_of(path))
    assert (spec.producer, spec.parameters, spec.epilogue, spec.shapes) == (
        seed.producer, seed.parameters, seed.epilogue, seed.shapes)
    assert spec.numerics() != seed.numerics() and spec.digest() != seed.digest()
    assert {k: v for k, v in spec.canonical().items() if k not in spec.numerics()} == {
        k: v for k, v in seed.canonical().items() if k not in seed.numerics()}


def test_numerics_defaults():
    seed = load_config(SEEDS["groupnorm"])
    assert seed.numerics() == {"dtype": "float32", "precision": DEFAULT_PRECISION, "tolerance": None}
    assert DEFAULT_PRECISION == "tf32"  # eager PyTorch's own default: TF32 allowed in cuDNN convolutions
    for path in BY_KIND["fp16"] + BY_KIND["bf16"]:
        spec = load_config(path)
        assert spec.dtype in ("float16", "bfloat16") and spec.precision is None and spec.tolerance is None
    for path in BY_KIND["ieee"]:
        spec = load_config(path)
        assert spec.numerics() == {"dtype": "float32", "precision": "ieee", "tolerance": {"atol": 1e-4, "rtol": 1e-4}}


@pytest.mark.parametrize("path", HALF, ids=lambda p: p.stem)
def test_worlds_offered_at_the_numerics(path):
    """Half precision: the worlds the seed is offered whose kernels take the dtype (cuDNN's, direct,
    spectral, eager, inductor), the others refused naming the dtype. precision ieee: the seed's worlds, the
    tensor-core ones in split TF32 (K-tiled ones included)."""
    spec = load_config(path)
    plan = make_plan(spec)
    if spec.dtype != "float32":
        takes = {name for name, world in WORLDS.items() if spec.dtype in world.dtypes}
        assert {"cudnn", "direct", "spectral", "eager", "inductor"} <= takes
        seed_plan = make_plan(load_config(_seed_of(path)))
        assert set(plan.impl_stages) == set(seed_plan.impl_stages) & takes
        assert all(f"dtype {spec.dtype}" in refusals(plan)[name] for name in set(WORLDS) - takes)
    else:
        assert not IEEE_REFUSED & set(plan.impl_stages)
        seed_plan = make_plan(load_config(_seed_of(path)))
        assert set(plan.impl_stages) == set(seed_plan.impl_stages)


@pytest.mark.parametrize("path", HALF, ids=lambda p: p.stem)
def test_plan_shows_the_numerics(path):
    spec = load_config(path)
    text = CliRunner().invoke(main, ["plan", str(path)])
    assert text.exit_code == 0, text.output
    assert f"  numerics: dtype {spec.dtype}" in text.output
    if spec.precision == "ieee":
        assert "precision ieee" in text.output and "allclose(atol=0.0001, rtol=0.0001)" in text.output
        assert "world: precision ieee" not in text.output  # no world the float32 seed is offered is refused
    document = json.loads(CliRunner().invoke(main, ["plan", "--json", str(path)]).output)[0]
    assert {k: document[k] for k in ("dtype", "precision", "tolerance")} == spec.numerics()


@pytest.mark.parametrize("path", BY_KIND["fp16"] + BY_KIND["bf16"], ids=lambda p: p.stem)
def test_half_module_renders_at_its_dtype(path):
    """The kernels read and write the dtype through ft_t (widened to float), no torch header; the
    binding takes addresses of the dtype and of float workspace; the model allocates its output in the dtype."""
    spec = load_config(path)
    dtype = DTYPES[spec.dtype]
    module = render(make_plan(spec))
    for unit, text in module.cuda_sources.items():
        includes = re.findall(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", text, re.M)
        assert not any(h.startswith(("torch/", "ATen/", "c10/")) for h in includes), unit
        if "struct FtArgs" in text and "__global__" in text:
            assert dtype.header in includes and f"{dtype.storage} v;" in text, unit
            assert "const ft_t* y;" in text and "float* partials;" in text, unit
            assert "reinterpret_cast<const float4*>(a.y" not in text, unit  # 16 bytes of halves are 8 values
    assert f"ft_at<const {dtype.ft}>(at[FT_Y])" in module.files["binding.cpp"]
    assert f"DTYPE = torch.{dtype.torch}" in module.files["model.py"]


@pytest.mark.parametrize("path", BY_KIND["fp16"] + BY_KIND["bf16"], ids=lambda p: p.stem)
def test_half_convolution_worlds_render_their_numerics(path):
    """The direct world at a half type keeps the weights in float constant memory (the reorder kernel widens
    them from the dtype) and reads x in the dtype, in pairs of the CUDA pair type where rows allow; the
    spectral world's model widens x and the weights to float32 for the spectra, which its kernels read."""
    spec = load_config(path)
    plan = make_plan(spec)
    dtype = DTYPES[spec.dtype]
    module = render(plan)
    direct = [text for unit, text in module.cuda_sources.items() if re.fullmatch(r"direct_(stats|main)_\d+\.cu", unit)]
    assert bool(direct) is ("direct" in plan.impl_stages)
    for text in direct:
        assert "static __constant__ float ft_weight[" in text
        assert "ft_reorder_weights_kernel(const ft_t* __restrict__ weight)" in text
        assert "const ft_t* xn = a.x" in text and "ft_conv_cells<" in text
        assert f"__ldg(reinterpret_cast<const {dtype.pair}*>(row + w + 2 * k))" in text
    spectral = [text for unit, text in module.cuda_sources.items() if re.fullmatch(r"spectral_stats_\d+\.cu", unit)]
    assert bool(spectral) is ("spectral" in plan.impl_stages)
    for text in spectral:
        assert "const float* taps = reinterpret_cast<const float*>(a.weight)" in text
    widened = ("torch.fft.rfftn(x.float(), s=size, dim=axes))", "return spectrum, weight.float().contiguous()")
    assert all(text in module.files["model.py"] for text in widened) is bool(spectral)


@pytest.mark.parametrize("path", BY_KIND["fp16"] + BY_KIND["bf16"], ids=lambda p: p.stem)
def test_half_tensor_core_worlds_render_fp16_or_bf16_mmas(path):
    """The whole-weights tensor-core worlds take the half seeds whose float32 seed they take, and their kernels
    multiply on the dtype's m16n8k16 MMA (float accumulation), staging x and the weights as they are (no TF32
    rounding, K in steps of 16); the float32 seeds' kernels stay on TF32 m16n8k8."""
    spec = load_config(path)
    plan = make_plan(spec)
    dtype = DTYPES[spec.dtype]
    seed_plan = make_plan(load_config(_seed_of(path)))
    whole = {name for name, stages in seed_plan.impl_stages.items() if {"gemm_stats", "gemm_cluster"} & set(stages)}
    assert whole <= set(plan.impl_stages) and all(spec.dtype in WORLDS[name].dtypes for name in whole)
    module, seed_module = render(plan), render(seed_plan)
    units = {u: t for u, t in module.cuda_sources.items() if re.fullmatch(r"gemm_(stats|main|cluster)_\d+\.cu", u)}
    assert bool(units) is bool(whole)
    for unit, text in units.items():
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype.mma}.{dtype.mma}.f32" in text, unit
        assert "ft_tf32(" not in text.split("enum { FT_CINP")[1] and ".tf32.tf32" not in text.split("ft_mma_half")[1], unit
        assert "FT_GKS = FT_GKP / 16" in text and "ft_gemm_stage_weights(const ft_t* __restrict__ w" in text, unit
        assert "const ft_t* xn = a.x" in text, unit
    for unit, text in seed_module.cuda_sources.items():
        if re.fullmatch(r"gemm_(stats|main|cluster)_\d+\.cu", unit):
            assert "m16n8k16" not in text and "FT_GKS = FT_GKP / 8" in text and not re.search(r"\bft_t\b", text), unit


@pytest.mark.parametrize("path", BY_KIND["ieee"], ids=lambda p: p.stem)
def test_ieee_tensor_core_worlds_render_split_tf32(path):
    """Under precision ieee the whole-weights tensor-core worlds take the seeds whose float32 seed they take,
    their kernels multiplying in split TF32: the weights staged once as hi and lo terms (twice the words, the
    shared memory and the boxes planned for it), each A value split as read, three MMAs a product; gemm_store
    never writes its output in half precision. The float32 seed's kernels (precision tf32) have none of it."""
    from fusetune.codegen import plan_facts
    from fusetune.tiles import gemm_max_height, weight_words
    from fusetune.worlds.facts import gemm_windows

    spec = load_config(path)
    plan, seed_plan = make_plan(spec), make_plan(load_config(_seed_of(path)))
    split = (SPLIT_WORLDS - WIDE_WORLDS) & set(seed_plan.impl_stages)  # the K-tiled ones: test_ieee_wide_worlds_...
    assert split <= set(plan.impl_stages)
    module, seed_module = render(plan), render(seed_plan)
    units = {u: t for u, t in module.cuda_sources.items() if re.fullmatch(r"gemm_(stats|main|cluster)_\d+\.cu", u)}
    assert bool(units) is bool(split)
    for unit, text in units.items():
        kernels = text.split("enum { FT_CINP")[1]
        assert "FT_GW_WORDS = 2 * FT_GW_TERM" in kernels and "ft_tf32_split(real ? __ldg(w" in kernels, unit
        assert "ft_mma_split(acc[i][2 * jp], ah[i], al[i], b[0])" in kernels and "ft_mma_tf32(" not in kernels, unit
        # a B fragment is four registers (hi and lo), so a warp keeps them where twice the registers fit
        cached = gemm_keeps_b(spec.producer.geometry(), 4, terms=2)
        assert f"CACHED = {int(cached)} }};" in kernels and "[FT_GNT][4];" in kernels, unit
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in text and "m16n8k16" not in text, unit
    for unit, text in seed_module.cuda_sources.items():
        assert "ft_tf32_split" not in text and "FT_GW_TERM" not in text, unit
    facts, seed_facts = plan_facts(plan), plan_facts(seed_plan)
    assert facts["half_store"] == 0 and (facts["tf32_terms"], seed_facts["tf32_terms"]) == (2, 1)
    # in split TF32 no variant that spilled registers (gemm_stats but at 128 threads and one m-tile a warp,
    # gemm_main at two m-tiles a warp)
    for unit in units:
        variant = re.search(r"// The box of variant 0 \((\{[^}]*\})\)", module.cuda_sources[unit]).group(1)
        assert ("'block': 128, 'mt': 1" in variant) if unit.startswith("gemm_stats") else True, (unit, variant)
        assert ("'mt': 1" in variant) if unit.startswith("gemm_main") else True, (unit, variant)
    if split:
        conv = spec.producer.geometry()
        assert facts["gemm_th"] == gemm_max_height(conv, gemm_windows(plan), 4, 2) <= seed_facts["gemm_th"]
        assert weight_words(conv["cout"], 72, terms=2) == 2 * weight_words(conv["cout"], 72)
        assert all(facts["cluster_boxes"][box] <= seed_facts["cluster_boxes"][box] for box in facts["cluster_boxes"])


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_split_tf32_units_compile_for_sm90_without_spills(tmp_path):
    """Split TF32 at the ieee conv2d seed's 64 channels (the most registers of the seeds): of each whole-weights
    tensor-core stage, the first and the last variant the plan compiles (the smallest and the largest choices)
    compile for sm_90 without register spills; the variants that spilled are left out by the families'
    compile_if (tf32_terms). A sample, as tests/test_compile.py takes of the half configs: a unit is seconds of
    nvcc, and the other stages' text is the float32 seed's, compiled there."""
    path = next(p for p in BY_KIND["ieee"] if p.stem.startswith("conv2d_groupnorm"))
    module = render(make_plan(load_config(path)))
    units = []
    for stage in ("gemm_stats", "gemm_main", "gemm_cluster"):
        built = sorted(int(m.group(1)) for u in module.cuda_sources if (m := re.fullmatch(rf"{stage}_(\d+)\.cu", u)))
        assert built, stage
        units += [f"{stage}_{built[0]}.cu", f"{stage}_{built[-1]}.cu"]

    def compile_one(unit: str) -> subprocess.CompletedProcess:
        source = tmp_path / unit
        source.write_text(module.cuda_sources[unit])
        return subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                               "-Xptxas", "-v", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                              capture_output=True, text=True, timeout=900)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 2)) as pool:
        results = dict(zip(units, pool.map(compile_one, units)))
    for unit, result in results.items():
        log = result.stdout + result.stderr
        assert result.returncode == 0, (unit, log[-6000:])
        assert "ft_mma_split" in module.cuda_sources[unit], unit
        entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", log)
        spills = dict(re.findall(r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores", log))
        assert entries and set(entries) <= set(spills), (unit, log[-3000:])
        assert {fn: n for fn, n in spills.items() if int(n)} == {}, unit


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_k_tiled_half_and_split_units_compile_for_sm90_without_spills(tmp_path):
    """The K-tiled statistics kernel at the batch norm seed's 64 -> 128 channels, its last variant (the largest
    tile: the most accumulators a thread) in float16 (FP16 MMAs, the workspace in pairs) and
    under precision ieee (split TF32), compiles for sm_90 without register spills. A sample: a unit is seconds of
    nvcc; every variant of tests/wide_numerics/ was compiled so when the kernels changed."""
    paths = {kind: next(p for p in BY_KIND[kind] if p.stem.startswith("convt3d_scale_batchnorm"))
             for kind in ("fp16", "ieee")}
    units = []
    for kind, path in paths.items():
        module = render(make_plan(load_config(path)))
        built = sorted(int(m.group(1)) for u in module.cuda_sources if (m := re.fullmatch(r"wide_stats_(\d+)\.cu", u)))
        assert built, path
        units.append((kind, f"wide_stats_{built[-1]}.cu", module.cuda_sources[f"wide_stats_{built[-1]}.cu"]))

    def compile_one(unit: tuple[str, str, str]) -> subprocess.CompletedProcess:
        source = tmp_path / f"{unit[0]}_{unit[1]}"
        source.write_text(unit[2])
        return subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                               "-Xptxas", "-v", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                              capture_output=True, text=True, timeout=900)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(compile_one, units))
    for (kind, unit, text), result in zip(units, results):
        log = result.stdout + result.stderr
        assert result.returncode == 0, (kind, unit, log[-6000:])
        assert ("ft_mma_half(acc" if kind == "fp16" else "ft_mma_split_rn(acc") in text, (kind, unit)
        entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", log)
        spills = dict(re.findall(r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores", log))
        assert entries and set(entries) <= set(spills), (kind, unit, log[-3000:])
        assert {fn: n for fn, n in spills.items() if int(n)} == {}, (kind, unit)


@pytest.mark.parametrize("path", BY_KIND["fp16"] + BY_KIND["bf16"], ids=lambda p: p.stem)
def test_half_wide_worlds_render_fp16_or_bf16_mmas(path):
    """The K-tiled tensor-core worlds take the half seeds whose float32 seed they take, and keep x and the
    weights in the dtype: the pad and pack kernels copy them bit for bit, a channel pair to a word, into the
    workspace (half its float32 words: tiles.wide_planes), and every product is the dtype's m16n8k16 MMA (no
    TF32); a stage takes twice float32's channels in the same words, so the variants and depths are float32's.
    What they write of the model's (the stored convolution, the output) is in the dtype."""
    from fusetune.codegen import plan_facts
    from fusetune.tiles import wide_workspace_words

    spec = load_config(path)
    plan = make_plan(spec)
    dtype = DTYPES[spec.dtype]
    seed_plan = make_plan(load_config(_seed_of(path)))
    wide = WIDE_WORLDS & set(seed_plan.impl_stages)
    assert wide <= set(plan.impl_stages) and all(spec.dtype in WORLDS[name].native_mma for name in wide)
    module = render(plan)
    units = {u: t for u, t in module.cuda_sources.items() if re.fullmatch(WIDE_UNIT, u)}
    assert bool(units) is bool(wide)
    for unit, text in units.items():
        kernels = text.split("enum { FT_WCK")[1]
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype.mma}.{dtype.mma}.f32" in text, unit
        assert "ft_mma_half(acc[i][j], a0, a1, a2, a3, b[j][0], b[j][1])" in kernels, unit
        assert "ft_tf32(" not in kernels and "ft_mma_tf32(acc" not in kernels, unit
        assert "ft_wide_pad_kernel(const ft_t* __restrict__ x, float* __restrict__ padded" in kernels, unit
        assert "ft_wide_pack_kernel(const ft_t* __restrict__ w, uint32_t* __restrict__ packed)" in kernels, unit
        assert "out[i] = make_uint4(v[0], v[1], v[2], v[3]);" in kernels, unit  # pairs of channels, bit for bit
        assert not re.search(r"\bfloat\* out = a\.out", text), unit
    if wide:
        conv = spec.producer.geometry()
        assert conv["cin"] % 32 == 0 and 2 * wide_workspace_words(conv, 2) == wide_workspace_words(conv)  # pairs
        assert f"FT_WIDE_PACKED = {wide_workspace_words(conv, 2)} " in module.files["binding.cpp"]
        facts, seed_facts = plan_facts(plan), plan_facts(seed_plan)
        assert facts["wide_depth"] == seed_facts["wide_depth"]


@pytest.mark.parametrize("path", BY_KIND["ieee"], ids=lambda p: p.stem)
def test_ieee_wide_worlds_render_split_tf32(path):
    """Under precision ieee the K-tiled worlds take the seeds whose float32 seed they take, in split TF32: the
    padded input keeps float32's values (not rounded to TF32) and each A value is split as it is loaded; the
    weights are packed as hi and lo terms (twice the packed words, and stages planned for them), three MMAs a
    product. The float32 seed's K-tiled kernels (precision tf32) have none of it."""
    from fusetune.codegen import plan_facts
    from fusetune.tiles import wide_depths, wide_workspace_words

    spec = load_config(path)
    plan, seed_plan = make_plan(spec), make_plan(load_config(_seed_of(path)))
    wide = WIDE_WORLDS & set(seed_plan.impl_stages)
    assert wide <= set(plan.impl_stages)
    module, seed_module = render(plan), render(seed_plan)
    units = {u: t for u, t in module.cuda_sources.items() if re.fullmatch(WIDE_UNIT, u)}
    assert bool(units) is bool(wide)
    for unit, text in units.items():
        kernels = text.split("enum { FT_WCK")[1]
        assert "B_TERM = FT_WKS * NP * 128, B_WORDS = 2 * B_TERM" in kernels, unit
        assert ("ft_tf32_split(live ? __ldg(w + ft_widx(c, ci, td, th, tw)) : 0.f, packed[at], packed[at + TERM])"
                in kernels), unit
        assert "ft_tf32_split(__uint_as_float(xs[aoff[i][0] + lo]), ah[i][0], al[i][0])" in kernels, unit
        # split TF32 summed from zero a k step, then added to the accumulator (tests/test_split_tf32_accumulation.py)
        assert "ft_mma_split_rn(acc[i][2 * p], ah[i], al[i], b0)" in kernels and "ft_mma_tf32(acc" not in kernels, unit
        assert "__uint_as_float(ft_tf32(__ldg(xp" not in kernels, unit  # the padded input is not rounded
        assert "m16n8k16" not in text, unit
    for unit, text in seed_module.cuda_sources.items():
        if re.fullmatch(WIDE_UNIT, unit):
            assert "ft_tf32_split" not in text and "B_TERM" not in text, unit
    if wide:
        conv = spec.producer.geometry()
        assert wide_workspace_words(conv, 4, 2) == 2 * wide_workspace_words(conv)
        assert f"FT_WIDE_PACKED = {wide_workspace_words(conv, 4, 2)} " in module.files["binding.cpp"]
        depths, seed_depths = plan_facts(plan)["wide_depth"], plan_facts(seed_plan)["wide_depth"]
        assert depths == wide_depths(conv, 4, 2) and all(depths[v] <= seed_depths[v] for v in depths)
        assert sum(map(bool, depths.values())) < sum(map(bool, seed_depths.values()))  # the weights' terms cost


@pytest.mark.parametrize("numerics", [{"dtype": "float16"}, {"dtype": "bfloat16"}, {"precision": "ieee"}], ids=str)
@pytest.mark.parametrize("chain", sorted((ROOT / "tests" / "wide_numerics").glob("*.yaml")), ids=lambda p: p.stem)
def test_wide_numerics_chains_take_both_k_tiled_worlds(chain, numerics):
    """tests/wide_numerics/'s chains (verified on a GPU by test_gpu_precision.py, each K-tiled world forced) are
    offered both K-tiled worlds at each numerics, and the whole-weights ones none (more than 64 channels)."""
    import yaml

    from fusetune.config import parse_config

    plan = make_plan(parse_config({**yaml.safe_load(chain.read_text()), **numerics}, str(chain)))
    assert WIDE_WORLDS <= set(plan.impl_stages) and not {"gemm", "gemm_cluster"} & set(plan.impl_stages)
    assert plan.spec.producer.in_channels % 2 == 1  # the last channel pair half padding at a half dtype


def test_split_tf32_leaves_out_the_k_tiled_variants_that_spill():
    """Under precision ieee the K-tiled stages do not compile 256 x 128 nor two blocks a multiprocessor (with each
    k step's split MMAs summed from zero, ft_mma_split_rn, they spilled on tests/wide_numerics/'s chains), which
    they do at tf32; 128 x 128 and 256 x 64 at one block they do under both."""
    import yaml

    from fusetune.codegen import plan_facts
    from fusetune.config import parse_config
    from fusetune.space import load_family

    chain = ROOT / "tests" / "wide_numerics" / "convt3d_cin19_wide80_stride2_batchnorm_tanh_maxpool.yaml"
    raw = yaml.safe_load(chain.read_text())
    plans = {numerics: make_plan(parse_config({**raw, **extra}, str(chain)))
             for numerics, extra in (("tf32", {}), ("ieee", {"precision": "ieee"}))}
    compiled: dict[tuple[str, str], set] = {}
    for stage, (numerics, plan) in itertools.product(("wide_stats", "wide_main"), plans.items()):
        family = load_family(stage)
        names = {"C": plan.spec.producer.out_channels, **plan_facts(plan)}
        compiled[stage, numerics] = {(v["bm"], v["bn"], v["wm"], v["blocks"]) for v in family.variants()
                                     if family.compiles(v, names)}
    assert {(256, 128, 4, 1), (256, 128, 2, 1), (128, 64, 2, 2)} <= compiled["wide_stats", "tf32"]
    for stage in ("wide_stats", "wide_main"):  # wide_main's pooled 256 x 128 tiles do not fit beside the fold
        ieee = compiled[stage, "ieee"]
        assert {(128, 128, 2, 1), (256, 64, 2, 1)} <= ieee and ieee <= compiled[stage, "tf32"], (stage, ieee)
        assert all(blocks == 1 and bm * bn <= 128 * 128 for bm, bn, _, blocks in ieee), (stage, ieee)


def test_float32_module_has_no_half_code():
    for path in SEEDS.values():
        module = render(make_plan(load_config(path)))
        assert not any(re.search(r"\bft_t4?\b", text) for text in module.cuda_sources.values())
        assert "DTYPE = torch.float32" in module.files["model.py"]
        assert "with _ConvPrecision()" not in module.files["model.py"]


@pytest.mark.parametrize("path", HALF, ids=lambda p: p.stem)
def test_reference_model_is_in_the_dtype_on_cpu(path, tmp_path):
    """Model (and so ModelNew) holds its parameters and buffers in the dtype, and under precision ieee its
    convolution runs inside the TF32 switch, which it leaves as it found it."""
    import torch

    spec = load_config(path)
    module = render(make_plan(spec))
    generated = import_file(module.write(tmp_path / "module") / "model.py")
    model = generated.Model()
    want = getattr(torch, DTYPES[spec.dtype].torch)
    assert generated.DTYPE == want
    floats = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    assert floats and all(t.dtype == want for t in floats)
    assert generated.TOLERANCE == spec.numerics()["tolerance"]
    assert generated.PRECISION == spec.precision
    assert ("with _ConvPrecision()" in module.files["model.py"]) is (spec.precision == "ieee")
    owner, name, off = generated._conv_tf32_switch()
    before = getattr(owner, name)
    with generated._ConvPrecision():
        assert getattr(owner, name) == off
    assert getattr(owner, name) == before


@pytest.mark.parametrize("user_setting", ["ieee", "tf32"])
def test_conv_precision_after_the_new_tf32_api(user_setting, tmp_path):
    """A user who set torch.backends.cudnn.conv.fp32_precision (torch >= 2.9) makes reading the legacy
    allow_tf32 raise; the precision switch goes through the new API, turns TF32 off and restores theirs."""
    import torch

    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        pytest.skip("this torch has no torch.backends.cudnn.conv.fp32_precision")
    path = next(p for p in BY_KIND["ieee"])
    generated = import_file(render(make_plan(load_config(path))).write(tmp_path / "module") / "model.py")
    saved = conv.fp32_precision
    try:
        conv.fp32_precision = user_setting
        with generated._ConvPrecision():
            assert conv.fp32_precision == "ieee"
        assert conv.fp32_precision == user_setting
    finally:
        conv.fp32_precision = saved


def test_allclose_refusal_is_torch_allclose_and_says_where():
    """The tolerance check is torch.allclose (in float64): passes what it passes; a refusal counts the
    elements off and names the worst; an unwritten (NaN) output is never close."""
    import torch

    from fusetune.evaluate import _allclose_refusal

    tolerance = {"atol": 1e-4, "rtol": 1e-4}
    eager = torch.linspace(-1.0, 1.0, 101, dtype=torch.float16)
    assert _allclose_refusal(eager.clone(), eager, tolerance) is None
    off = eager.clone()
    off[7] += 0.25
    why = _allclose_refusal(off, eager, tolerance)
    assert why is not None and "1 of 101 elements off" in why and "eager float16" in why
    assert f"against {eager[7].item():.6g}" in why
    unwritten = eager.clone()
    unwritten[3] = float("nan")
    assert "1 of 101" in _allclose_refusal(unwritten, eager, tolerance)
    exact = eager.float()
    assert _allclose_refusal(exact + 5e-5, exact, tolerance) is None  # within atol
    assert _allclose_refusal(exact + 3e-4, exact, tolerance) is not None  # beyond atol + rtol * |x| <= 2e-4


def test_every_output_of_a_model_returning_two_is_checked():
    """A model that returns the convolution's output beside the chain's (outputs: [chain, producer]) is verified
    on both: an error, a NaN left unwritten or a tolerance missed in either output fails it, whichever it is."""
    import math

    import torch

    from fusetune.evaluate import _allclose_refusal, _errors

    tolerance = {"atol": 1e-4, "rtol": 1e-4}
    chain, conv = torch.linspace(-1.0, 1.0, 101, dtype=torch.float64), torch.linspace(2.0, 3.0, 57, dtype=torch.float64)
    each = [_errors(chain.float(), chain), _errors(conv.float(), conv)]  # float32's rounding: small, not zero
    assert _errors((chain.float(), conv.float()), (chain, conv)) == (max(e[0] for e in each), max(e[1] for e in each))
    off = conv.clone()
    off[11] += 0.5
    rel, mx = _errors((chain, off), (chain, conv))
    assert rel == _errors(off, conv)[0] and mx == _errors(off, conv)[1] > 0.1
    unwritten = conv.clone()
    unwritten[0] = float("nan")
    assert _errors((chain, unwritten), (chain, conv)) == (math.inf, math.inf)
    assert _allclose_refusal((chain, conv), (chain, conv), tolerance) is None
    assert "1 of 57 elements off" in _allclose_refusal((chain, off), (chain, conv), tolerance)


def test_a_model_returning_a_list_is_shaped_as_one_returning_a_tuple():
    """verify's shape check takes a list of outputs as the tuple it is (as outputs_of and the error checks do),
    and still tells one tensor from several and a wrong shape from the right one."""
    import torch

    from fusetune.evaluate import shape_mismatch

    chain, conv = torch.zeros(2, 3, 5), torch.zeros(2, 4, 5, 5)
    assert shape_mismatch([chain, conv], (chain.double(), conv.double())) is None
    assert shape_mismatch((chain, conv), [chain, conv]) is None
    assert shape_mismatch(chain, chain.double()) is None
    assert shape_mismatch([chain], chain) == "output shape (2, 3, 5), expected (2, 3, 5)"
    assert shape_mismatch([chain, chain], (chain, conv)) == (
        "output shape [(2, 3, 5), (2, 3, 5)], expected [(2, 3, 5), (2, 4, 5, 5)]")
