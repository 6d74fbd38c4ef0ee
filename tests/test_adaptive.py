"""Adaptive pools to a grid (output sizes other than 1) in the kernels, on the CPU: PyTorch's windows
[floor(i * In / Out), ceil((i + 1) * In / Out)), whose sizes vary where Out does not divide In.

The window bounds the kernels are rendered with (common.cuh.j2's ft_adaptive_start / ft_adaptive_end, from
ops/pool.py's ADAPTIVE_BOUNDS) are read back out of a rendered unit and evaluated here against torch's own
adaptive pools, at sizes that do not divide (and outputs larger than their inputs); the corpus's grid chains
plan the pool into region 0 at any shape, the worlds whose kernels pool fixed windows say why they do not take
it, and the main kernels render its windows. tests/test_gpu_adaptive.py runs the kernels on a GPU.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.ops import AdaptivePool
from fusetune.plan import make_plan
from fusetune.worlds import refusals
from fusetune.worlds.facts import ADAPTIVE_POOL

from conftest import ROOT

torch = pytest.importorskip("torch")

CHAINS = ROOT / "tests" / "chains"
#: The corpus's adaptive pools to a grid: 2-D and 3-D, average and max, windows equal at the config's shapes
#: (grid_divides) or not, after a norm, before a reduction over space.
GRID_CHAINS = sorted(p.stem for p in CHAINS.glob("*adaptive*grid*.yaml"))
#: (input size, output size) per axis: sizes the output does not divide, outputs larger than the input, one
#: that divides, and a size-1 axis (a 2-D or 1-D pool's leading ones in the kernels).
AXES = [(7, 3), (10, 4), (5, 7), (13, 13), (9, 1), (11, 5), (1, 1), (12, 4), (3, 8)]


def _rendered_bounds():
    """ft_adaptive_start / ft_adaptive_end as the kernels are rendered with them: each body's C expression,
    as a Python function (its operands are non-negative, so C's integer division is Python's //)."""
    module = render(make_plan(load_config(CHAINS / "conv2d_relu6_adaptiveavgpool_grid_flatten.yaml")))
    text = module.cuda_sources["window_map.cu"]
    bounds = {}
    for name in ("start", "end"):
        match = re.search(rf"int ft_adaptive_{name}\(int i, int out, int size\) {{ return (.+?); }}", text)
        assert match, f"ft_adaptive_{name} not found in the rendered window_map.cu"
        expr = match.group(1).replace("/", "//")
        bounds[name] = eval(f"lambda i, out, size: {expr}")  # noqa: S307 (the rendered kernels' own text)
    return bounds["start"], bounds["end"]


def _pooled(x, output, mode: str):
    """``x`` pooled over the rendered kernels' windows, output index by output index."""
    start, end = _rendered_bounds()
    sizes = x.shape[2:]
    out = torch.empty(x.shape[:2] + tuple(output), dtype=x.dtype)
    for index in itertools.product(*(range(o) for o in output)):
        window = x[(slice(None), slice(None)) + tuple(
            slice(start(i, o, s), end(i, o, s)) for i, o, s in zip(index, output, sizes))]
        flat = window.reshape(x.shape[0], x.shape[1], -1)
        if mode == "avg":
            out[(slice(None), slice(None)) + index] = flat.sum(-1) / flat.shape[-1]  # each window's own count
        else:
            out[(slice(None), slice(None)) + index] = flat.amax(-1).where(~flat.isnan().any(-1), float("nan"))
    return out


def _axes(dims: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Input and output sizes of ``dims`` axes, from AXES in turn."""
    cases = []
    for k in range(len(AXES)):
        picked = [AXES[(k + j * 3) % len(AXES)] for j in range(dims)]
        cases.append((tuple(s for s, _ in picked), tuple(o for _, o in picked)))
    return cases


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_the_kernels_windows_are_torchs_adaptive_pools(dims, mode):
    """The rendered bounds pool exactly PyTorch's adaptive windows (float64; a max pool's NaN propagates as
    torch's does), at sizes the outputs do not divide and outputs larger than their inputs."""
    pool = getattr(torch.nn.functional, f"adaptive_{mode}_pool{dims}d")
    torch.manual_seed(dims)
    for sizes, output in _axes(dims):
        x = torch.randn((2, 3) + sizes, dtype=torch.float64)
        if mode == "max":
            x.view(-1)[x.numel() // 2] = float("nan")
        want = pool(x, output)
        got = _pooled(x, output, mode)
        assert torch.equal(got.isnan(), want.isnan()), (sizes, output)
        assert torch.allclose(got.nan_to_num(), want.nan_to_num(), rtol=1e-12, atol=1e-12), (sizes, output)


def test_the_windows_vary_where_the_output_does_not_divide():
    """The case this exists for: windows of unequal sizes that overlap, from the rendered bounds."""
    start, end = _rendered_bounds()
    windows = [(start(i, 3, 7), end(i, 3, 7)) for i in range(3)]
    assert windows == [(0, 3), (2, 5), (4, 7)]
    assert [end(i, 4, 7) - start(i, 4, 7) for i in range(4)] == [2, 3, 3, 2]


def test_the_corpus_has_grid_chains():
    assert len(GRID_CHAINS) >= 5
    assert any("max" in name for name in GRID_CHAINS) and any("avg" in name for name in GRID_CHAINS)


@pytest.mark.parametrize("name", GRID_CHAINS)
def test_an_adaptive_grid_is_region_zeros_pool_at_any_shape(name):
    """The pool is the region's own, no rule that holds at the config's shapes only; the cuDNN world takes it
    at any shape. The worlds whose kernels pool fixed windows of their boxes take it only where its windows
    are one window at every config shape (grid_divides), exact there alone; elsewhere they say why not."""
    plan = make_plan(load_config(CHAINS / f"{name}.yaml"))
    assert isinstance(plan.pool, AdaptivePool) and not plan.at_shapes
    assert any(step.op is plan.pool for step in plan.head)
    assert plan.pool_output == (1,) * (3 - len(plan.pool.output_size)) + plan.pool.output_size
    assert "cudnn" in plan.impl_stages and "cudnn" not in plan.at_shapes_worlds
    why = refusals(plan)
    if name == "conv2d_relu_adaptivemaxpool_grid_divides":
        assert plan.adaptive_window == (1, 4, 4) and plan.pool_window == ((1, 4, 4), (1, 4, 4))
        assert plan.at_shapes_worlds == ("direct", "gemm")
    else:
        assert plan.adaptive_window is None and plan.at_shapes_worlds == ()
        for world in ("direct", "gemm", "gemm_extrema", "gemm_cluster"):
            assert ADAPTIVE_POOL in why[world], (world, why[world])


def test_one_window_at_the_configs_shapes_only_guards_those_worlds(tmp_path):
    """Where an adaptive pool's windows are one window at the config's shapes, the worlds that pool fixed
    windows take it as that window: the generated model knows the shapes and those worlds (EXACT_AT,
    EXACT_WORLDS), and fusetune plan says so; a shape the grid does not divide, or the identity, gives none."""
    from fusetune.build import load_generated

    spec = load_config(CHAINS / "conv2d_relu_adaptivemaxpool_grid_divides.yaml")
    generated = load_generated(render(make_plan(spec)).write(tmp_path / "divides"))
    assert generated.EXACT_AT == [list(s) for s in spec.shapes] and generated.EXACT_WORLDS == ["direct", "gemm"]
    text = CliRunner().invoke(main, ["plan", str(spec.path)]).output
    assert "exact at the config's shapes only in worlds direct, gemm" in text and "one 4 x 4 window there" in text
    document = json.loads(CliRunner().invoke(main, ["plan", "--json", str(spec.path)]).output)[0]
    assert document["exact_at_shapes_only"] == ["direct", "gemm"]
    cases = [([[2, 8, 18, 22], [2, 8, 19, 22]], None), ([[2, 8, 6, 7]], None), ([[2, 8, 10, 12]], (1, 2, 2))]
    for shapes, window in cases:
        other = make_plan(dataclasses.replace(spec, shapes=tuple(tuple(s) for s in shapes)))
        assert other.adaptive_window == window, shapes
        assert bool(other.at_shapes_worlds) == (window is not None), shapes


def test_fusetune_plan_says_why_a_world_does_not_take_an_adaptive_pool():
    path = CHAINS / "conv2d_relu6_adaptiveavgpool_grid_flatten.yaml"
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert "region 0 (fused kernels): conv2d -> epilogue[0] (relu6), epilogue[1] (adaptive_avg_pool)" in result.output
    assert f"no direct world: {ADAPTIVE_POOL}" in result.output


@pytest.mark.parametrize("name,unit", [("conv2d_relu6_adaptiveavgpool_grid_flatten", "window_map.cu"),
                                       ("conv3d_hardtanh_adaptivemaxpool_grid_mean_keepdim", "plane_reduce.cu")])
def test_the_main_kernels_render_the_adaptive_windows(name, unit):
    """Both layouts' kernels take each window's origin and extent from the bounds, loop over them without
    unrolling, and an average divides by its own window's count; a fixed window's loops are as before."""
    text = render(make_plan(load_config(CHAINS / f"{name}.yaml"))).cuda_sources[unit]
    assert text.count("ft_adaptive_start((int)(") == 6 and text.count("ft_adaptive_end((int)(") == 6
    assert not re.search(r"#pragma unroll\s+for \(int k[dhw] = 0; k[dhw] < n[dhw]", text)
    assert len(re.findall(r"for \(int kd = 0; kd < nd; \+\+kd\)", text)) == 2
    if "avg" in name:
        assert text.count("/= (float)(nd * nh * nw);") == 2 and not re.search(r"\*= [0-9.e-]+f;", text)
    plain = render(make_plan(load_config(CHAINS / "conv2d_celu_dropout_avgpool.yaml"))).cuda_sources["window_map.cu"]
    assert "ft_adaptive" not in plain and "#pragma unroll\n    for (int kd = 0; kd < FT_KD; ++kd)" in plain


def test_the_generated_model_sizes_an_adaptive_grid_at_any_shape(tmp_path):
    """The kernels' dims: the grid whatever the producer's output, and a clear error where the 32-bit window
    bounds would overflow."""
    from fusetune.build import load_generated

    spec = load_config(CHAINS / "conv3d_hardtanh_adaptivemaxpool_grid_mean_keepdim.yaml")
    generated = load_generated(render(make_plan(spec)).write(tmp_path))
    assert generated.POOL_OUTPUT == [2, 3, 2]
    assert generated._dims(2, 6, (7, 9, 6), (9, 11, 8)) == [2, 6, 7, 9, 6, 2, 3, 2, 9, 11, 8]
    assert generated._dims(1, 6, (5, 1, 19), (7, 3, 21))[5:8] == [2, 3, 2]
    with pytest.raises(ValueError, match="32-bit adaptive windows"):
        generated._dims(1, 6, (7, 2 ** 30, 6), (9, 2 ** 30, 8))
