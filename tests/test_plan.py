"""Lowering op chains to kernel stages."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import yaml
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.config import load_config, parse_config
from fusetune.plan import make_plan
from fusetune.tiles import gemm_refusal
from fusetune.worlds import WORLDS, conv_passes, refusals
from fusetune.worlds import all_facts as world_facts
from fusetune.worlds.facts import pool_at_extremes, pool_increasing

from conftest import REFERENCE_WORLDS, ROOT, SEEDS

EXPECTED = {
    # seed: (stages after cuDNN, family, drop_bias, stages with the convolution inside: CUDA cores, tensor cores)
    "groupnorm": (("stats", "finalize", "window_map"), "window_map", False, ("direct_stats", "finalize", "direct_main"),
                  ("gemm_stats", "finalize", "gemm_main")),
    "instancenorm": (("stats", "finalize", "channel_reduce"), "channel_reduce", True,
                     ("direct_stats", "finalize", "direct_main"), ("gemm_stats", "finalize", "gemm_main")),
    # 64 x 128 x 5^3 weights: too many for constant memory; a transposed convolution: not the whole-weights
    # tensor-core kernels (the K-tiled one, gemm_wide: test_wide_kernel_where_the_others_do_not_take_it)
    "batchnorm": (("stats", "finalize"), None, False, (), ()),
    "maxpool_gap": (("plane_reduce",), "plane_reduce", False, ("direct_main",), ()),
}


def offers(plan, impl: str) -> bool:
    """Whether the world ``impl`` takes the plan's region (fusetune.worlds)."""
    return impl in plan.impl_stages


def world_stages(plan, impl: str) -> tuple[str, ...]:
    """The world's stages for the region, empty where it does not take it."""
    return plan.impl_stages.get(impl, ())


def fact(plan, name: str) -> bool:
    """A world's yes/no fact of the region (codegen.plan_facts), as a bool."""
    return bool(world_facts(plan)[name])


def _raw(key: str) -> dict:
    return copy.deepcopy(yaml.safe_load(SEEDS[key].read_text()))


def _plan(key: str, epilogue: list, **producer):
    raw = _raw(key)
    raw["epilogue"] = epilogue
    raw["producer"].update(producer)
    return make_plan(parse_config(raw, "x.yaml"))


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_seed_plans(key):
    plan = make_plan(load_config(SEEDS[key]))
    stages, family, drop_bias, direct, gemm = EXPECTED[key]
    assert plan.impl_stages["cudnn"] == stages and world_stages(plan, "direct") == direct and world_stages(plan, "gemm") == gemm
    assert offers(plan, "direct") is bool(direct) and offers(plan, "gemm") is bool(gemm)
    # The convolution once (gemm_extrema) where a norm's monotone chain ends in a max pool: conv2d.
    assert offers(plan, "gemm_extrema") is (key == "groupnorm")
    extrema = ("gemm_stats", "finalize", "extrema_map") if offers(plan, "gemm_extrema") else ()
    assert world_stages(plan, "gemm_extrema") == extrema
    # The statistics from spectra where the output is a full transposed convolution's norm statistics alone.
    spectral = ("spectral_stats", "finalize") if key == "batchnorm" else ()
    assert offers(plan, "spectral") is bool(spectral) and world_stages(plan, "spectral") == spectral
    # One kernel on a thread-block cluster per sample where the norm's statistics lie within a sample.
    cluster = ("gemm_cluster",) if key in ("groupnorm", "instancenorm") else ()
    assert offers(plan, "gemm_cluster") is bool(cluster) and world_stages(plan, "gemm_cluster") == cluster
    # The K-tiled tensor-core kernel where a norm needs statistics of a convolution the others do not take.
    wide = ("wide_stats", "finalize") if key == "batchnorm" else ()
    assert fact(plan, "wide") is bool(wide) and world_stages(plan, "gemm_wide") == wide
    # ... whose main kernel takes no seed: none left for it, the gemm world's convolutions, and the
    # transposed max-pool seed's 16 channels, the direct kernels' (a tile of 64 would multiply zeros)
    assert not fact(plan, "wide_main") and world_stages(plan, "gemm_wide_recompute") == ()
    assert plan.stages == tuple(dict.fromkeys(stages + direct + gemm + extrema + cluster + wide + spectral))  # finalize serves every world
    # The convolution once, written out (gemm_store), wherever the gemm world has two passes.
    store = ("gemm_stats", "finalize", family) if len(gemm) == 3 else ()
    assert world_stages(plan, "gemm_store") == store
    assert list(plan.impl_stages) == (["cudnn"] + ["direct"] * bool(direct) + ["gemm"] * bool(gemm)
                                      + ["gemm_extrema"] * bool(extrema) + ["gemm_store"] * bool(store)
                                      + ["gemm_cluster"] * bool(cluster) + ["gemm_wide"] * bool(wide)
                                      + ["spectral"] * bool(spectral) + list(REFERENCE_WORLDS))
    assert plan.family == family
    assert plan.drop_bias is drop_bias
    assert plan.needs_stats is ("stats" in stages)
    assert f"stages={'+'.join(stages)}" in plan.describe()


def test_direct_kernels_only_where_they_fit():
    # 8 x 64 x 3 x 3 weights fit; 8 x 256 x 3 x 3 (18432 floats, 72 KB) do not.
    assert offers(_plan("groupnorm", [{"op": "relu"}]), "direct")
    assert not offers(_plan("groupnorm", [{"op": "relu"}], out_channels=256), "direct")
    # channels not a multiple of 2 (the smallest channel tile), and a channel reduction over more than 32
    assert not offers(_plan("groupnorm", [{"op": "relu"}], out_channels=31), "direct")
    assert not offers(_plan("groupnorm", [{"op": "max", "dim": 1}], out_channels=64), "direct")
    assert offers(_plan("groupnorm", [{"op": "max", "dim": 1}], out_channels=32), "direct")


def test_tensor_core_kernels_only_where_they_fit():
    assert offers(_plan("groupnorm", [{"op": "relu"}]), "gemm")
    # channels in whole MMA tiles of 8, at most 64 of them, and not transposed
    assert not offers(_plan("groupnorm", [{"op": "relu"}], out_channels=60), "gemm")
    assert not offers(_plan("groupnorm", [{"op": "relu"}], out_channels=72), "gemm")
    assert offers(_plan("groupnorm", [{"op": "relu"}], out_channels=40), "gemm")
    assert not offers(_plan("maxpool_gap", [{"op": "relu"}]), "gemm")
    # weights staged in shared memory: K (in channels x taps, padded to 8) x the channel stride <= 16384 floats
    conv = {"cin": 24, "cout": 64, "kernel": (1, 3, 3), "stride": (1, 1, 1), "transposed": False}
    assert gemm_refusal(conv, [((1, 1, 1), (1, 1, 1))]) is None  # 216 x 72
    assert "staged words" in gemm_refusal({**conv, "cin": 240}, [((1, 1, 1), (1, 1, 1))])  # 2160 x 72
    # a large pooling window makes the box, and so its staged input and output, too large
    assert not offers(_plan("groupnorm", [{"op": "max_pool", "kernel_size": 30}]), "gemm")


def test_affine_pre_chains_scale_statistics():
    scale = _plan("instancenorm", [{"op": "mul", "by": 2.0}, {"op": "add", "by": 1.0}, {"op": "div", "by": 4.0},
                                   {"op": "instance_norm"}]).pre_scale
    assert [op.kind for op in scale] == ["mul", "div"]
    assert _plan("instancenorm", [{"op": "instance_norm"}]).pre_scale == ()
    assert _plan("instancenorm", [{"op": "relu"}, {"op": "instance_norm"}]).pre_scale is None


def test_seed_slots():
    plan = make_plan(load_config(SEEDS["groupnorm"]))
    assert [op.kind for op in plan.mid] == ["mul"] and plan.pre == ()
    assert plan.norm.kind == "group_norm" and plan.pool.kind == "max_pool"
    assert [op.kind for op in plan.post] == ["clamp"] and plan.reduce is None and plan.final == ()
    assert plan.param_names == ("scale",)

    plan = make_plan(load_config(SEEDS["instancenorm"]))
    assert [op.kind for op in plan.pre] == ["mul"]
    assert [op.kind for op in plan.mid] == ["clamp", "mul"]
    assert plan.reduce.kind == "reduce" and plan.reduce.mode == "max" and plan.reduce.dim == 1
    assert plan.param_names == ("m",)  # used twice, one slot

    plan = make_plan(load_config(SEEDS["maxpool_gap"]))
    assert [op.kind for op in plan.pre] == ["mul"] and plan.norm is None
    assert plan.pool.kind == "max_pool" and plan.post == ()
    assert plan.reduce.kind == "spatial_reduce" and plan.reduce.mode == "mean"
    assert [op.kind for op in plan.final] == ["clamp"]
    assert plan.param_names == ()

    plan = make_plan(load_config(SEEDS["batchnorm"]))
    assert [op.kind for op in plan.pre] == ["mul"] and plan.norm.kind == "batch_norm"
    assert plan.mid == () and plan.pool is None and plan.reduce.kind == "spatial_reduce"


@pytest.mark.parametrize("key, epilogue, tail, fragment", [
    ("groupnorm", [{"op": "group_norm", "groups": 16}, {"op": "instance_norm"}], ["instance_norm"],
     "epilogue[1] (instance_norm)"),
    ("groupnorm", [{"op": "batch_norm"}, {"op": "relu"}, {"op": "batch_norm"}], ["batch_norm"],
     "epilogue[2] (batch_norm)"),
    ("groupnorm", [{"op": "max_pool", "kernel_size": 2}, {"op": "group_norm", "groups": 16}], ["group_norm"],
     "epilogue[1] (group_norm)"),
    ("groupnorm", [{"op": "max_pool", "kernel_size": 2}, {"op": "max_pool", "kernel_size": 3, "stride": 2}],
     ["max_pool"], "epilogue[1] (max_pool)"),
    ("batchnorm", [{"op": "adaptive_avg_pool"}, {"op": "batch_norm"}], ["batch_norm"], "epilogue[1] (batch_norm)"),
    ("groupnorm", [{"op": "max", "dim": 2}, {"op": "relu"}], ["reduce", "relu"], "not over dim 2"),
    ("instancenorm", [{"op": "sum", "dim": -1}], ["reduce"], "not over dim 4"),
    ("groupnorm", [{"op": "max_pool", "kernel_size": 2}, {"op": "max", "dim": 1}], ["reduce"],
     "do not reduce over channels after a pool"),
    ("instancenorm", [{"op": "instance_norm"}, {"op": "avg_pool", "kernel_size": 2}, {"op": "mean", "dim": 1}],
     ["reduce"], "do not reduce over channels after a pool"),
    ("groupnorm", [{"op": "relu"}, {"op": "softmax", "dim": 2}, {"op": "relu"}], ["softmax", "relu"],
     "epilogue[1] (softmax): a softmax over dim 2"),  # over the channels (dim 1): channel_softmax
    ("groupnorm", [{"op": "max_pool", "kernel_size": 2}, {"op": "log_softmax", "dim": 1}], ["log_softmax"],
     "do not normalise over channels after a pool"),
    ("groupnorm", [{"op": "avg_pool", "kernel_size": 3, "padding": 1}, {"op": "max_pool", "kernel_size": 2}],
     ["max_pool"], "epilogue[1] (max_pool)"),
    ("groupnorm", [{"op": "gelu"}, {"op": "layer_norm", "normalized_shape": [43]}], ["layer_norm"],
     "a layer_norm over [43], fewer trailing dims than every spatial one, runs after this region"),
    ("groupnorm", [{"op": "layer_norm", "normalized_shape": [35, 43]}, {"op": "amax", "dim": 1}], ["reduce"],
     "per-element affine only in a region that ends in a map, a pool or a reduction over space"),
    ("groupnorm", [{"op": "logsumexp", "dim": [2, 3]}], ["reduce"], "not logsumexp over dims [2, 3]"),  # over channels: fused
    ("groupnorm", [{"op": "group_norm", "num_groups": 4}, {"op": "max_pool", "kernel_size": 3, "stride": 1, "padding": 1},
                   {"op": "add", "by": "producer"}], ["group_norm", "max_pool", "add"],
     "epilogue[2] (add) reads the convolution's output (by: producer) after a pool"),  # after a norm: fused
])
def test_chains_the_kernels_do_not_take_whole_run_their_tail_in_pytorch(key, epilogue, tail, fragment):
    """A valid chain is always planned: the longest prefix the kernels take is fused, the rest runs in
    PyTorch, and the plan says why the kernels stop where they do."""
    raw = _raw(key)
    raw["epilogue"] = epilogue
    raw["shapes"] = raw["shapes"][-1:]
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert [step.op.kind for step in plan.tail] == tail
    assert fragment in plan.ends
    assert plan.ends.startswith("x.yaml: ")
    later = [line for line in plan.regions() if line.startswith("region ") and not line.startswith("region 0")]
    assert all(any(step.where in line for line in later) for step in plan.tail)  # each one said where it runs


def test_eval_mode_batch_norm_has_no_stats_stage():
    plan = _plan("batchnorm", [{"op": "mul", "by": 2.0}, {"op": "batch_norm", "training": False},
                               {"op": "adaptive_avg_pool"}])
    assert plan.norm.scope == "running"
    assert not plan.needs_stats
    assert "stats" not in plan.stages and "finalize" in plan.stages
    # no statistics pass, so finalize cannot produce the plane means itself: a main pass is needed
    assert plan.impl_stages["cudnn"] == ("finalize", "plane_reduce")

    plan = _plan("batchnorm", [{"op": "batch_norm", "training": False}, {"op": "relu"}])
    assert plan.impl_stages["cudnn"] == ("finalize", "window_map")


def test_norm_then_mean_needs_no_main_pass_only_without_mid_ops_or_pool():
    assert _plan("batchnorm", [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}, {"op": "relu"}]).impl_stages["cudnn"] == (
        "stats", "finalize")
    # a nonlinearity between the norm and the mean: the plane mean is no longer A*mean+B
    relu = _plan("batchnorm", [{"op": "batch_norm"}, {"op": "relu"}, {"op": "adaptive_avg_pool"}])
    assert relu.impl_stages["cudnn"] == ("stats", "finalize", "plane_reduce")
    assert world_stages(relu, "gemm_wide") == ("wide_stats", "finalize", "plane_reduce")  # the K-tiled kernel's stored output
    assert _plan("batchnorm", [{"op": "batch_norm"}, {"op": "max_pool", "kernel_size": 2},
                               {"op": "adaptive_avg_pool"}]).impl_stages["cudnn"] == ("stats", "finalize", "plane_reduce")


def test_chains_without_norm():
    assert _plan("groupnorm", [{"op": "relu"}]).stages == ("window_map", "direct_main", "gemm_main")
    plan = _plan("instancenorm", [{"op": "relu"}, {"op": "min", "dim": 1}, {"op": "mul", "by": 2.0}])
    assert plan.impl_stages["cudnn"] == ("channel_reduce",) and world_stages(plan, "direct") == ("direct_main",)
    assert world_stages(plan, "gemm") == ("gemm_main",)
    assert [op.kind for op in plan.final] == ["mul"]
    assert plan.drop_bias is False


@pytest.mark.parametrize("pre, drop", [
    ([], True),
    ([{"op": "mul", "by": "m"}, {"op": "add", "by": 1.0}, {"op": "div", "by": 3.0}], True),
    ([{"op": "relu"}], False),  # the bias changes which values relu zeroes: it does not cancel
    ([{"op": "clamp", "max": 1.0}], False),
])
def test_instance_norm_drops_bias_only_through_affine_pre_ops(pre, drop):
    plan = _plan("instancenorm", [*pre, {"op": "instance_norm"}, {"op": "max", "dim": 1}])
    assert plan.drop_bias is drop


def test_instance_norm_without_producer_bias_has_nothing_to_drop():
    plan = _plan("instancenorm", [{"op": "instance_norm"}, {"op": "max", "dim": 1}], bias=False)
    assert plan.drop_bias is False


@pytest.mark.parametrize("norm", [{"op": "group_norm", "groups": 4}, {"op": "batch_norm"},
                                  {"op": "batch_norm", "training": False}])
def test_other_norms_keep_the_bias(norm):
    # group norm mixes channels and batch norm's running statistics see the bias: neither cancels it
    assert _plan("instancenorm", [norm, {"op": "max", "dim": 1}]).drop_bias is False


def test_too_many_parameters_end_the_fused_region():
    """The kernels take at most MAX_PARAMS per-channel parameters; say so before building."""
    from fusetune.plan import MAX_PARAMS

    count = MAX_PARAMS + 1
    raw = {"name": "many", "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 4, "kernel_size": 3},
           "parameters": {f"p{i}": {"init": "ones"} for i in range(count)},
           "epilogue": [{"op": "mul", "by": f"p{i}"} for i in range(count)] + [{"op": "relu"}],
           "shapes": [[1, 3, 8, 8]]}
    plan = make_plan(parse_config(raw, "many.yaml"))  # the last parameter's op and what follows run in PyTorch
    assert f"reads {count} learnable parameters" in plan.ends
    assert [step.where for step in plan.tail] == [f"epilogue[{count - 1}] (mul)", f"epilogue[{count}] (relu)"]
    raw["parameters"].pop(f"p{count - 1}")
    raw["epilogue"].pop(count - 1)
    assert make_plan(parse_config(raw, "many.yaml")).tail == ()


def test_pool_at_extremes_and_rising_chains():
    """A max pool after a monotone chain is the chain at a window's largest or smallest raw value
    (pool_at_extremes); at the largest alone where the chain never falls, whatever its parameters
    (pool_increasing): adding anything, scaling by a positive number, clamp, relu, a norm without a
    learnable scale. The direct kernels then pool raw values (direct_main.cu.j2)."""
    pool = {"op": "max_pool", "kernel_size": 4}
    rising = [{"op": "add", "by": "scale"}, {"op": "mul", "by": 0.5}, {"op": "div", "by": 3.0}, {"op": "relu"},
              {"op": "clamp", "min": -1.0}]
    assert pool_increasing(_plan("groupnorm", [*rising, pool]))
    assert pool_increasing(_plan("groupnorm", [{"op": "instance_norm"}, *rising, pool]))
    for falls in ({"op": "mul", "by": -0.5}, {"op": "mul", "by": "scale"}, {"op": "group_norm", "groups": 16}):
        plan = _plan("groupnorm", [*rising, falls, pool])
        assert pool_at_extremes(plan) and not pool_increasing(plan), falls
    assert not pool_at_extremes(_plan("groupnorm", [{"op": "div", "by": "scale"}, pool]))
    assert not pool_at_extremes(_plan("groupnorm", [*rising, {"op": "avg_pool", "kernel_size": 4}]))
    seed = make_plan(load_config(SEEDS["maxpool_gap"]))
    assert pool_increasing(seed) and world_facts(seed)["direct_cells"] == 4


@pytest.mark.parametrize("chain,extremes", [
    ("conv2d_groupnorm_noaffine_expression_hardsigmoid_rising_maxpool", "max"),
    ("conv2d_wide64_instancenorm_expression_falling_sigmoid_maxpool", "both"),
    ("conv2d_expression_sigmoid_swish_groupnorm_expression_tanh_maxpool", "")])
def test_max_pool_shortcuts_after_expressions(chain: str, extremes: str):
    """An expression's flags (fusetune/ops/expression.py: trend) open the max-pool shortcuts: ``fusetune plan``
    offers gemm_extrema (each window's raw extremes through the chain) where the chain up to the pool is monotone,
    and the direct kernels pool raw values: the largest alone where it rises ("max"), both extremes where it is
    monotone ("both"), none where it is neither (hardswish and x * tanh(x) by hand: every value)."""
    path = ROOT / "tests" / "chains" / f"{chain}.yaml"
    result = CliRunner().invoke(main, ["plan", "--json", str(path)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    document = json.loads(result.output)[0]
    assert ("gemm_extrema" in document["worlds"]) is bool(extremes), document["not_offered"].get("gemm_extrema")
    assert world_facts(make_plan(load_config(path)))["pool_extremes"] == extremes


def test_an_imported_rising_expression_opens_the_pool_shortcut(tmp_path):
    """tests/models/kb_conv2d_hardswish_by_hand_expression_pools.py, imported: KernelBench's hardswish, x *
    sigmoid(x + 3) / 6 as one expression (it falls, then rises), leaves its max pool reading every value; y +
    tanh(y) * 0.5, an expression too, rises, and the direct kernels pool raw values, each window's largest alone."""
    from fusetune.importer import import_model

    result = import_model(str(ROOT / "tests" / "models" / "kb_conv2d_hardswish_by_hand_expression_pools.py"), tmp_path)
    plans = [make_plan(load_config(written.config)) for written in result.written]
    assert [plan.pool.mode if plan.pool else None for plan in plans] == ["max", "max", None]
    assert [world_facts(plan)["pool_extremes"] for plan in plans[:2]] == ["", "max"]


def test_extrema_only_where_the_window_max_is_at_its_ends():
    """gemm_extrema takes a max pool at each window's largest or smallest raw value: offered only for
    a chain monotone per channel up to a max pool whose windows lie whole in the boxes."""
    norm, scale = {"op": "group_norm", "groups": 16}, {"op": "mul", "by": "scale"}
    pool = {"op": "max_pool", "kernel_size": 4}
    assert offers(_plan("groupnorm", [norm, scale, pool]), "gemm_extrema")
    assert offers(_plan("groupnorm", [{"op": "add", "by": 3.0}, norm, {"op": "relu"}, scale, pool,
                               {"op": "clamp", "min": 0}]), "gemm_extrema")
    assert not offers(_plan("groupnorm", [norm, scale, {"op": "avg_pool", "kernel_size": 4}]), "gemm_extrema")
    assert not offers(_plan("groupnorm", [norm, {"op": "div", "by": "scale"}, pool]), "gemm_extrema")  # the parameter may be 0
    assert not offers(_plan("groupnorm", [norm, scale, {"op": "max_pool", "kernel_size": 3, "stride": 2}]), "gemm_extrema")  # overlap
    assert not offers(_plan("groupnorm", [norm, scale, {"op": "max_pool", "kernel_size": 3}]), "gemm_extrema")  # 3 divides no box
    assert not offers(_plan("groupnorm", [scale, pool]), "gemm_extrema")  # no norm: the gemm world already computes it once


@pytest.mark.parametrize("change, offered", [
    ({}, True),
    ({"producer": {"kernel_size": [3, 2, 4], "bias": False}}, True),
    ({"epilogue": [{"op": "mul", "by": "s"}, {"op": "add", "by": 2.0}, {"op": "group_norm", "groups": 4},
                   {"op": "adaptive_avg_pool"}, {"op": "relu"}]}, True),  # any affine pre chain, any norm, ops after
    ({"producer": {"padding": 1}}, False),  # the output is a crop of the full convolution
    ({"producer": {"stride": 2}}, False),
    ({"producer": {"op": "conv3d"}}, False),  # a plain convolution's output is a crop too
    ({"epilogue": [{"op": "relu"}, {"op": "batch_norm"}, {"op": "adaptive_avg_pool"}]}, False),  # not affine
    ({"epilogue": [{"op": "batch_norm"}, {"op": "relu"}, {"op": "adaptive_avg_pool"}]}, False),  # needs every output
    ({"epilogue": [{"op": "batch_norm", "training": False}, {"op": "adaptive_avg_pool"}]}, False),  # no statistics
    ({"epilogue": [{"op": "mul", "by": 2.0}, {"op": "adaptive_avg_pool"}]}, False),  # no norm
])
def test_spectral_statistics_only_where_the_output_is_them_alone(change, offered):
    """spectral_stats computes a plane's sum and sum of squares from spectra, never the output itself:
    only a full transposed convolution (stride 1, no padding) makes the output's spectrum the product
    of the input's and the weights', and only a chain that is those sums alone can use it."""
    raw = _raw("batchnorm")
    raw["producer"].update(change.get("producer", {}))
    raw["epilogue"] = change.get("epilogue", raw["epilogue"])
    if any(op.get("by") == "s" for op in raw["epilogue"]):
        raw["parameters"] = {"s": {"init": "randn"}}
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert offers(plan, "spectral") is offered
    assert ("spectral" in plan.impl_stages) is offered
    assert ("spectral_stats" in plan.stages) is offered


def test_cluster_only_where_a_sample_holds_the_statistics():
    """gemm_cluster keeps a sample's outputs across a thread-block cluster and applies the chain from
    there: offered for an instance or group norm (statistics within a sample) on the tensor-core
    kernels, before a channel reduction or a map whose pooling windows lie whole in the boxes."""
    norm, scale = {"op": "group_norm", "groups": 16}, {"op": "mul", "by": "scale"}
    assert offers(_plan("groupnorm", [norm, scale, {"op": "max_pool", "kernel_size": 4}]), "gemm_cluster")
    assert offers(_plan("groupnorm", [norm, {"op": "avg_pool", "kernel_size": 2}, {"op": "relu"}]), "gemm_cluster")  # any pool mode
    assert offers(_plan("groupnorm", [{"op": "relu"}, norm]), "gemm_cluster")  # a map without a pool; a chain not affine before
    assert offers(_plan("groupnorm", [{"op": "instance_norm"}, {"op": "max", "dim": 1}]), "gemm_cluster")
    assert not offers(_plan("groupnorm", [{"op": "batch_norm"}, {"op": "max_pool", "kernel_size": 4}]), "gemm_cluster")  # all samples
    assert not offers(_plan("groupnorm", [{"op": "batch_norm", "training": False}, {"op": "relu"}]), "gemm_cluster")  # no statistics
    assert not offers(_plan("groupnorm", [norm, {"op": "max_pool", "kernel_size": 3, "stride": 2}]), "gemm_cluster")  # overlap
    assert not offers(_plan("groupnorm", [norm, {"op": "max_pool", "kernel_size": 3}]), "gemm_cluster")  # 3 divides no box
    assert not offers(_plan("groupnorm", [norm, {"op": "adaptive_avg_pool"}]), "gemm_cluster")  # statistics alone: gemm_stats does it
    assert not offers(_plan("groupnorm", [norm, {"op": "relu"}, {"op": "adaptive_avg_pool"}]), "gemm_cluster")  # plane_reduce: not yet
    assert not offers(_plan("groupnorm", [{"op": "instance_norm"}], out_channels=72), "gemm_cluster")  # no tensor-core kernels
    assert "gemm_cluster" not in _plan("groupnorm", [scale]).impl_stages


def test_wide_kernel_where_the_others_do_not_take_it():
    """gemm_wide (the K-tiled tensor-core statistics pass) is offered where a norm needs statistics and the
    whole-weights kernels do not take the convolution: plain or transposed, any stride; at fewer output
    channels than its narrowest tile, only where the direct kernels do not take it either."""
    seed = make_plan(load_config(SEEDS["batchnorm"]))
    assert fact(seed, "wide") and not offers(seed, "gemm") and seed.impl_stages["gemm_wide"] == ("wide_stats", "finalize")
    # more than 64 output channels: the whole-weights kernels cannot keep a box's output; the stored
    # output then goes to the cuDNN world's main kernel
    wide = _plan("groupnorm", [{"op": "group_norm", "groups": 16}, {"op": "max_pool", "kernel_size": 4}],
                 out_channels=128)
    assert fact(wide, "wide") and not offers(wide, "gemm") and world_stages(wide, "gemm_wide") == ("wide_stats", "finalize", "window_map")
    # the whole-weights kernels take the conv2d seed: not offered beside them
    assert not fact(make_plan(load_config(SEEDS["groupnorm"])), "wide")
    # no statistics to take: not offered
    assert not fact(_plan("groupnorm", [{"op": "relu"}], out_channels=128), "wide")
    # a transposed convolution of stride 2: a plain convolution per output parity class
    strided = _plan("maxpool_gap", [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}], out_channels=64)
    assert fact(strided, "wide") and world_stages(strided, "gemm_wide") == ("wide_stats", "finalize")
    # ... but at fewer output channels than a tile of 64, where the direct kernels take it: not offered
    few = _plan("maxpool_gap", [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}])
    assert offers(few, "direct") and not fact(few, "wide") and "fill less than a tile of 64" in refusals(few)["gemm_wide"]
    # ... nor is it where they do not (more weights than constant memory holds)
    alone = _plan("maxpool_gap", [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}], out_channels=40, kernel_size=5)
    assert not offers(alone, "direct") and fact(alone, "wide")


def test_every_world_not_offered_says_why():
    """A world is either offered or named in refusals with a reason (what ``fusetune plan`` prints),
    never both and never neither."""
    relu, pool = {"op": "relu"}, {"op": "max_pool", "kernel_size": 2}
    strided = _plan("maxpool_gap", [relu, pool], out_channels=64, kernel_size=5)  # strided transposed + pool: gemm_wide
    wide_only = _plan("groupnorm", [relu, pool], out_channels=72)                    # the K-tiled world only
    thirty = _plan("groupnorm", [relu, {"op": "sum", "dim": 1}], out_channels=30)    # no tile of direct's
    for plan in [make_plan(load_config(path)) for path in SEEDS.values()] + [strided, wide_only, thirty]:
        for impl in WORLDS:
            assert (impl in plan.impl_stages) != (impl in refusals(plan)), (plan.spec.name, impl)
    assert refusals(strided)["gemm"] == "a transposed convolution" and "weights" in refusals(strided)["direct"]
    assert "gemm_wide" in strided.impl_stages
    assert "72 output channels" in refusals(wide_only)["gemm"] and "gemm_wide" not in refusals(wide_only)
    assert "takes 2, 4, 8, 16, 32 channels, not 30" in refusals(thirty)["direct"]


def test_wide_main_takes_whole_chains():
    """wide_main (the K-tiled kernel with the chain on its accumulators) takes the convolutions gemm_wide
    does, where the chain ends in a map, a spatial reduction, or a reduction over the channels (any
    count: one tile of them a block), pooled or not: alone
    where no statistics are needed (the convolution once), and after wide_stats (recompute: twice)
    beside the stored output where a norm needs them."""
    relu = {"op": "relu"}
    # no norm: the whole chain in one kernel, the convolution once
    gap = _plan("groupnorm", [relu, {"op": "adaptive_avg_pool"}], out_channels=128)
    assert fact(gap, "wide_main") and not fact(gap, "wide") and gap.impl_stages["gemm_wide"] == ("wide_main",)
    assert conv_passes(gap, "gemm_wide") == 1 and "gemm_wide_recompute" not in gap.impl_stages
    # after eval-mode batch norm: finalize's map from the running statistics, then the chain, the
    # convolution once
    running = _plan("groupnorm", [{"op": "batch_norm", "training": False}, relu], out_channels=72)
    assert fact(running, "wide_main") and running.impl_stages["gemm_wide"] == ("finalize", "wide_main")
    assert conv_passes(running, "gemm_wide") == 1 and "gemm_wide_recompute" not in running.impl_stages
    # a main family whose end wide_main does not implement (the GPU fault test injects one): none
    assert not fact(dataclasses.replace(gap, family="fault_map"), "wide_main")
    channels = _plan("maxpool_gap", [relu, {"op": "max", "dim": 1}], out_channels=40, kernel_size=5)  # transposed, 40 channels
    assert fact(channels, "wide_main") and channels.impl_stages["gemm_wide"] == ("wide_main",)
    # a norm: the stored output for the cuDNN world's main kernel, or the convolution again
    norm = _plan("groupnorm", [{"op": "group_norm", "groups": 8}, relu, {"op": "sum", "dim": 1}], out_channels=96)
    assert norm.impl_stages["gemm_wide"] == ("wide_stats", "finalize", "channel_reduce")
    assert norm.impl_stages["gemm_wide_recompute"] == ("wide_stats", "finalize", "wide_main")
    assert conv_passes(norm, "gemm_wide_recompute") == 2 and "wide_recompute=" in norm.describe()
    assert fact(_plan("groupnorm", [relu, {"op": "max", "dim": 1}], out_channels=136), "wide_main")  # three tiles of 64
    # a pool after a convolution of one class: a box is a brick of whole windows
    pooled = _plan("groupnorm", [relu, {"op": "max_pool", "kernel_size": 2}], out_channels=128)
    assert fact(pooled, "wide_main") and pooled.impl_stages["gemm_wide"] == ("wide_main",)
    pooled_norm = _plan("groupnorm", [{"op": "group_norm", "groups": 8}, {"op": "avg_pool", "kernel_size": 3,
                                                                          "stride": 2}, {"op": "adaptive_avg_pool"}],
                        out_channels=96)
    assert pooled_norm.impl_stages["gemm_wide_recompute"] == ("wide_stats", "finalize", "wide_main")
    # a pool after a strided transposed convolution: each class's outputs among a brick's windows in
    # turn, folded into the windows
    strided_pool = _plan("maxpool_gap", [relu, {"op": "max_pool", "kernel_size": 2}, {"op": "adaptive_avg_pool"}],
                         out_channels=96)
    assert fact(strided_pool, "wide_main") and strided_pool.impl_stages["gemm_wide"] == ("wide_main",)
    # not offered: nothing left for a main kernel, the whole-weights kernels' convolutions
    assert not fact(make_plan(load_config(SEEDS["batchnorm"])), "wide_main")
    assert not fact(_plan("groupnorm", [relu, {"op": "adaptive_avg_pool"}]), "wide_main")  # 8 -> 64: gemm_main's


def test_a_padded_pool_is_fused_by_the_cudnn_worlds_main_kernels_only():
    """The main kernels that read the convolution's output (window_map, plane_reduce) pool padded
    windows; the kernels that compute the convolution inside build boxes of whole unpadded windows,
    and say so. A norm's statistics pass before a padded pool is still theirs (gemm_wide's wide_stats)."""
    pool = {"op": "max_pool", "kernel_size": 3, "stride": 2, "padding": 1}
    plan = _plan("groupnorm", [{"op": "relu"}, pool, {"op": "mean", "dim": [2, 3]}])
    assert plan.tail[0].op.kind == "flatten" and plan.pool.padding == (1, 1) and plan.pool_padding == (0, 1, 1)
    assert plan.family == "plane_reduce" and set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}
    assert set(refusals(plan)) == set(WORLDS) - {"cudnn", *REFERENCE_WORLDS}
    assert all("padded pool" in refusals(plan)[impl] for impl in ("direct", "gemm", "gemm_wide"))
    wide = _plan("groupnorm", [{"op": "batch_norm"}, pool], out_channels=96, kernel_size=5, padding=2)
    assert wide.impl_stages["gemm_wide"] == ("wide_stats", "finalize", "window_map")
    assert not fact(wide, "wide_main") and "padded pool" in refusals(wide).get("gemm_wide", "padded pool")
    unpadded = _plan("groupnorm", [{"op": "relu"}, {"op": "max_pool", "kernel_size": 3, "stride": 2}])
    assert unpadded.pool_padding == (0, 0, 0) and offers(unpadded, "direct") and offers(unpadded, "gemm")


def test_reductions_merge_only_where_that_keeps_them_in_the_kernels():
    """A spatial mean then a channel mean is one mean over (1, 2, 3) in PyTorch, but merged neither half
    is a reduction the kernels compute: the spatial mean stays fused and the channel mean runs after it.
    Two reductions that the kernels take only merged (over H, then over the new H: every spatial dim)
    merge into the kernels' spatial reduction."""
    split = _plan("groupnorm", [{"op": "mean", "dim": [2, 3]}, {"op": "mean", "dim": 1}])
    assert split.reduce.kind == "spatial_reduce" and [s.op.kind for s in split.tail] == ["flatten", "reduce"]
    merged = _plan("groupnorm", [{"op": "sum", "dim": 2}, {"op": "sum", "dim": 2}, {"op": "relu"}])
    assert merged.reduce.kind == "spatial_reduce" and merged.reduce.mode == "sum"
    assert [op.kind for op in merged.final] == ["relu"] and [s.op.kind for s in merged.tail] == ["flatten"]


def test_a_dilated_max_pool_is_pooled_by_the_cudnn_worlds_main_kernels_only():
    """A max pool's dilation (PyTorch's: window element k at k * dilation) is pooled where the kernels read the
    convolution's output (window_map, plane_reduce: pool.j2's tap); those that compute the convolution pool
    boxes of whole undilated windows and say so. An undilated pool renders as before (no FT_DD..)."""
    from fusetune.codegen import render

    plan = make_plan(load_config(ROOT / "tests" / "chains" / "conv3d_tanh_maxpool_dilated_mean_spatial.yaml"))
    assert plan.pool_dilation == (1, 3, 2) and plan.family == "plane_reduce"
    assert set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}
    assert all("dilated pool" in refusals(plan)[impl] for impl in ("direct", "gemm", "gemm_wide"))
    unit = render(plan).files["plane_reduce.cu"]
    assert "enum { FT_DD = 1, FT_DH = 3, FT_DW = 2 };" in unit and "(kw * FT_DW)" in unit and "(kd * FT_DD)" not in unit
    model = render(plan).files["model.py"]
    assert "POOL_DILATION = [1, 3, 2]" in model or "POOL_DILATION = (1, 3, 2)" in model
    plain = render(make_plan(load_config(ROOT / "tests" / "chains" / "conv2d_relu_maxpool_maxpool.yaml")))
    assert not any("FT_DD" in text for text in plain.cuda_sources.values()) and "POOL_DILATION" not in plain.files[
        "model.py"]


def test_a_divisor_override_is_the_kernels_divisor_with_or_without_padding():
    """An average's divisor_override divides every window (PyTorch's), whatever count_include_pad says: the
    kernels' pool, padded (window_map) or not (the kernels that pool windows of their boxes too), dividing by it
    (pool.j2's reciprocal). A 1-D one is PyTorch's 2-D pool of the input at height 1 (nn.AvgPool1d has no
    divisor_override): in float64, each window's sum over the divisor."""
    import torch

    from fusetune.codegen import render

    chains = ROOT / "tests" / "chains"
    padded = make_plan(load_config(chains / "conv2d_gelu_avgpool_padded_exclude_pad_divisor.yaml"))
    assert padded.pool is not None and not padded.pool.count_include_pad and padded.pool.exact_in_kernels
    assert not padded.tail and padded.pool_divisor == 4 and "v *= 0.25f;" in render(padded).files["window_map.cu"]
    spec = load_config(chains / "conv1d_sigmoid_avgpool_divisor.yaml")
    plan = make_plan(spec)
    assert {"cudnn", "direct", "gemm"} <= set(plan.impl_stages) and plan.pool.module_code(8, 1) == ""
    module = render(plan)
    assert all("0.3333333333333333f" in module.files[f"{s}.cu"] for s in ("window_map", "direct_main_0", "gemm_main_0"))
    x = torch.rand(2, 8, 41, dtype=torch.float64)
    pooled = eval(plan.pool.forward_code("x", None), {"F": torch.nn.functional, "x": x})  # noqa: S307
    assert torch.allclose(pooled, x.unfold(2, 4, 3).sum(-1) / 3, rtol=1e-12, atol=0)
    assert tuple(pooled.shape) == plan.pool.out_shape(tuple(x.shape))
    negative = make_plan(load_config(chains / "conv3d_elu_avgpool_padded_divisor_negative_sum_spatial.yaml"))
    assert negative.pool_divisor == -5 and "v *= -0.2f;" in render(negative).files["plane_reduce.cu"]


def test_pools_without_the_new_arguments_keep_their_cache_key():
    """dilation and divisor_override enter a pool's canonical form (the cache key) only where given."""
    plan = make_plan(load_config(ROOT / "tests" / "chains" / "conv2d_relu_maxpool_maxpool.yaml"))
    assert not {"dilation", "divisor_override"} & set(plan.spec.epilogue[1].canonical())
    dilated = make_plan(load_config(ROOT / "tests" / "chains" / "conv2d_relu_maxpool_dilated_padded_ceil.yaml"))
    assert dilated.spec.epilogue[1].canonical()["dilation"] == (2, 2)
