"""The exact rewrites before planning (fusetune/regions.py's RULES): each named and documented, the
algebra the planner reads (the bias an instance norm cancels, a spatial mean after a norm) among
them, and which fired listed by ``fusetune plan``."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.regions import CANCELS_BIAS, FROM_STATISTICS, MOVED, RULES, Step, rewrite

from conftest import ROOT

CONFIGS = ROOT / "configs"
CHAINS = ROOT / "tests" / "chains"
#: Mean centrings, one of them cancelled by the instance norm after it (norm_cancels_centring).
CENTRING = ROOT / "tests" / "centring"
#: Broadcast inputs added before a norm, cancelled by it or not (norm_cancels_input).
CANCELLED_INPUTS = ROOT / "tests" / "cancelled_inputs"


def test_every_rule_is_named_and_documented():
    names = [rule.name for rule in RULES]
    assert len(set(names)) == len(names) and all(rule.doc.strip() and callable(rule.apply) for rule in RULES)
    assert {"norm_cancels_bias", "mean_of_norm"} <= set(names)


@pytest.mark.parametrize("path, fires", [
    (CONFIGS / "conv3d_mul_instancenorm_clamp_mul_max.yaml", True),          # mul, then instance norm
    (CHAINS / "conv2d_wide80_instancenorm_leakyrelu_logsumexp_channels.yaml", True),
    (CHAINS / "conv2d_leakyrelu_instancenorm_batchnorm.yaml", False),        # leaky relu before: not affine
    (CHAINS / "conv2d_nobias_sub_param_exp_avgpool_padded_log.yaml", False),  # no bias to cancel
    (CONFIGS / "conv2d_groupnorm_scale_maxpool_clamp.yaml", False),           # group norm keeps a channel's offset
    (CHAINS / "conv3d_sub_cond_scale_groupnorm_per_channel_gelu.yaml", True),  # one channel a group; after the sub
    (CANCELLED_INPUTS / "add_per_sample_layernorm_chw_relu.yaml", False),      # over (C, H, W): a channel's offset
    (CANCELLED_INPUTS / "add_cond_batchnorm_relu.yaml", False),                # training: its running statistics
    (CANCELLED_INPUTS / "mul_temb_instancenorm.yaml", False),                  # the norm after the input: region 1
])
def test_instance_norm_cancels_the_bias(path, fires):
    spec = load_config(path)
    rewritten, plan = rewrite(spec), make_plan(spec)
    marked = [step for step in rewritten.steps if CANCELS_BIAS in step.marks]
    assert ("norm_cancels_bias" in rewritten.fired) is fires and bool(marked) is fires
    assert plan.drop_bias is fires and ("norm_cancels_bias" in plan.rules) is fires
    assert not plan.bias_in_epilogue or not fires


@pytest.mark.parametrize("path, fires", [
    (CONFIGS / "convt3d_scale_batchnorm_gap.yaml", True),                           # batch norm, then a global mean
    (CHAINS / "conv3d_wide64_scale_batchnorm_eval_tanh_gap_squeeze.yaml", False),  # eval-mode norm, tanh between
    (CHAINS / "convt3d_silu_groupnorm_hardswish.yaml", False),                      # no reduction
])
def test_a_spatial_mean_after_a_norm_is_finalized(path, fires):
    spec = load_config(path)
    rewritten, plan = rewrite(spec), make_plan(spec)
    assert ("mean_of_norm" in rewritten.fired) is fires
    assert any(FROM_STATISTICS in step.marks for step in rewritten.steps) is fires
    assert (plan.family is None) is fires  # finalize computes the output: no main kernel
    assert ("finalize" == plan.impl_stages["cudnn"][-1]) is fires


def test_plan_lists_the_rules_that_fired():
    path = CONFIGS / "convt3d_scale_batchnorm_gap.yaml"
    plan = make_plan(load_config(path))
    runner = CliRunner()
    document = json.loads(runner.invoke(main, ["plan", "--json", str(path)]).output)[0]
    assert document["rules"] == list(plan.rules) == ["kernel_reductions", "mean_of_norm"]
    text = runner.invoke(main, ["plan", str(path)]).output
    assert "  rewrites: kernel_reductions, mean_of_norm" in text


def _run_steps(model, steps, x, inputs=None, spec=None):
    """The steps' PyTorch lines on ``x`` (the convolution's output, which ``by: producer`` ops read too), the
    config's extra inputs bound by their names. Rewritten steps (of ``spec``'s chain) by their own lines, which read
    a per-channel parameter repeated where a step moved before a pixel shuffle (Step.forward_code)."""
    import torch
    import torch.nn.functional as F

    scalars = frozenset(p.name for p in spec.parameters if p.scalar) if spec is not None else frozenset()
    y = x
    for step in steps:
        code = step.forward_code("x", scalars) if isinstance(step, Step) else step.op.forward_code("x", step.attr)
        x = eval(code, {"self": model, "x": x, "y": y, "F": F, "torch": torch, **(inputs or {})})  # noqa: S307
    return x


#: Ops after a pixel shuffle that do not commute with it (shuffle_commutes moves nothing past them).
SHUFFLE_STOPS = ROOT / "tests" / "shuffle_stops"
#: Every config the rules are checked on in float64.
EXACT = (sorted(CHAINS.glob("*.yaml")) + sorted(CONFIGS.glob("*.yaml")) + sorted(CENTRING.glob("*.yaml"))
         + sorted(CANCELLED_INPUTS.glob("*.yaml")) + sorted(SHUFFLE_STOPS.glob("*.yaml")))


@pytest.mark.parametrize("path", EXACT, ids=lambda p: p.stem)
def test_the_rewritten_chain_computes_the_configs_at_its_shapes(path, tmp_path):
    """Every rule is exact: the rewritten steps, run as PyTorch, give the chain's own result in float64 at
    each of the config's shapes (at_shapes rules hold there), norms moved off their identity."""
    import torch

    spec = load_config(path)
    rewritten = rewrite(spec)
    model = _perturbed_model(spec, tmp_path)  # both sides run the same modules, eval-mode batch norms
    for shape in spec.shapes:
        x = model.producer(torch.randn(shape, dtype=torch.float64))
        inputs = {name: torch.randn(s, dtype=torch.float64) for name, s in zip(spec.inputs, spec.input_shapes(shape))}
        expected = _run_steps(model, [type("S", (), {"op": op, "attr": attr})() for op, attr in
                                      _reference_steps(spec)], x, inputs)
        got = _run_steps(model, rewritten.steps, x, inputs, spec)
        assert got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-9, atol=1e-9), shape


def _reference_steps(spec):
    from fusetune.regions import reference_attr

    return [(op, reference_attr(spec, i)) for i, op in enumerate(spec.epilogue)]


def _perturbed_model(spec, tmp_path):
    """The generated reference Model in float64, every norm's weight, bias and running mean moved off the
    identity, in eval mode (its running statistics stay as they are)."""
    import torch

    from fusetune.build import load_generated
    from fusetune.codegen import render

    generated = load_generated(render(make_plan(spec)).write(tmp_path))
    torch.manual_seed(0)
    model = generated.Model().double()
    for module in model.modules():
        for name in ("weight", "bias", "running_mean"):
            tensor = getattr(module, name, None)
            if module is not model.producer and isinstance(tensor, torch.Tensor) and tensor.dim() == 1:
                with torch.no_grad():
                    tensor.uniform_(0.5, 1.5) if name == "weight" else tensor.uniform_(-0.5, 0.5)
    return model.eval()


@pytest.mark.parametrize("path", EXACT, ids=lambda p: p.stem)
def test_a_norm_marked_to_cancel_the_bias_gives_the_chains_result_without_it(path, tmp_path):
    """Where norm_cancels_bias marks a norm, the rewritten steps on the convolution's output without its bias give
    the chain's result on it with the bias, in float64 at each of the config's shapes (a bias far from zero)."""
    import torch

    spec = load_config(path)
    rewritten = rewrite(spec)
    if not any(CANCELS_BIAS in step.marks for step in rewritten.steps):
        assert "norm_cancels_bias" not in rewritten.fired
        return
    model = _perturbed_model(spec, tmp_path)
    with torch.no_grad():
        model.producer.bias.uniform_(-30.0, 30.0)
    for shape in spec.shapes:
        x = model.producer(torch.randn(shape, dtype=torch.float64))
        unbiased = x - model.producer.bias.view(1, -1, *(1,) * (x.dim() - 2))
        inputs = {name: torch.randn(s, dtype=torch.float64) for name, s in zip(spec.inputs, spec.input_shapes(shape))}
        expected = _run_steps(model, [type("S", (), {"op": op, "attr": attr})() for op, attr in
                                      _reference_steps(spec)], x, inputs)
        got = _run_steps(model, rewritten.steps, unbiased, inputs, spec)
        assert torch.allclose(got, expected, rtol=1e-9, atol=1e-9), shape


@pytest.mark.parametrize("path, dropped, drop_bias", [
    (CHAINS / "conv2d_add_temb_instancenorm_silu.yaml", True, True),
    (CHAINS / "conv3d_sub_cond_scale_groupnorm_per_channel_gelu.yaml", True, True),
    (CANCELLED_INPUTS / "add_per_sample_layernorm_chw_relu.yaml", True, False),
    (CANCELLED_INPUTS / "add_per_sample_groupnorm_relu.yaml", True, False),
    (CANCELLED_INPUTS / "sub_temb_centre_spatial_tanh.yaml", True, True),
    (CANCELLED_INPUTS / "add_temb_groupnorm_pairs.yaml", False, False),
    (CANCELLED_INPUTS / "add_cond_batchnorm_relu.yaml", False, False),
    (CANCELLED_INPUTS / "add_cond_batchnorm_eval_relu.yaml", False, False),
    (CANCELLED_INPUTS / "mul_temb_instancenorm.yaml", False, False),
    (CANCELLED_INPUTS / "add_temb_mul_producer_instancenorm.yaml", False, False),
    (CHAINS / "sweep4_half_conv2d_temb_groupnorm_silu_bf16.yaml", False, False),  # groups of three channels
], ids=lambda v: v.stem if hasattr(v, "stem") else None)
def test_a_norm_cancels_a_broadcast_input_added_before_it(path, dropped, drop_bias):
    """An input that is one value over each of the norm's statistics' sets, added before it, is dropped: region 0
    takes the norm (it would read the input only after it), reads no input, and ``fusetune plan`` says which entry
    went. Where the norm's sets hold several of the input's values, where it keeps running statistics or
    subtracts none, where the input multiplies, the add stays and region 0 reads it."""
    spec = load_config(path)
    plan = make_plan(spec)
    assert ("norm_cancels_input" in plan.rules) is dropped
    assert [step.where for step in plan.dropped] == (["epilogue[0] (" + spec.epilogue[0].kind + ")"] if dropped
                                                      else [])
    assert (plan.norm is not None and plan.extra is None) is dropped
    assert (plan.extra is not None) is (not dropped and path.stem != "add_temb_mul_producer_instancenorm")
    assert plan.drop_bias is drop_bias
    if dropped:
        text = CliRunner().invoke(main, ["plan", str(path)]).output
        assert "  dropped (the result is the same without: the rewrites listed say why): epilogue[0] " in text
        assert "norm_cancels_input" in text


def test_the_rule_reads_the_groups_of_a_group_norm():
    """A group norm of one channel a group has instance norm's statistics: temb (per sample and channel) cancels
    there, and not where a group holds two channels (the same chain otherwise)."""
    import dataclasses

    from fusetune.ops import GroupNorm

    spec = load_config(CANCELLED_INPUTS / "add_temb_groupnorm_pairs.yaml")
    norm = spec.epilogue[1]
    assert isinstance(norm, GroupNorm) and norm.groups == 4 and "norm_cancels_input" not in make_plan(spec).rules
    one_each = dataclasses.replace(spec, epilogue=(spec.epilogue[0], dataclasses.replace(norm, groups=8)))
    assert "norm_cancels_input" in make_plan(one_each).rules


# ------------------------------------------------------------------------------------------------------
# A step by the ops the config wrote (Step.where)
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(CHAINS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_step_is_named_by_the_ops_the_config_wrote(path):
    """However the rules rewrote it, a step's name starts with the config's own op names of its entries (``amax``,
    ``sum``, ``adaptive_avg_pool``), never the kernels' forms (spatial_reduce, reduce) unless a user wrote them."""
    import yaml

    raw = yaml.safe_load(path.read_text())["epilogue"]
    for step in (*rewrite(load_config(path)).steps, *rewrite(load_config(path)).dropped):
        entries = " + ".join(f"epilogue[{i}]" for i in step.entries)
        names = " + ".join(raw[i]["op"] for i in step.entries)
        assert step.where.startswith(f"{entries} ({names}"), (step.where, names)
        assert ": " not in step.where  # messages are split at ": " (pipeline._region)


@pytest.mark.parametrize("stem, names", [
    ("sweep4_half_conv3d_same_softmax_channels_amax_spatial_bf16",
     ["epilogue[0] (softmax)", "epilogue[1] (amax over every spatial dim)",
      "epilogue[1] (amax, its view dropping the reduced dims)"]),
    ("conv2d_exp_sum_channels_log", ["epilogue[0] (mul)", "epilogue[1] (exp)", "epilogue[2] (sum over channels)",
                                     "epilogue[3] (log)",
                                     "epilogue[2] (sum with keepdim, its view putting dim 1 back)"]),
    ("conv2d_amax_channels_unsqueeze_sigmoid",
     ["epilogue[0] (amax)", "epilogue[2] (sigmoid)", "epilogue[1] (unsqueeze)"]),
    ("conv2d_sigmoid_sum_all", ["epilogue[0] (sigmoid)", "epilogue[1] (sum over every spatial dim)",
                                "epilogue[1] (sum over channels)", "epilogue[1] (sum, its view putting dim 1 back)",
                                "epilogue[1] (sum, its view dropping the reduced dims)"]),
    ("convt3d_maxpool_maxpool_sum_channels", ["epilogue[0] + epilogue[1] (max_pool + max_pool, one max_pool of "
                                              "window [6, 6, 6])", "epilogue[2] (sum over channels)",
                                              "epilogue[2] (sum with keepdim, its view putting dim 1 back)"]),
    ("conv1d_relu_gap_squeeze", ["epilogue[0] (relu)", "epilogue[1] (adaptive_avg_pool to 1, a mean over every "
                                 "spatial dim)", "epilogue[2] (squeeze)"]),
    ("conv1d_tanh_maxpool_ceil_whole_windows", ["epilogue[0] (tanh)", "epilogue[1] (max_pool, whose ceil mode adds "
                                                "no window at the config's shapes)"]),
])
def test_fusetune_plan_names_the_rewritten_steps_by_what_the_user_wrote(stem, names):
    path = CHAINS / f"{stem}.yaml"
    assert [step.where for step in rewrite(load_config(path)).steps] == names
    text = CliRunner().invoke(main, ["plan", str(path)]).output
    assert all(name in text for name in names)
    assert "(spatial_reduce)" not in text and "(reduce)" not in text


# ------------------------------------------------------------------------------------------------------
# ceil_mode where it adds no window (ceil_adds_no_window)
# ------------------------------------------------------------------------------------------------------

def test_a_ceil_mode_pool_that_adds_no_window_at_the_configs_shapes_is_the_kernels_pool_there(tmp_path):
    """Lengths 29 and 33 under windows of 3 in strides of 2: ceil mode adds no window, so region 0 pools it (floor
    mode's windows, the same there); the rule holds at those shapes only, so the generated model knows them
    (EXACT_AT) and runs PyTorch's forward at any other. One configured shape where it adds a window (30): the
    pool runs in PyTorch, and the plan says that ceil mode adds a window at the config's shapes."""
    import dataclasses

    from fusetune.build import load_generated
    from fusetune.codegen import render

    spec = load_config(CHAINS / "conv1d_tanh_maxpool_ceil_whole_windows.yaml")
    plan = make_plan(spec)
    assert plan.pool is not None and not plan.pool.ceil_mode and not plan.tail
    assert plan.at_shapes and "ceil_adds_no_window" in plan.rules
    assert any(line.startswith("  exact at the config's shapes only (a pool in ceil mode") for line in plan.regions())
    generated = load_generated(render(plan).write(tmp_path / "whole"))
    assert generated.EXACT_AT == [list(s) for s in spec.shapes] and generated.EXACT_WORLDS is None
    document = json.loads(CliRunner().invoke(main, ["plan", "--json", str(spec.path)]).output)[0]
    assert document["exact_at_shapes_only"] == ["cudnn", "direct", "gemm"] == [
        impl for impl in plan.impl_stages if impl not in ("eager", "inductor_default", "inductor")]
    import torch
    import torch.nn.functional as F

    def pooled(op, length: int) -> torch.Tensor:
        torch.manual_seed(0)
        return eval(op.functional_code("x"), {"F": F, "x": torch.randn(2, 16, length, dtype=torch.float64)})  # noqa: S307
    for length in (29, 33, 30):  # the floor-mode pool the kernels take, against the config's, in float64
        assert torch.equal(pooled(plan.pool, length), pooled(spec.epilogue[1], length)) is (length != 30), length
    partial = make_plan(dataclasses.replace(spec, shapes=spec.shapes + ((2, 6, 33),)))  # a length of 30
    assert partial.pool is None and not partial.at_shapes and "ceil_adds_no_window" not in partial.rules
    assert [step.op.ceil_mode for step in partial.tail] == [True]
    assert ("ceil_mode=True (a partial last window), adding a window at one of the config's shapes or more, runs in "
            "PyTorch after this region") in partial.ends


def test_a_ceil_mode_pool_after_region_zero_leaves_its_kernels_exact_at_any_shape(tmp_path):
    """The ceil-mode pool adds no window at the config's shapes but comes after a softmax over the channels, so
    region 0 stops before it: its kernels compute no form that holds at those shapes only, and ``fusetune plan``
    says no world is exact there alone (it said every one). The later region that pools it has the pool as
    written (ceil mode): its own plan finds the floor-mode form and guards its model (EXACT_AT)."""
    from fusetune.build import load_generated
    from fusetune.codegen import render
    from fusetune.pipeline import later_segments

    spec = load_config(CHAINS / "conv2d_logsoftmax_channels_maxpool_ceil_whole_windows.yaml")
    plan = make_plan(spec)
    assert plan.pool is None and [step.op.kind for step in plan.tail] == ["max_pool"]
    assert "ceil_adds_no_window" in plan.rules and not plan.at_shapes
    assert not any("exact at the config's shapes only" in line for line in plan.regions())
    assert load_generated(render(plan).write(tmp_path / "r0")).EXACT_AT is None
    document = json.loads(CliRunner().invoke(main, ["plan", "--json", str(spec.path)]).output)[0]
    assert document["exact_at_shapes_only"] == []
    (later,) = [segment for segment in later_segments(plan) if segment.kernels]
    assert [op.ceil_mode for op in later.spec.epilogue] == [True]
    region = make_plan(later.spec)
    assert region.pool is not None and not region.pool.ceil_mode and region.at_shapes
    assert load_generated(render(region).write(tmp_path / "r1")).EXACT_AT == [list(s) for s in later.spec.shapes]
    # composed with a pool after it into one of 4 x 4, the later region's problem can only have the composed form:
    # the whole chain's model knows the shapes
    spec = load_config(CHAINS / "conv2d_logsoftmax_channels_maxpool_ceil_maxpool.yaml")
    composed = make_plan(spec)
    assert composed.pool is None and {"ceil_adds_no_window", "compose_pools"} <= set(composed.rules)
    (later,) = [segment for segment in later_segments(composed) if segment.kernels]
    assert [op.kernel_size for op in later.spec.epilogue] == [(4, 4)] and composed.at_shapes
    assert load_generated(render(composed).write(tmp_path / "composed")).EXACT_AT == [list(s) for s in spec.shapes]


def test_a_read_of_the_convolutions_output_after_an_inputs_read_says_so_not_a_pool():
    """Without a pool, an op reading an input moves the chain to the kernels' store chain: a later by: producer ends
    the region there, and ``fusetune plan`` names the input's read as the reason, not a pool the chain lacks."""
    text = CliRunner().invoke(main, ["plan", str(CANCELLED_INPUTS / "add_temb_mul_producer_instancenorm.yaml")]).output
    assert "after epilogue[0] (add), which reads input 'temb'" in text and "after a pool" not in text


# ------------------------------------------------------------------------------------------------------
# A pointwise op after a pixel shuffle moves before it (shuffle_commutes)
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem, order, moved, repeats, tail", [
    # prelu by 5 slopes moves before the shuffle of 20 channels into 5: each slope read 4 times
    ("conv2d_pixelshuffle2_prelu_channel", ["prelu", "pixel_shuffle"], ["prelu"], {"prelu": 4}, ["pixel_shuffle"]),
    # leaky_relu (no parameter) moves, and the eval-mode batch norm with its tensors of 3 channels read 9 times each
    ("conv2d_pixelshuffle3_leakyrelu_batchnorm_eval", ["leaky_relu", "batch_norm", "pixel_shuffle"],
     ["leaky_relu", "batch_norm"], {"batch_norm": 9}, ["pixel_shuffle"]),
    # mul by a per-channel gain (repeated), add by a scalar parameter (as it is), tanh; the group norm stops the move
    ("conv2d_pixelshuffle2_scale_shift_tanh_groupnorm", ["mul", "add", "tanh", "pixel_shuffle", "group_norm"],
     ["mul", "add", "tanh"], {"mul": 4}, ["pixel_shuffle", "group_norm"]),
    # moved past two shuffles of 2: the gain read 16 times
    ("conv2d_pixelshuffle2_pixelshuffle2_scale_hardswish", ["mul", "hardswish", "pixel_shuffle", "pixel_shuffle"],
     ["mul", "hardswish"], {"mul": 16}, ["pixel_shuffle", "pixel_shuffle"]),
    # moved past the shuffle, then past the crop of a column (sink_views): region 0 takes it
    ("conv2d_crop_pixelshuffle2_prelu_channel", ["prelu", "slice", "pixel_shuffle"], ["prelu"], {"prelu": 4},
     ["slice", "pixel_shuffle"]),
    # moved past the shuffle but not into region 0, which ends at the softmax over the width: PyTorch runs it after
    # the softmax's later region, reading the slopes repeated (pipeline._region)
    ("conv2d_softmax_width_pixelshuffle2_prelu_channel", ["softmax", "prelu", "pixel_shuffle"], ["prelu"],
     {"prelu": 4}, ["softmax", "prelu", "pixel_shuffle"]),
])
def test_a_pointwise_op_after_a_pixel_shuffle_moves_before_it(stem, order, moved, repeats, tail):
    """The rule moves every op that maps each value alone (and an eval-mode batch norm) in front of the shuffle, marks
    it, and repeats a per-channel parameter, the norm's tensors, r^2 times (a scalar one not); a group norm stays
    after it. Region 0's kernels read the repeated parameter
    (Plan.param_repeats); the shuffle runs in PyTorch after them (its exactness: the float64 test above)."""
    spec = load_config(CHAINS / f"{stem}.yaml")
    rewritten, plan = rewrite(spec), make_plan(spec)
    assert [step.op.kind for step in rewritten.steps] == order and "shuffle_commutes" in plan.rules
    assert [step.op.kind for step in rewritten.steps if MOVED in step.marks] == moved
    assert {step.op.kind: step.repeat for step in rewritten.steps if step.repeat > 1} == repeats
    assert [step.op.kind for step in plan.tail] == tail
    assert dict(plan.param_repeats) == {name: step.repeat for step in plan.head if step.op.role == "elementwise"
                                        for name in step.op.params() if step.repeat > 1}
    assert plan.norm_repeat == next((step.repeat for step in plan.head if step.op.role == "norm"), 1)


def test_the_generated_model_reads_a_moved_parameter_repeated(tmp_path):
    """ModelNew hands the kernels the slopes repeated 4 times (each read at the 4 channels that shuffle into its
    channel), an eval batch norm's tensors 9 times, and shuffles their output in PyTorch; a chain without a shuffle
    reads nothing repeated."""
    from fusetune.codegen import render

    moved = render(make_plan(load_config(CHAINS / "conv2d_pixelshuffle2_prelu_channel.yaml"))).files["model.py"]
    assert "self._repeated(self.slope, 4)" in moved and "F.pixel_shuffle(x, 2)" in moved
    normed = render(make_plan(load_config(CHAINS / "conv2d_pixelshuffle3_leakyrelu_batchnorm_eval.yaml")))
    assert "norm = [self._repeated(t, 9) if t.numel() else t for t in norm]" in normed.files["model.py"]
    plain = render(make_plan(load_config(CHAINS / "conv2d_relu_maxpool_maxpool.yaml")))
    assert "self._repeated(" not in plain.files["model.py"]
    text = CliRunner().invoke(main, ["plan", str(CHAINS / "conv2d_pixelshuffle2_scale_shift_tanh_groupnorm.yaml")])
    assert ("moved before a pixel shuffle (shuffle_commutes: a pointwise op or an eval-mode batch norm after a pixel "
            in text.output)
    assert ("epilogue[1] (mul), its per-channel parameter repeated 4 times; epilogue[2] (add); epilogue[3] (tanh)"
            in text.output)
    assert "rewrites: shuffle_commutes" in text.output


def test_a_repeated_parameter_is_kept_until_it_changes(tmp_path):
    """ModelNew repeats a moved parameter once, not at every forward: the same tensor comes back while the parameter is
    unchanged, and an in-place write (an optimizer step, load_state_dict) or a new tensor makes it repeat again. The
    parameter's version is in the model's fold_versions, which a CUDA graph of the forward is keyed by
    (fusetune/graphs.py): a graph that read the kept copy is not replayed after the write."""
    from fusetune.build import load_generated
    from fusetune.codegen import render

    module = load_generated(render(make_plan(load_config(CHAINS / "conv2d_pixelshuffle2_prelu_channel.yaml")))
                            .write(tmp_path / "moved"))
    model = module.ModelNew().double()
    first = model._repeated(model.slope, 4)
    assert torch.equal(first, model.slope.detach().reshape(-1).repeat_interleave(4))
    assert model._repeated(model.slope, 4) is first
    versions = model.fold_versions()
    assert (model.slope.data_ptr(), model.slope._version) in versions
    with torch.no_grad():
        model.slope.add_(1.0)
    assert model.fold_versions() != versions
    again = model._repeated(model.slope, 4)
    assert again is not first and torch.equal(again, model.slope.detach().reshape(-1).repeat_interleave(4))
    model.slope = torch.nn.Parameter(torch.randn_like(model.slope))
    assert torch.equal(model._repeated(model.slope, 4), model.slope.detach().reshape(-1).repeat_interleave(4))
    assert len(model._repeats) == 1  # the replaced tensor's entry went with it
    model.slope.data.mul_(2.0)  # an update the version counter does not see: kept until refresh
    assert not torch.equal(model._repeated(model.slope, 4), model.slope.detach().reshape(-1).repeat_interleave(4))
    model.refresh()
    assert torch.equal(model._repeated(model.slope, 4), model.slope.detach().reshape(-1).repeat_interleave(4))
    with torch.inference_mode():  # an inference tensor counts no versions: keyed by its storage, not raising
        kept = torch.randn(model.slope.shape)
        assert torch.equal(model._repeated(kept, 4), kept.reshape(-1).repeat_interleave(4))
        assert model._repeated(kept, 4) is model._repeated(kept, 4)


@pytest.mark.parametrize("path", sorted(SHUFFLE_STOPS.glob("*.yaml")), ids=lambda p: p.stem)
def test_ops_that_do_not_commute_with_a_pixel_shuffle_stay_after_it(path):
    """A pool, a softmax over the channels, a batch norm in training mode: each stays after the shuffle (its sets are
    the shuffled tensor's), and the relu after it too; the rule does not fire."""
    spec = load_config(path)
    rewritten = rewrite(spec)
    assert [step.op.config_name for step in rewritten.steps] == [op.config_name for op in spec.epilogue]
    assert "shuffle_commutes" not in rewritten.fired and not any(MOVED in step.marks for step in rewritten.steps)
    assert [step.op.config_name for step in make_plan(spec).tail][0] == "pixel_shuffle"
