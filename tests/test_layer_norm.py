"""Layer norm in the kernels (fusetune/ops/norm.py's LayerNorm): over (C, *spatial) its statistics are group
norm's with one group, over every spatial dim instance norm's; the statistics pass and finalize serve it as
those, finalize's map without an affine, and window_map, plane_reduce, direct_main and gemm_main apply the
per-element weight and bias after the map. Over fewer trailing dims a later region takes it, on the plane view
of its input. The worlds whose main kernel reads the map per plane alone refuse a per-element affine, and say
so in ``fusetune plan``.

The lowering is checked in float64 on the CPU: the kernels' arithmetic (per-plane sums, finalize's grouping,
the map, the per-element index), read from the plan, against nn.LayerNorm of the reference model. The kernels
themselves on a GPU: tests/test_gpu_layer_norm.py.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.worlds import WORLDS, refusals

from conftest import ROOT, import_file

CHAINS = ROOT / "tests" / "chains"
NVCC = shutil.which("nvcc")

#: The corpus chains whose layer norm the kernels take: (chain, scope, element_affine, whether the producer's
#: bias is dropped (a norm over the spatial dims cancels a per-channel constant), worlds offered beside the
#: reference's own forwards).
FUSED = [
    ("conv2d_layernorm_chw_gelu", "group", "channels", False, {"cudnn", "direct", "gemm", "gemm_store"}),
    ("conv3d_layernorm_dhw_gelu", "instance", "spatial", True, {"cudnn", "direct", "gemm", "gemm_store"}),
    ("convt1d_layernorm_gelu", "instance", "spatial", True, {"cudnn", "direct"}),
    ("conv2d_layernorm_hw_relu_avgpool", "instance", "spatial", True, {"cudnn", "direct"}),
    ("conv2d_layernorm_chw_gelu_scale_mean", "group", "channels", False, {"cudnn", "direct", "gemm", "gemm_store"}),
    ("conv2d_layernorm_chw_noaffine_maxpool", "group", "", False,
     {"cudnn", "direct", "gemm", "gemm_extrema", "gemm_store", "gemm_cluster"}),
]
#: Worlds whose main kernel applies the norm's map per plane alone (facts.ELEMENT_AFFINE_STAGES).
PER_PLANE = "per-element affine (elementwise_affine)"


def _plan(stem: str):
    return make_plan(load_config(CHAINS / f"{stem}.yaml"))


@pytest.mark.parametrize("stem, scope, element, dropped, worlds", FUSED, ids=[f[0] for f in FUSED])
def test_region_zero_holds_the_layer_norm(stem, scope, element, dropped, worlds):
    plan = _plan(stem)
    assert plan.norm is not None and plan.norm.kind == "layer_norm", plan.regions()
    assert plan.head[0].op is plan.norm and all(step.op.role == "view" for step in plan.tail)
    assert (plan.norm.scope, plan.norm.element_affine, plan.drop_bias) == (scope, element, dropped)
    assert not plan.norm.channel_affine  # finalize's map is the bare normalisation
    assert plan.family == ("plane_reduce" if plan.reduce else "window_map") and plan.needs_stats
    kernels = {impl for impl in plan.impl_stages if not WORLDS[impl].runs_reference}
    assert kernels == worlds
    lines = plan.regions()
    assert lines[0].startswith("region 0 (fused kernels): ") and "epilogue[0] (layer_norm)" in lines[0]
    assert not any(line.startswith("region 1 (kernels") for line in lines)  # nothing after it but a view


@pytest.mark.parametrize("stem", ["conv2d_layernorm_chw_gelu", "conv3d_layernorm_dhw_gelu"])  # the tensor cores take
def test_worlds_that_read_the_map_per_plane_refuse_a_per_element_affine(stem):
    """wide_main, extrema_map and gemm_cluster index the map by plane: a world with one of them says why in
    ``fusetune plan`` (where no earlier reason of its own comes first)."""
    plan = _plan(stem)
    why = refusals(plan)
    per_plane = {impl for impl, reason in why.items() if PER_PLANE in reason}
    assert per_plane and per_plane.isdisjoint(plan.impl_stages)
    assert all(stage not in plan.stages for stage in ("wide_main", "gemm_cluster", "extrema_map"))
    output = CliRunner().invoke(main, ["plan", str(CHAINS / f"{stem}.yaml")]).output
    for impl in per_plane:
        assert f"  no {impl} world: {why[impl]}" in output


def test_without_the_affine_every_world_takes_it():
    """elementwise_affine false: exactly group norm with one group, no affine; a max pool after it is at the
    window's extremes (the map is one per plane), so gemm_extrema and direct's extremes apply."""
    plan = _plan("conv2d_layernorm_chw_noaffine_maxpool")
    assert plan.norm.groups_of(16) == 16 and plan.norm.element_affine == ""
    assert plan.impl_stages["gemm_extrema"] == ("gemm_stats", "finalize", "extrema_map")


def test_a_layer_norm_over_the_last_dim_is_a_later_region_on_a_plane_view():
    """Over the last dim alone region 0 stops before it; the later region reads the convolution's output as
    (N*C*H, 1, W), where the layer norm is an instance norm over the view's spatial dim, its weight and bias
    indexed by the position there (fusetune/views.py)."""
    from fusetune.pipeline import later_segments

    plan = _plan("conv2d_layernorm_w_gelu")
    assert plan.norm is None and plan.head == () and [s.op.kind for s in plan.tail] == ["layer_norm", "gelu"]
    assert plan.tail[0].op.scope == "layer"
    assert "a layer_norm over [23], fewer trailing dims than every spatial one, runs after this region" in plan.ends
    (segment,) = later_segments(plan)
    assert segment.kernels and [s.op.kind for s in segment.steps] == ["layer_norm", "gelu"]
    assert segment.view.shape((2, 8, 19, 23)) == (2 * 8 * 19, 1, 23) and segment.view.back((2, 8, 19, 23)) == (2, 8, 19, 23)
    later = make_plan(segment.spec)
    assert later.norm.scope == "instance" and later.norm.element_affine == "spatial" and later.family == "window_map"
    output = CliRunner().invoke(main, ["plan", str(CHAINS / "conv2d_layernorm_w_gelu.yaml")]).output
    assert "view: dim 3 of [2, 8, 19, 23] as [304, 1, 23] (plane)" in output


def test_a_layer_norm_over_some_trailing_spatial_dims_is_a_later_region_on_a_plane_view():
    """Over (H, W) of a 3-D convolution's output (not D): region 0 stops before it, and the later region reads
    the output as (N*C*D, 1, H*W), where it is an instance norm over the view's spatial dim, its (H, W) weight
    and bias read flat (the chain's very module, of the chain's shape)."""
    from fusetune.pipeline import later_segments

    plan = _plan("conv3d_layernorm_hw_gelu")
    assert plan.head == () and plan.tail[0].op.scope == "layer"
    assert "on the plane view of its input" in plan.ends
    (segment,) = later_segments(plan)
    assert segment.kernels and [s.op.kind for s in segment.steps] == ["layer_norm", "gelu"]
    assert segment.view.shape((2, 8, 7, 11, 13)) == (2 * 8 * 7, 1, 11 * 13)
    later = make_plan(segment.spec)
    assert later.norm.scope == "instance" and later.norm.element_affine == "spatial"
    assert later.norm.normalized_shape == (143,) and later.norm.module_shape == (11, 13)
    assert "nn.LayerNorm([11, 13]" in later.norm.module_code(1, 1)
    output = CliRunner().invoke(main, ["plan", str(CHAINS / "conv3d_layernorm_hw_gelu.yaml")]).output
    assert "view: dims 3..4 of [2, 8, 7, 11, 13] as [112, 1, 143] (plane)" in output


def test_a_layer_norm_on_a_plane_view_is_the_chains_layer_norm_in_float64():
    """The viewed op's PyTorch forward (the later region's reference, on the chain's module with a weight and
    bias off their identity) is nn.LayerNorm over the chain's dims, to float64 rounding."""
    import torch

    from fusetune.ops import LayerNorm

    op = LayerNorm(normalized_shape=(5, 7), in_rank=5, eps=1e-5)
    viewed = op.on_plane()
    assert (viewed.normalized_shape, viewed.in_rank, viewed.scope) == ((35,), 3, "instance")
    assert "module_shape" not in op.canonical() and viewed.canonical()["module_shape"] == (5, 7)  # old keys stay
    torch.manual_seed(0)
    module = torch.nn.LayerNorm([5, 7]).double()
    with torch.no_grad():
        module.weight.normal_()
        module.bias.normal_()
    x = torch.randn(2, 3, 4, 5, 7, dtype=torch.float64)
    holder = type("Holder", (), {"layer_norm_0": module})()
    namespace = {"F": torch.nn.functional, "self": holder, "x": x.view(24, 1, 35)}
    got = eval(viewed.forward_code("x", "layer_norm_0"), namespace).view(x.shape)
    torch.testing.assert_close(got, module(x), rtol=1e-12, atol=1e-12)


def test_a_layer_norm_after_a_pool_is_a_later_regions_norm():
    """After a pool, region 0 stops (one norm before the pool); the later region reads the pooled tensor, whose
    (C, H, W) the layer norm names: its kernels take it as they take it in region 0."""
    from fusetune.pipeline import later_segments

    plan = _plan("conv2d_maxpool_layernorm_chw_relu")
    assert plan.norm is None and [s.op.kind for s in plan.head] == ["max_pool"]
    (segment,) = later_segments(plan)
    assert segment.kernels and [s.op.kind for s in segment.steps] == ["layer_norm", "relu"]
    later = make_plan(segment.spec)
    assert later.norm.scope == "group" and later.norm.element_affine == "channels" and later.family == "window_map"
    assert later.impl_stages["cudnn"] == ("stats", "finalize", "window_map")


def test_a_reduction_after_a_per_element_affine_is_not_finalized():
    """The mean of w * x_hat + b over a plane is not the plane map of the plane's mean: the rule mean_of_norm
    does not fire, and the main kernels reduce over space after the affine (plane_reduce, direct_main and
    gemm_main index it by position); over the channels they do not take it, and the reduction runs after the
    region. Without the affine it is instance norm's, and finalize computes the mean."""
    from fusetune.config import parse_config
    import yaml

    raw = yaml.safe_load((CHAINS / "conv3d_layernorm_dhw_gelu.yaml").read_text())
    raw["epilogue"] = [raw["epilogue"][0], {"op": "mean", "dim": [2, 3, 4], "keepdim": True}]
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert "mean_of_norm" not in plan.rules and plan.family == "plane_reduce" and not plan.tail
    assert {"cudnn", "direct", "gemm", "gemm_store"} <= set(plan.impl_stages)
    raw["epilogue"][1] = {"op": "amax", "dim": 1, "keepdim": True}
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert plan.family == "window_map" and [s.op.kind for s in plan.head] == ["layer_norm"]
    assert "per-element affine only in a region that ends in a map, a pool or a reduction over space" in plan.ends
    raw["epilogue"][0]["elementwise_affine"] = False  # no affine: instance norm's, finalize's mean
    raw["epilogue"][1] = {"op": "mean", "dim": [2, 3, 4], "keepdim": True}
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert "mean_of_norm" in plan.rules and plan.family is None and not plan.tail


def _lowered(plan, model, y):
    """The kernels' arithmetic in float64, as the plan lowers the norm: per-(n, c) plane sums (the statistics
    pass), finalize's mean and variance over its group of planes (Norm.groups_of; every plane of a sample for
    "group" with one group, its own for "instance"), the map A * v + B with A = rstd (channel_affine false),
    then the per-element weight and bias by Norm.element_affine's index."""
    import torch

    norm = plan.norm
    N, C = y.shape[:2]
    S = y[0, 0].numel()
    planes = y.reshape(N, C, S)
    sums, squares = planes.sum(-1), (planes * planes).sum(-1)
    group = norm.groups_of(C) if norm.scope == "group" else 1
    gsum = sums.reshape(N, C // group, group).sum(-1).repeat_interleave(group, dim=1)
    gsq = squares.reshape(N, C // group, group).sum(-1).repeat_interleave(group, dim=1)
    mean = gsum / (S * group)
    var = (gsq / (S * group) - mean * mean).clamp_min(0.0)
    A = 1.0 / torch.sqrt(var + norm.eps)
    B = -mean * A
    assert not norm.channel_affine
    x = A[..., None] * planes + B[..., None]
    module = getattr(model, plan.head[0].attr)
    if norm.element_affine == "channels":
        x = x * module.weight.reshape(1, C, S) + module.bias.reshape(1, C, S)
    elif norm.element_affine == "spatial":
        x = x * module.weight.reshape(1, 1, S) + module.bias.reshape(1, 1, S)
    return x.reshape(y.shape)


@pytest.mark.parametrize("stem", [f[0] for f in FUSED], ids=[f[0] for f in FUSED])
def test_the_lowering_is_layer_norm_in_float64(stem, tmp_path):
    """The norm as the kernels compute it equals nn.LayerNorm's, weights of either sign per element, on the
    convolution's output (without its bias where the plan drops it: the norm cancels it), at every shape."""
    import torch

    plan = _plan(stem)
    generated = import_file(render(plan).write(tmp_path / "module") / "model.py")
    torch.manual_seed(0)
    model = generated.Model().double()
    module = getattr(model, plan.head[0].attr)
    with torch.no_grad():
        if module.weight is not None:
            module.weight.copy_(torch.where(torch.rand_like(module.weight) < 0.25, -1.0, 1.0)
                                * (0.5 + torch.rand_like(module.weight)))
            module.bias.copy_(0.5 * torch.randn_like(module.bias))
        model.producer.bias.uniform_(-2.0, 2.0)  # a bias far from zero: a dropped one that did not cancel shows
        for shape in plan.spec.shapes:
            y = model.producer(torch.randn(shape, dtype=torch.float64))
            want = module(y)
            kernel_input = y
            if plan.drop_bias:
                bias = model.producer.bias.reshape(1, -1, *([1] * (y.dim() - 2)))
                kernel_input = y - bias
            got = _lowered(plan, model, kernel_input)
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (shape, (got - want).abs().max().item())


def test_the_main_kernels_index_the_weight_by_position():
    """The rendered main kernels read weight and bias by c * S + s (over (C, *spatial)) or by s (over the spatial
    dims): window_map and plane_reduce in both layouts, direct_main and gemm_main at the convolution's output
    position; finalize reads no per-channel weight; without the affine none of them reads them."""
    chw = render(_plan("conv2d_layernorm_chw_gelu")).files
    dhw = render(_plan("conv3d_layernorm_dhw_gelu")).files
    plain = render(_plan("conv2d_layernorm_chw_noaffine_maxpool")).files
    mean = render(_plan("conv2d_layernorm_chw_gelu_scale_mean")).files["plane_reduce.cu"]
    assert mean.count("__ldg(a.norm_weight + (c) * (a.D * a.H * a.W) + ((row + kw) - base))") == 1
    assert mean.count("__ldg(a.norm_bias + (c0 + j) * (a.D * a.H * a.W) + (at + (kd * a.H + kh) * a.W + kw))") == 1
    assert chw["window_map.cu"].count("__ldg(a.norm_weight + (c) * (a.D * a.H * a.W) + ((row + kw) - base))") == 1
    assert chw["window_map.cu"].count("__ldg(a.norm_bias + (c0 + j) * (S) + (in + (kd * a.H + kh) * a.W + kw))") == 1
    assert dhw["window_map.cu"].count("__ldg(a.norm_weight + ((row + kw) - base))") == 1
    assert dhw["window_map.cu"].count("__ldg(a.norm_bias + (in + (kd * a.H + kh) * a.W + kw))") == 1
    for files in (chw, dhw, plain):
        assert "a.norm_weight[c]" not in files["finalize.cu"]
    assert "norm_weight +" not in plain["window_map.cu"]
    # direct_main's S is the plane's size as a constant (Norm.element_plane: 19 x 23 of the norm's [16, 19, 23])
    for files, index in ((chw, "(C0 + j) * (437) + (s)"), (dhw, "a.norm_weight + (s)")):
        mains = [text for name, text in files.items() if name.startswith("direct_main_")]
        assert mains and all(index in text and "chain(acc[j], j, s)" in text for text in mains)
    for files, index in ((chw, "(c) * (a.D * a.H * a.W) + (s)"), (dhw, "a.norm_weight + (s)")):
        mains = [text for name, text in files.items() if name.startswith("gemm_main_")]
        assert mains and all(index in text and "cd, ch, cw, pd, ph, pw)" in text for text in mains)
    assert not any("norm_weight +" in text or "is_invocable" in text for name, text in plain.items()
                   if name.startswith(("direct_main", "gemm_main", "gemm_stats")))


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_main_kernels_with_a_per_element_affine_compile(tmp_path):
    """Both indexings (channels, spatial) of window_map and of one direct_main variant, gemm_main's over
    (C, H, W), and plane_reduce's, compile for sm_90 without spills (six small units)."""
    for stem in ("conv2d_layernorm_chw_gelu", "conv2d_layernorm_hw_relu_avgpool",
                 "conv2d_layernorm_chw_gelu_scale_mean"):
        files = render(_plan(stem))
        folder = files.write(tmp_path / stem)
        if stem.endswith("_mean"):
            units = ["plane_reduce.cu"]
        else:
            units = ["window_map.cu"] + [min((name for name in files.files if name.startswith(f"{stage}_")), key=len)
                                         for stage in ("direct_main", "gemm_main") if f"{stage}.cu" in files.files]
        for unit in units:
            done = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-Xptxas",
                                   "-warn-spills", "-c", unit, "-o", unit + ".o"], cwd=folder, capture_output=True,
                                  text=True, timeout=300)
            log = done.stdout + done.stderr
            assert done.returncode == 0, log[-3000:]
            assert "spill stores" in log and all(" 0 bytes spill stores" in line for line in log.splitlines()
                                                 if "spill stores" in line), log[-2000:]
