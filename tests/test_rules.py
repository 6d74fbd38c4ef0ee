"""The exact rewrites before planning (fusetune/regions.py's RULES): each named and documented, the
algebra the planner reads (the bias an instance norm cancels, a spatial mean after a norm) among
them, and which fired listed by ``fusetune plan``."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.regions import CANCELS_BIAS, FROM_STATISTICS, RULES, rewrite

from conftest import ROOT

CONFIGS = ROOT / "configs"
CHAINS = ROOT / "tests" / "chains"
#: Mean centrings, one of them cancelled by the instance norm after it (norm_cancels_centring).
CENTRING = ROOT / "tests" / "centring"


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


def _run_steps(model, steps, x, inputs=None):
    """The steps' PyTorch lines on ``x`` (the convolution's output, which ``by: producer`` ops read too), the
    config's extra inputs bound by their names."""
    import torch
    import torch.nn.functional as F

    y = x
    for step in steps:
        x = eval(step.op.forward_code("x", step.attr), {"self": model, "x": x, "y": y, "F": F, "torch": torch,  # noqa: S307
                                                        **(inputs or {})})
    return x


@pytest.mark.parametrize("path", sorted(CHAINS.glob("*.yaml")) + sorted(CONFIGS.glob("*.yaml"))
                         + sorted(CENTRING.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_rewritten_chain_computes_the_configs_at_its_shapes(path, tmp_path):
    """Every rule is exact: the rewritten steps, run as PyTorch, give the chain's own result in float64 at
    each of the config's shapes (at_shapes rules hold there), norms moved off their identity."""
    import torch

    from fusetune.build import load_generated
    from fusetune.codegen import render

    spec = load_config(path)
    rewritten = rewrite(spec)
    generated = load_generated(render(make_plan(spec)).write(tmp_path))
    torch.manual_seed(0)
    model = generated.Model().double()
    for module in model.modules():
        for name in ("weight", "bias", "running_mean"):
            tensor = getattr(module, name, None)
            if module is not model.producer and isinstance(tensor, torch.Tensor) and tensor.dim() == 1:
                with torch.no_grad():
                    tensor.uniform_(0.5, 1.5) if name == "weight" else tensor.uniform_(-0.5, 0.5)
    model.eval()  # both sides run the same modules: running statistics for every batch norm here
    for shape in spec.shapes:
        x = model.producer(torch.randn(shape, dtype=torch.float64))
        inputs = {name: torch.randn(s, dtype=torch.float64) for name, s in zip(spec.inputs, spec.input_shapes(shape))}
        expected = _run_steps(model, [type("S", (), {"op": op, "attr": attr})() for op, attr in
                                      _reference_steps(spec)], x, inputs)
        assert torch.allclose(_run_steps(model, rewritten.steps, x, inputs), expected, rtol=1e-9, atol=1e-9), shape


def _reference_steps(spec):
    from fusetune.regions import reference_attr

    return [(op, reference_attr(spec, i)) for i, op in enumerate(spec.epilogue)]
