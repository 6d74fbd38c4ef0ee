"""Mean centring, x - x.mean(dim, keepdim=True) (fusetune/ops/norm.py's MeanCentre, written ``{op: sub, by:
{op: mean, dim: [...], keepdim: true}}``), and scalar parameters (``shape: scalar``), on the CPU: the config,
the plan (which scope the statistics pass serves, where a later region on a plane view takes it, where PyTorch
runs it and why), the rewrites (a norm after it that cancels it; the producer's bias it cancels), the rendered
finalize map (v - mean), the lowering in float64 (the kernels' per-plane sums and finalize's grouping against
the op's own PyTorch forward), and the importer's matching. The kernels on a GPU: tests/test_gpu_centring.py.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from fusetune.codegen import render
from fusetune.config import load_config, parse_config
from fusetune.errors import ConfigError
from fusetune.ops import MeanCentre
from fusetune.pipeline import later_segments
from fusetune.plan import make_plan

from conftest import ROOT, import_file

NVCC = shutil.which("nvcc")
CENTRING = ROOT / "tests" / "centring"
CHAINS = ROOT / "tests" / "chains"


def _path(stem: str):
    for folder in (CENTRING, CHAINS, ROOT / "tests" / "views"):
        if (folder / f"{stem}.yaml").exists():
            return folder / f"{stem}.yaml"
    raise AssertionError(stem)


def _plan(stem: str):
    return make_plan(load_config(_path(stem)))


#: Configs whose region 0 holds the centring: (config, scope, whether the producer's bias is dropped, worlds
#: beside the reference's own forwards).
IN_REGION_ZERO = [
    ("convt2d_centre_spatial_tanh_maxpool", "instance", True, {"cudnn", "direct"}),
    ("centre_chw_gelu", "group", False, {"cudnn", "direct", "gemm", "gemm_store", "gemm_cluster"}),
    ("centre_batch_scope_relu", "batch", True, {"cudnn", "direct", "gemm", "gemm_store"}),
    ("centre_chw_spatial_mean", "group", False, {"cudnn", "direct", "gemm"}),
]


def test_the_config_spells_it_with_pytorchs_names():
    spec = load_config(_path("centre_batch_scope_relu"))
    op = spec.epilogue[0]
    assert isinstance(op, MeanCentre) and op.kind == "sub" and op.dims == (0, 2, 3, 4) and op.in_rank == 5
    assert op.canonical() == {"kind": "sub", "by": {"op": "mean", "dim": [0, 2, 3, 4], "keepdim": True}, "in_rank": 5}
    assert op.forward_code("x", None) == "(x - x.mean(dim=(0, 2, 3, 4), keepdim=True))"
    x = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64)
    torch.testing.assert_close(eval(op.forward_code("x", None)), x - torch.mean(x, dim=(0, 2, 3, 4), keepdim=True))
    assert op.role == "norm" and not op.channel_affine and op.element_affine == "" and op.centres


@pytest.mark.parametrize("dims, scope", [((2, 3), "instance"), ((1, 2, 3), "group"), ((0, 2, 3), "batch"),
                                         ((3,), "dims"), ((1,), "dims"), ((0,), "dims"), ((0, 1, 2, 3), "dims")])
def test_the_scope_is_the_statistics_sets_its_dims_are(dims, scope):
    op = MeanCentre(dims=dims, in_rank=4)
    assert op.scope == scope
    assert op.groups_of(8) == (8 if scope == "group" else 1)
    assert op.trailing == (dims in ((2, 3), (1, 2, 3), (3,)))


@pytest.mark.parametrize("stem, scope, dropped, worlds", IN_REGION_ZERO, ids=[r[0] for r in IN_REGION_ZERO])
def test_region_zero_holds_the_centring(stem, scope, dropped, worlds):
    from fusetune.worlds import WORLDS

    plan = _plan(stem)
    assert isinstance(plan.norm, MeanCentre) and plan.norm.scope == scope and plan.needs_stats
    assert plan.drop_bias == dropped and not plan.tail
    assert {w for w in plan.impl_stages if not WORLDS[w].runs_reference} == worlds


def test_a_spatial_mean_after_it_comes_from_the_statistics():
    plan = _plan("centre_chw_spatial_mean")
    assert "mean_of_norm" in plan.rules and plan.family is None


def test_a_norm_over_sets_inside_the_centrings_cancels_it():
    """Instance norm after a centring over each plane (through a scale by a number): the centring is dropped,
    and the producer's bias cancels in the norm. A group norm's sets span planes with different constants: kept."""
    plan = _plan("centre_scale_instancenorm")
    assert "norm_cancels_centring" in plan.rules and [s.op.kind for s in plan.head] == ["mul", "instance_norm"]
    assert plan.drop_bias
    plan = _plan("centre_spatial_groupnorm")
    assert "norm_cancels_centring" not in plan.rules and isinstance(plan.norm, MeanCentre)
    (segment,) = later_segments(plan)
    assert segment.kernels and [s.op.kind for s in segment.steps] == ["group_norm"]


@pytest.mark.parametrize("centre, norm, cancels", [
    ([1, 2, 3], {"op": "instance_norm"}, True),  # a plane inside its sample
    ([1, 2, 3], {"op": "group_norm", "num_groups": 2}, True),  # a group inside its sample
    ([1, 2, 3], {"op": "layer_norm", "normalized_shape": [8, 9, 11]}, True),
    ([0, 2, 3], {"op": "instance_norm"}, True),  # a plane inside its channel over the batch
    ([0, 2, 3], {"op": "batch_norm"}, False),  # its running statistics would see the centring
    ([0, 2, 3], {"op": "sub", "by": {"op": "mean", "dim": [0, 2, 3], "keepdim": True}}, True),
    ([2, 3], {"op": "layer_norm", "normalized_shape": [9, 11]}, True),
    ([2, 3], {"op": "batch_norm", "training": False}, False),  # running statistics: no mean subtracted
    ([2, 3], {"op": "layer_norm", "normalized_shape": [11]}, True),  # a row inside its plane
    ([3], {"op": "layer_norm", "normalized_shape": [11]}, True),  # the same rows (both on a plane view)
    ([3], {"op": "layer_norm", "normalized_shape": [9, 11]}, False),  # a plane spans rows of other constants
])
def test_the_cancelling_rule_follows_the_sets(centre, norm, cancels):
    """Where it fires, the chain without the centring is the chain with it, in float64 (its output and a batch
    norm's running statistics; the norm's affine off its identity, a convolution output far from zero mean);
    where it does not, it would not be."""
    import torch.nn.functional as F

    from fusetune.regions import reference_attr, rewrite

    raw = {"name": "c", "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 8, "kernel_size": 3},
           "epilogue": [{"op": "sub", "by": {"op": "mean", "dim": centre, "keepdim": True}}, norm],
           "shapes": [[2, 3, 11, 13]]}
    spec = parse_config(raw, "c.yaml")
    plan = make_plan(spec)
    assert ("norm_cancels_centring" in plan.rules) == cancels
    model = torch.nn.Module()  # the reference's modules, by the attributes the forward lines read
    for i, op in enumerate(spec.epilogue):
        if reference_attr(spec, i) is not None:
            setattr(model, reference_attr(spec, i), eval(op.module_code(8, 2), {"nn": torch.nn, "torch": torch}))
    model.double()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            tensor.uniform_(0.5, 1.5)
    x = 3.0 + torch.randn(2, 8, 9, 11, dtype=torch.float64) * torch.rand(1, 8, 9, 1, dtype=torch.float64)

    def run(ops):
        """The output and the running statistics the ops leave (a training batch norm's: the centring shifts them)."""
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()
        value = x
        for op, attr in ops:
            value = eval(op.forward_code("x", attr), {"self": model, "x": value, "F": F, "torch": torch})
        return [value.detach()] + [b.clone() for name, b in model.named_buffers() if "running" in name]

    def same(a, b):
        return all(torch.allclose(p, q, rtol=1e-9, atol=1e-9) for p, q in zip(a, b))
    chain = [(op, reference_attr(spec, i)) for i, op in enumerate(spec.epilogue)]
    without = run(chain[1:])
    assert same(run(chain), without) == cancels
    assert same(run([(step.op, step.attr) for step in rewrite(spec).steps]), without) == cancels


def test_over_the_last_dims_a_later_region_takes_it_on_a_plane_view():
    plan = _plan("centre_last_dims_tanh")
    assert plan.head == () and "a mean centring over dims [3, 4] of a rank-5 input" in plan.ends
    (segment,) = later_segments(plan)
    assert segment.kernels and [s.op.kind for s in segment.steps] == ["sub", "tanh"]
    assert segment.view.fact() == {"first": 3, "last": 4, "form": "plane", "after": "same"}
    later = make_plan(segment.spec)
    assert later.norm.dims == (2,) and later.norm.scope == "instance" and later.family == "window_map"


def test_over_the_channels_it_runs_in_pytorch_and_says_why():
    plan = _plan("centre_channels_pytorch")
    first, second = later_segments(plan)
    assert not first.kernels and "not its last dims, nor a scope of the statistics pass" in first.why
    assert second.kernels and [s.op.kind for s in second.steps] == ["relu"]


@pytest.mark.parametrize("stem", ["convt2d_centre_spatial_tanh_maxpool", "centre_chw_gelu"])
def test_finalize_maps_v_minus_the_mean(stem):
    files = render(_plan(stem)).files
    finalize = files["finalize.cu"]
    assert "*A = 1.0;" in finalize and "*B = -mean;" in finalize and "rstd" not in finalize
    cluster = [text for name, text in files.items() if name.startswith("gemm_cluster_")]  # a unit per variant
    assert all("const double A = 1.0, Bm = -mean;" in text for text in cluster)
    assert bool(cluster) == ("gemm_cluster" in _plan(stem).impl_stages)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_finalize_compiles_for_sm90_without_spills(tmp_path):
    """finalize's centring map (seconds; the chains' device functions, a scalar parameter's load among them, are
    tests/test_chains.py's one nvcc run)."""
    source = tmp_path / "finalize.cu"
    source.write_text(render(_plan("centre_chw_gelu")).files["finalize.cu"])
    command = [NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-c", str(source),
               "-o", str(source.with_suffix(".o"))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    spills = [line for line in done.stderr.splitlines() if "spill" in line]
    assert spills and all("0 bytes spill stores, 0 bytes spill loads" in line for line in spills), done.stderr


def _lowered(norm, y):
    """The kernels' arithmetic in float64: per-(n, c) plane sums (the statistics pass), finalize's mean over its
    scope's planes (its own; every plane of the sample; the channel's plane of every sample), the map v - mean."""
    N, C = y.shape[:2]
    planes = y.reshape(N, C, -1)
    S = planes.shape[-1]
    sums = planes.sum(-1)
    if norm.scope == "instance":
        mean = sums / S
    elif norm.scope == "group":
        mean = (sums.sum(1, keepdim=True) / (S * C)).expand(N, C)
    else:
        assert norm.scope == "batch"
        mean = (sums.sum(0, keepdim=True) / (S * N)).expand(N, C)
    return (planes - mean[..., None]).reshape(y.shape)


@pytest.mark.parametrize("stem", [r[0] for r in IN_REGION_ZERO if r[0] != "centre_chw_spatial_mean"])
def test_the_lowering_is_the_centring_in_float64(stem, tmp_path):
    """On the convolution's output (without its bias where the plan drops it, a bias far from zero), at every
    shape: the kernels' centring equals the reference model's, to float64 rounding."""
    plan = _plan(stem)
    generated = import_file(render(plan).write(tmp_path / "module") / "model.py")
    torch.manual_seed(0)
    model = generated.Model().double()
    with torch.no_grad():
        model.producer.bias.uniform_(-2.0, 2.0)
        for shape in plan.spec.shapes:
            y = model.producer(torch.randn(shape, dtype=torch.float64))
            want = eval(plan.norm.forward_code("y", None))
            bias = model.producer.bias.reshape(1, -1, *([1] * (y.dim() - 2)))
            got = _lowered(plan.norm, y - bias if plan.drop_bias else y)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------------------------
# Scalar parameters


def test_a_scalar_parameter_applies_after_a_channel_reduction():
    """A single-value parameter (shape: scalar, 0-dim in the generated model) after a channel min: the view that
    keeps the dim moves after the maps (they read no per-channel value), which channel_reduce's final chain
    applies, reading the parameter's one value whatever the channel."""
    spec = load_config(CHAINS / "conv2d_min_channels_keepdim_scalar_bias_tanh.yaml")
    assert [p.shape for p in spec.parameters] == ["scalar", "scalar"]
    assert spec.parameters[0].module_code(10, 2) == "nn.Parameter(torch.randn(()))"
    assert spec.parameters[0].canonical() == {"name": "bias", "init": "randn", "shape": "scalar"}
    plan = make_plan(spec)
    assert plan.family == "channel_reduce" and [op.kind for op in plan.final] == ["add", "mul", "tanh"]
    assert all(step.op.role == "view" for step in plan.tail)
    files = render(plan).files
    assert "tanhf(((v + __ldg(a.p[0])) * __ldg(a.p[1])))" in files["channel_reduce.cu"]
    assert "a.p[0] + c" not in files["channel_reduce.cu"]


def test_a_per_channel_parameters_cache_key_is_unchanged():
    """``shape`` joins a parameter's canonical form only where it is scalar: the keys of every config before
    it stay as they were."""
    raw = {"name": "k", "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 8, "kernel_size": 3},
           "parameters": {"s": {"init": "ones"}}, "epilogue": [{"op": "mul", "by": "s"}], "shapes": [[2, 3, 9, 9]]}
    assert parse_config(raw, "k.yaml").canonical()["parameters"] == [{"name": "s", "init": "ones"}]


def test_a_scalar_parameter_runs_on_a_later_regions_view():
    """A map by a scalar parameter after a layer norm over the last dim stays in the norm's region on its plane
    view (a per-channel one would need a region of its own, on the tensor as it is)."""
    raw = {"name": "v", "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 8, "kernel_size": 3},
           "parameters": {"t": {"shape": "scalar", "init": "randn"}},
           "epilogue": [{"op": "layer_norm", "normalized_shape": [11]}, {"op": "mul", "by": "t"}],
           "shapes": [[2, 3, 9, 13]]}
    (segment,) = later_segments(make_plan(parse_config(raw, "v.yaml")))
    assert segment.view is not None and [s.op.kind for s in segment.steps] == ["layer_norm", "mul"]
    assert [p.name for p in segment.spec.parameters] == ["t"]


def test_a_per_channel_parameter_after_a_channel_reduction_says_to_declare_it_scalar():
    raw = {"name": "p", "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 8, "kernel_size": 3},
           "parameters": {"t": {"init": "randn"}},
           "epilogue": [{"op": "amax", "dim": 1, "keepdim": True}, {"op": "mul", "by": "t"}], "shapes": [[2, 3, 9, 9]]}
    with pytest.raises(ConfigError, match="declare it shape: scalar"):
        parse_config(raw, "p.yaml")


def test_the_importer_binds_a_one_value_parameter_as_a_scalar_view():
    from fusetune.importer import declared_view, per_channel_form

    assert per_channel_form((1, 1, 1), (2, 1, 7, 9), 6) == "scalar"  # after a channel reduction (keepdim)
    assert per_channel_form((6, 1, 1), (2, 1, 7, 9), 6) is None  # a per-channel one would broadcast
    assert per_channel_form((1, 1, 1), (2, 6), 6) is None  # would make a 2-D value 3-D
    user = torch.nn.Parameter(torch.randn(1, 1, 1))
    view = declared_view(user, ())
    assert view.shape == () and view.data_ptr() == user.data_ptr()
