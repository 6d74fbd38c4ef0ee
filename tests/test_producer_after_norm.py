"""An op that reads the convolution's own output (``by: producer``, a residual ``x + conv(x)``) after the norm of
region 0, before its pool or reduction: the mid chain (plan.PRODUCER_SLOTS). A norm maps each value in place, so
every main stage still has the convolution's value at that position (the cuDNN world's main kernels load it,
the worlds that compute the convolution inside hold it, the recompute worlds recompute it): ft_mid takes it
beside the value (codegen's mid_call), and a world whose main stage lacks it (facts.PRODUCER_STAGES) refuses the
region. After a pool or a reduction the value at a position is gone: the op runs after the region, and the
plan says why. The kernels on a GPU: tests/test_gpu_producer_after_norm.py.

The chains: the corpus's two (tests/chains/) and one per main stage beside them (tests/producer_after_norm/).
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import load_config, parse_config
from fusetune.pipeline import later_segments
from fusetune.plan import make_plan
from fusetune.worlds import WORLDS, refusals
from fusetune.worlds.facts import NORM_MAP_STAGES, PRODUCER_STAGES, producer_refusal

from conftest import ROOT, import_file

NVCC = shutil.which("nvcc")
CORPUS = ROOT / "tests" / "chains"
MORE = ROOT / "tests" / "producer_after_norm"
#: Each chain, its folder, and the worlds of kernels its region 0 offers (beside the reference's own forwards).
CHAINS = [
    (CORPUS, "conv2d_batchnorm_relu_add_producer", {"cudnn", "direct", "gemm", "gemm_store"}),
    (CORPUS, "conv3d_groupnorm_add_producer_relu_maxpool", {"cudnn", "direct", "gemm", "gemm_store"}),
    (MORE, "conv2d_batchnorm_sub_producer_amax_spatial", {"cudnn", "direct", "gemm", "gemm_store"}),
    (MORE, "conv2d_batchnorm_mul_producer_logsoftmax_channels", {"cudnn", "gemm_wide"}),
    (MORE, "conv2d_groupnorm_add_producer_scale_maxpool", {"cudnn", "direct", "gemm", "gemm_store", "gemm_cluster"}),
    (MORE, "conv3d_instancenorm_mul_producer_max_channels",
     {"cudnn", "direct", "gemm", "gemm_store", "gemm_cluster"}),
    (MORE, "conv3d_wide72_batchnorm_add_producer_selu_maxpool", {"cudnn", "gemm_wide", "gemm_wide_recompute"}),
]
IDS = [c[1] for c in CHAINS]


def _plan(folder, stem: str):
    return make_plan(load_config(folder / f"{stem}.yaml"))


def test_the_more_folder_holds_exactly_the_listed_chains():
    assert sorted(p.stem for p in MORE.glob("*.yaml")) == sorted(stem for folder, stem, _ in CHAINS if folder == MORE)


@pytest.mark.parametrize("folder, stem, worlds", CHAINS, ids=IDS)
def test_region_zero_takes_the_whole_chain(folder, stem, worlds):
    plan = _plan(folder, stem)
    assert all(step.op.role == "view" for step in plan.tail), plan.regions()
    assert not any(segment.kernels for segment in later_segments(plan)), plan.regions()
    assert plan.norm is not None and any(op.uses_producer() for op in plan.mid) and not plan.pre
    assert not plan.drop_bias and "norm_cancels_bias" not in plan.rules  # the output it reads has the bias
    assert {impl for impl in plan.impl_stages if not WORLDS[impl].runs_reference} == worlds
    assert "gemm_extrema" not in plan.impl_stages  # a producer op is not monotone: extrema_map never takes it


def test_every_producer_stage_is_exercised_and_no_other_applies_the_mid_chain():
    """The chains above run every main stage of facts.PRODUCER_STAGES; the only norm-map stage left out is
    extrema_map, which maps a window's largest and smallest values alone."""
    stages = {stage for folder, stem, _ in CHAINS for impl, run in _plan(folder, stem).impl_stages.items()
              for stage in run}
    assert set(PRODUCER_STAGES) <= stages
    assert set(NORM_MAP_STAGES) - set(PRODUCER_STAGES) == {"extrema_map"}


def test_a_world_with_a_main_stage_that_lacks_the_value_refuses():
    plan = _plan(CORPUS, "conv3d_groupnorm_add_producer_relu_maxpool")
    reason = producer_refusal(plan, ("gemm_stats", "finalize", "extrema_map"))
    assert reason is not None and "extrema_map does not have it" in reason and "by: producer" in reason
    assert producer_refusal(plan, ("stats", "finalize", "window_map")) is None
    plain = _plan(CORPUS, "conv3d_wide72_batchnorm_selu_maxpool")  # no producer op: nothing to refuse
    assert producer_refusal(plain, ("gemm_stats", "finalize", "extrema_map")) is None
    assert "gemm_extrema" in refusals(plan)


def test_the_instance_norm_keeps_the_bias_only_because_the_chain_reads_the_output():
    """Without the producer op the instance norm cancels the bias (the rule fires): the check above can fail."""
    raw = yaml.safe_load((MORE / "conv3d_instancenorm_mul_producer_max_channels.yaml").read_text())
    raw = {**raw, "epilogue": [raw["epilogue"][0], {"op": "mul", "by": 2.0}, raw["epilogue"][2]]}
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert plan.drop_bias and "norm_cancels_bias" in plan.rules


#: Ops after which the value keeps the convolution output's shape (so that ``by: producer`` is valid there; the
#: config refuses it after a shape change) but no longer stands for its position.
@pytest.mark.parametrize("after, reason", [
    ({"op": "max_pool", "kernel_size": 3, "stride": 1, "padding": 1}, "a pooled value stands for a window of positions"),
    ({"op": "softmax", "dim": 1}, "reduction or softmax"),
])
def test_after_a_pool_or_a_softmax_it_runs_after_the_region_and_the_plan_says_why(after, reason):
    raw = yaml.safe_load((CORPUS / "conv3d_groupnorm_add_producer_relu_maxpool.yaml").read_text())
    raw = {**raw, "epilogue": [raw["epilogue"][0], after, {"op": "add", "by": "producer"}]}
    plan = make_plan(parse_config(raw, "x.yaml"))
    # Only region 0's kernels have the convolution's output: it computes the convolution alone, the rest
    # reads its output.
    assert not plan.head and [step.op.kind for step in plan.tail][-1] == "add"
    assert plan.ends.startswith("x.yaml: epilogue[2] (add) reads the convolution's output (by: producer) after a ")
    assert reason in plan.ends and "region 0 computes the convolution alone" in plan.ends
    lines = plan.regions()
    assert any(line.startswith("region ") and "(PyTorch" in line and "epilogue[2] (add)" in line for line in lines)
    assert reason in "\n".join(lines), lines


def test_cli_plan_shows_the_residual_in_region_zero():
    path = CORPUS / "conv2d_batchnorm_relu_add_producer.yaml"
    out = CliRunner().invoke(main, ["plan", str(path)])
    assert out.exit_code == 0, out.output
    assert "mid=relu,add" in out.output and "bias=epilogue" in out.output
    assert ("region 0 (fused kernels): conv2d -> epilogue[0] (batch_norm), epilogue[1] (relu), epilogue[2] (add)"
            in out.output)
    assert "region 1" not in out.output


#: Where each main stage hands ft_mid the convolution's value (as it holds it, before the bias): patterns that
#: each of its units matches (both layouts of the cuDNN world's kernels; gemm_cluster's reduction over the
#: channels or its pooled map; wide_main's chain up to the pool, which defines ft_y itself).
CALLS = {
    "window_map": (r"ft_mid\(x, __ldg\(row \+ kw\), c, a\)", r"ft_mid\(x, xs\[j\], c0 \+ j, a\)"),
    "plane_reduce": (r"ft_mid\(x, __ldg\(row \+ kw\), c, a\)", r"ft_mid\(x, xs\[j\], c0 \+ j, a\)"),
    "channel_reduce": (r"ft_mid\(x, xs\[j\], c, a\)", r"ft_mid\(x, xs\[u\]\[j\], c0 \+ j, a\)"),
    "channel_softmax": (r"ft_mid\(x, xs\[j\], c, a\)", r"ft_mid\(x, xs\[j\], c0 \+ j, a\)"),
    "direct_main": (r"const float raw = v;", r"ft_mid\(v, raw, C0 \+ j, a\)"),
    "gemm_main": (r"ft_mid\(v, raw, c, a\)",),
    "gemm_cluster": (r"ft_mid\(fmaf\(.*\), (value\(i, c, m\)|kept_value( \+ shift)?), c, a\)",),
    "wide_main": (r"const float ft_y = raw \+ a\.bias\[c\];",),
}


@pytest.mark.parametrize("folder, stem, worlds", CHAINS, ids=IDS)
def test_every_main_stage_hands_the_value_to_the_mid_chain(folder, stem, worlds):
    plan = _plan(folder, stem)
    files = render(plan).files
    for stage in set(plan.stages) & set(PRODUCER_STAGES):
        units = [text for name, text in files.items()  # (not the launchers of a stage of many units)
                 if (name == f"{stage}.cu" or name.startswith(f"{stage}_")) and "__global__" in text]
        assert units, stage
        for text in units:
            if stage != "wide_main":
                assert "float ft_mid(float v, float raw, int64_t c, const FtArgs& a)" in text, stage
                assert "const float ft_y = raw + __ldg(a.bias + c);" in text, stage
            assert "ft_mid(x, c" not in text and "ft_mid(v, c" not in text, stage
            for call in CALLS[stage]:
                assert re.search(call, text), (stage, call)


def test_a_chain_without_the_producer_op_keeps_the_plain_mid_chain():
    files = render(_plan(CORPUS, "conv3d_wide72_batchnorm_selu_maxpool")).files
    assert "float ft_mid(float v, int64_t c, const FtArgs& a)" in files["window_map.cu"]
    assert "float raw" not in files["window_map.cu"] and "ft_mid(x, c, a)" in files["window_map.cu"]


def _norm_map(plan, model, v):
    """A and B per (sample, channel) as the statistics pass and finalize compute them, in float64: sums of each
    plane, combined over the norm's scope (batch: every sample; group: Norm.groups_of channels; instance: the
    plane), the biased variance, then the norm's per-channel affine where it has one."""
    import torch

    norm = plan.norm
    N, C = v.shape[:2]
    planes = v.reshape(N, C, -1)
    S = planes.shape[-1]
    sums, squares = planes.sum(-1), (planes * planes).sum(-1)
    if norm.scope == "batch":
        sums, squares, count = sums.sum(0, keepdim=True).expand(N, C), squares.sum(0, keepdim=True).expand(N, C), N * S
    else:
        group = norm.groups_of(C) if norm.scope == "group" else 1
        sums = sums.reshape(N, C // group, group).sum(-1).repeat_interleave(group, dim=1)
        squares = squares.reshape(N, C // group, group).sum(-1).repeat_interleave(group, dim=1)
        count = S * group
    mean = sums / count
    rstd = 1.0 / torch.sqrt((squares / count - mean * mean).clamp_min(0.0) + norm.eps)
    module = getattr(model, plan.head[0].attr)
    weight = module.weight if getattr(module, "weight", None) is not None else torch.ones(C, dtype=v.dtype)
    bias = module.bias if getattr(module, "bias", None) is not None else torch.zeros(C, dtype=v.dtype)
    A = rstd * weight
    return A, bias - mean * A


def _lowered(plan, model, x):
    """The region as its kernels compute it, in float64: the convolution without its bias (cuDNN runs it so, or
    the kernels compute it so), the first kernel adding the bias in ft_pre where the plan keeps it, the norm's
    map, then the mid chain with ``y`` = the convolution's value as ft_mid rebuilds it (the value the kernel
    holds plus the bias, as ft_pre adds it), then the pool and the reduction as PyTorch's lines."""
    import torch
    import torch.nn.functional as F

    shape = [1, -1] + [1] * (x.dim() - 2)
    raw = model.producer(x) - model.producer.bias.reshape(shape)
    y = raw + model.producer.bias.reshape(shape) if plan.bias_in_epilogue else raw
    v = y
    for step in plan.head:
        if step.op is plan.norm:
            A, B = _norm_map(plan, model, v)
            v = A.reshape(*A.shape, *[1] * (v.dim() - 2)) * v + B.reshape(*B.shape, *[1] * (v.dim() - 2))
            continue
        v = eval(step.op.forward_code("x", step.attr), {"self": model, "x": v, "y": y, "F": F, "torch": torch})  # noqa: S307
    for step in plan.tail:  # the views that restore a reduction's shape
        v = eval(step.op.forward_code("x", step.attr), {"self": model, "x": v, "F": F, "torch": torch})  # noqa: S307
    return v


@pytest.mark.parametrize("folder, stem, worlds", CHAINS, ids=IDS)
def test_the_lowering_is_the_chain_in_float64(folder, stem, worlds, tmp_path):
    """The kernels' order of work (the bias where the plan puts it, the norm's map from per-plane sums, the mid
    chain reading the convolution's value with its bias) equals the reference model, at every shape, norms off
    their identity and the bias far from zero (a dropped bias shows)."""
    import torch

    plan = _plan(folder, stem)
    generated = import_file(render(plan).write(tmp_path / "module") / "model.py")
    torch.manual_seed(0)
    model = generated.Model().double()
    with torch.no_grad():
        module = getattr(model, plan.head[0].attr)
        if getattr(module, "weight", None) is not None:
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.5, 0.5)
        for name, value in model.named_parameters():
            if name in plan.param_names:
                value.uniform_(-1.5, 1.5)
        model.producer.bias.uniform_(-2.0, 2.0)
        for shape in plan.spec.shapes:
            x = torch.randn(shape, dtype=torch.float64)
            want = model(x)
            got = _lowered(plan, model, x)
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (shape, (got - want).abs().max().item())


#: A few units compiled for sm_90 without spills (CI time): the first variant of each stage that computes the
#: convolution inside (each hands ft_mid the value its own way), and channel_reduce's (both layouts' loads).
#: The corpus chains' common header, with ft_mid reading the value, is tests/test_chains.py's; the other cuDNN
#: world stages call ft_mid as channel_reduce does.
UNITS = [
    ("conv3d_groupnorm_add_producer_relu_maxpool", "direct_main_0.cu"),
    ("conv3d_groupnorm_add_producer_relu_maxpool", "gemm_main_0.cu"),
    ("conv2d_groupnorm_add_producer_scale_maxpool", "gemm_cluster_0.cu"),
    ("conv3d_wide72_batchnorm_add_producer_selu_maxpool", "wide_main_0.cu"),
    ("conv3d_instancenorm_mul_producer_max_channels", "channel_reduce.cu"),
]


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("stem, unit", UNITS, ids=[u[1].split(".")[0] for u in UNITS])
def test_the_main_stages_compile_for_sm90_without_spills(stem, unit, tmp_path):
    folder = next(f for f, s, _ in CHAINS if s == stem)
    files = render(_plan(folder, stem))
    where = files.write(tmp_path / stem)
    done = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-c", unit, "-o", unit + ".o"],
                          cwd=where, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    spills = [line for line in log.splitlines() if "spill stores" in line]
    assert spills and all(" 0 bytes spill stores" in line for line in spills), log[-2000:]
