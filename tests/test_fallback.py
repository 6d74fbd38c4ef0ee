"""Where a generated model's world cannot run a shape, on the CPU: what still computes the chain exactly runs
instead, said once in the log. A direct or gemm world that pools an adaptive pool as the one window it is at the
config's shapes (EXACT_WORLDS) falls back elsewhere to the cuDNN world's default kernels where the module
compiles them (a winner's module does: lazy.winner_module), else to the reference's PyTorch forward; so does a
world whose launcher refuses a shape (FT_TOO_BIG: KernelTooBig), once per shape, unless a stage before it already
updated a batch norm's running statistics.

The kernels are a recorder (``_launch`` replaced): the model's decisions run on CPU tensors and the recorder
says which stages launched. tests/test_gpu_fallback.py runs the kernels on a GPU against float64.
"""
from __future__ import annotations

import logging
import re

import pytest

from fusetune.build import load_generated
from fusetune.codegen import plan_space, render
from fusetune.config import load_config
from fusetune.lazy import winner_module
from fusetune.plan import make_plan

from conftest import ROOT

torch = pytest.importorskip("torch")

CHAINS = ROOT / "tests" / "chains"
#: Equal 4 x 4 windows at the config's shapes (direct and gemm exact there alone); unequal at the other.
GRID = CHAINS / "conv2d_relu_adaptivemaxpool_grid_divides.yaml"
UNEQUAL = (2, 8, 19, 23)
#: A batch norm in training, whose direct world runs direct_stats, finalize (running statistics), direct_main.
NORM = CHAINS / "convt3d_batchnorm_avgpool_avgpool.yaml"


class _Kernels:
    """Stands in for the extension: records each launched stage; ``refuse`` the stages that return FT_TOO_BIG."""

    def __init__(self, generated, refuse=()):
        self.generated, self.refuse, self.stages = generated, set(refuse), []

    def launch(self, kernels, stage, variant, dims, **_):
        name = self.generated.STAGES[stage]
        if name in self.refuse:
            raise self.generated.KernelTooBig(f"stage {name!r} failed to launch: needs more shared memory", name)
        self.stages.append(name)


def _model(generated, monkeypatch, variant, refuse=()):
    kernels = _Kernels(generated, refuse)
    monkeypatch.setattr(generated, "_launch", kernels.launch)
    monkeypatch.setattr(generated, "_check_input", lambda x: None)  # CPU tensors: the kernels are the recorder
    monkeypatch.setattr(generated, "load_kernels", lambda: None)
    monkeypatch.setattr(generated, "_SAID", set())
    return generated.ModelNew(variant=variant), kernels


def _said(caplog, generated) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == f"fusetune.generated.{generated.MODULE_NAME}"]


def test_ft_too_big_is_the_launchers_status():
    """The status a launcher returns (args.h, in every unit) is the one model.py raises KernelTooBig for."""
    files = render(make_plan(load_config(GRID))).files
    units = [text for name, text in files.items() if name.endswith(".cu")]
    values = {int(re.search(r"#define FT_TOO_BIG \((-?\d+)\)", text).group(1)) for text in units}
    assert len(values) == 1 and f"FT_TOO_BIG = {values.pop()}\n" in files["model.py"]


@pytest.mark.parametrize("world", ["direct", "gemm"])
def test_an_exact_at_shapes_winner_falls_back_to_cudnn_elsewhere(world, tmp_path, monkeypatch, caplog):
    """The winner's own module (its variants alone) compiles the cuDNN stages' defaults: at a shape of unequal
    windows cuDNN then window_map run, said once however many calls; at the config's shapes the winner runs."""
    plan = make_plan(load_config(GRID))
    generated = load_generated(winner_module(plan, {"producer": {"impl": world}}).write(tmp_path / world))
    assert generated.EXACT_WORLDS == ["direct", "gemm"] and generated._fallback_resolved()["impl"] == "cudnn"
    model, kernels = _model(generated, monkeypatch, {"producer": {"impl": world}})
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        model(torch.rand(UNEQUAL))
    assert kernels.stages == ["window_map"] * 3
    said = _said(caplog, generated)
    assert len(said) == 1 and f"the {world} world does not run input shape {list(UNEQUAL)}" in said[0]
    assert "the cudnn world with its stages' default variants runs there instead" in said[0]
    kernels.stages.clear()
    model(torch.rand(2, 8, 18, 22))
    assert kernels.stages == [f"{world}_main"]


def test_without_the_cudnn_defaults_compiled_the_reference_runs(tmp_path, monkeypatch, caplog):
    """A module whose window_map holds another variant alone cannot run cuDNN's defaults: the reference runs
    (no stage launched, its output PyTorch's own), said once."""
    plan = make_plan(load_config(GRID))
    default = plan_space(plan).stage_values(plan_space(plan).default())["window_map"]
    other = next(v for v in _variants(plan, "window_map") if v != default)
    only = {"window_map": [other], "direct_main": _variants(plan, "direct_main")[:1], "gemm_main": []}
    generated = load_generated(render(plan, only).write(tmp_path / "other"))
    assert generated._fallback_resolved() is None
    model, kernels = _model(generated, monkeypatch, {"producer": {"impl": "direct"}, "window_map": other,
                                                     "direct_main": _variants(plan, "direct_main")[0]})
    caplog.set_level(logging.WARNING)
    x = torch.rand(UNEQUAL)
    reference = generated.Model()
    reference.load_state_dict(model.state_dict())
    assert torch.equal(model(x), reference(x)) and torch.equal(model(x), reference(x))
    assert kernels.stages == []
    said = _said(caplog, generated)
    assert len(said) == 1 and "the reference's PyTorch forward runs there instead" in said[0]


def _variants(plan, stage: str) -> list[dict]:
    return next(f.variants() for f in plan_space(plan).families if f.family == stage)


def test_a_refused_shape_falls_back_once_and_is_remembered(tmp_path, monkeypatch, caplog):
    """A launcher's FT_TOO_BIG at its world's first stage: nothing ran, so cuDNN's kernels run instead, and at
    the next call of that shape the refused world is not tried again. With fall_back off the refusal stands."""
    plan = make_plan(load_config(NORM))
    generated = load_generated(winner_module(plan, {"producer": {"impl": "direct"}}).write(tmp_path / "norm"))
    model, kernels = _model(generated, monkeypatch, {"producer": {"impl": "direct"}}, refuse={"direct_stats"})
    caplog.set_level(logging.WARNING)
    shape = tuple(plan.spec.shapes[0])
    model(torch.rand(shape))
    model(torch.rand(shape))
    assert kernels.stages == ["stats", "finalize", "window_map"] * 2
    said = _said(caplog, generated)
    assert len(said) == 1 and "needs more shared memory" in said[0] and "the cudnn world" in said[0]
    assert model._refusals[shape]["impl"] == "cudnn"
    strict, kernels = _model(generated, monkeypatch, {"producer": {"impl": "direct"}}, refuse={"direct_stats"})
    strict.fall_back = False  # as fusetune.evaluate verifies and times one variant: it fails as itself
    with pytest.raises(generated.KernelTooBig, match="more shared memory"):
        strict(torch.rand(shape))
    assert kernels.stages == [] and not strict._refusals


def test_a_refusal_after_the_running_statistics_changed_stands(tmp_path, monkeypatch):
    """FT_TOO_BIG at direct_main, after direct_stats and finalize ran: in training their running statistics
    were updated, and a fallback would update them twice, so the error stands; in a module without running
    statistics to update (eval mode runs the reference here) there is nothing to protect."""
    plan = make_plan(load_config(NORM))
    generated = load_generated(winner_module(plan, {"producer": {"impl": "direct"}}).write(tmp_path / "late"))
    model, kernels = _model(generated, monkeypatch, {"producer": {"impl": "direct"}}, refuse={"direct_main"})
    with pytest.raises(generated.KernelTooBig, match="direct_main"):
        model(torch.rand(tuple(plan.spec.shapes[0])))
    assert kernels.stages == ["direct_stats", "finalize"] and not model._refusals


def test_a_rewrite_exact_at_the_configs_shapes_only_runs_the_reference_elsewhere(tmp_path, monkeypatch, caplog):
    """A rewrite that holds at the config's shapes only (EXACT_WORLDS None) guards every world, cuDNN's too:
    at another shape the reference runs, said once; the eager world runs the reference anyway and says nothing."""
    import dataclasses

    from fusetune import regions

    marking = regions.Rule("test_at_shapes", "a test's rule that holds at the config's shapes only",
                           lambda steps, spec: [dataclasses.replace(steps[0], marks=("test",))] + steps[1:],
                           at_shapes=True)
    monkeypatch.setattr(regions, "RULES", regions.RULES + (marking,))
    plan = make_plan(load_config(GRID))
    generated = load_generated(render(plan).write(tmp_path / "guarded"))
    assert generated.EXACT_WORLDS is None
    caplog.set_level(logging.WARNING)
    for world, said in (("eager", 0), ("cudnn", 1)):
        model, kernels = _model(generated, monkeypatch, {"producer": {"impl": world}})
        model(torch.rand(UNEQUAL))
        model(torch.rand(UNEQUAL))
        assert kernels.stages == [] and len(_said(caplog, generated)) == said, world
    assert "the reference's PyTorch forward runs there instead" in _said(caplog, generated)[0]
    model(torch.rand(2, 8, 18, 22))
    assert kernels.stages == ["window_map"]


@pytest.mark.parametrize("chain", [GRID, NORM])
def test_every_worlds_winner_module_compiles_cudnns_defaults(chain, tmp_path):
    """lazy.winner_module compiles every cuDNN stage (one unit per stage, never per variant) with the winner's
    values there, which the search's canonical form resets to the defaults where the winner does not run them:
    so a winner of any world can fall back to cuDNN's kernels."""
    plan = make_plan(load_config(chain))
    for world in plan.impl_stages:
        generated = load_generated(winner_module(plan, {"producer": {"impl": world}}).write(tmp_path / world))
        assert generated._fallback_resolved()["impl"] == "cudnn", world
