"""Later regions (fusetune/pipeline.py): what follows the first region is cut into later regions of kernels,
each a problem of its own, and PyTorch segments; the generated model runs a later region's tuned model where
one is attached, its ops in PyTorch otherwise; export writes each tuned one beside the first."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fusetune.build import load_generated
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.export import export
from fusetune.pipeline import expand, later_segments
from fusetune.plan import make_plan
from fusetune.search import Machine, tune_shape

from conftest import ROOT
from fake_handlers import FakeBench

CHAINS = sorted((ROOT / "tests" / "chains").glob("*.yaml"))
MACHINE = Machine("FakeGPU", "9.0", "13.0", "2.13")
#: A chain with two later regions of kernels (a max pool, then an avg pool, that do not compose).
TWO_REGIONS = ROOT / "tests" / "chains" / "conv2d_gelu_avgpool_maxpool_avgpool.yaml"
#: A chain whose later region runs a norm module of the reference's (group norm after a max pool).
NORM_AFTER_POOL = ROOT / "tests" / "chains" / "conv2d_relu6_maxpool_groupnorm.yaml"


@pytest.mark.parametrize("path", CHAINS, ids=lambda p: p.stem)
def test_segments_cover_the_tail_and_each_later_region_plans_whole(path: Path) -> None:
    """The segments are the tail, in order, nothing left out or twice; a later region of kernels plans with
    its whole chain fused (no tail of its own), offers no world that computes a convolution, and its
    shapes are the tensor's at the config's shapes."""
    spec = load_config(path)
    plan = make_plan(spec)
    segments = later_segments(plan)
    assert [step for s in segments for step in s.steps] == list(plan.tail)
    assert [s.index for s in segments] == list(range(1, len(segments) + 1))
    for a, b in zip(segments, segments[1:]):
        assert a.kernels or b.kernels, "two PyTorch segments in a row are one"
    for shape in spec.shapes:
        tensor = plan.fused_output_shape(shape)
        for segment in segments:
            if segment.kernels:
                assert segment.spec.shapes[spec.shapes.index(shape)] == tensor
                region = make_plan(segment.spec)
                assert region.head and not region.tail
                assert not segment.spec.producer.convolves and set(region.impl_stages) <= {"cudnn", "eager"}
                assert region.fused_output_shape(tensor) == _through(segment, tensor)
            else:
                assert segment.why
            tensor = _through(segment, tensor)
        assert tensor == spec.output_shape(shape)


def _through(segment, shape):
    for step in segment.steps:
        shape = step.op.out_shape(shape)
    return shape


def test_expand_lists_each_later_region_at_the_asked_shapes() -> None:
    spec = load_config(TWO_REGIONS)
    problems = expand(spec, [spec.shapes[-1]])
    assert [p.name for p, _ in problems] == [spec.name, f"{spec.name}_r1", f"{spec.name}_r2"]
    first, r1, r2 = (shapes[0] for _, shapes in problems)
    tensor = make_plan(spec).fused_output_shape(first)
    assert r1 == tensor and r2 == (tensor[0], tensor[1], tensor[2] // 2, tensor[3] // 2)  # after the 2x2 max pool


def test_the_generated_model_runs_an_attached_later_region_on_its_own_modules(tmp_path: Path) -> None:
    """The first region's model runs a later region through the model attached for it, which reads the
    first's very norm module (moved off its identity here, so a copy would show), and its ops in PyTorch
    without one. On the CPU, the tail alone: no kernels are needed for it."""
    spec = load_config(NORM_AFTER_POOL)
    plan = make_plan(spec)
    (segment,) = later_segments(plan)
    first = load_generated(render(plan).write(tmp_path / "first"))
    region = load_generated(render(make_plan(segment.spec)).write(tmp_path / "r1"))
    model = first.ModelNew()
    (theirs, ours), = segment.attrs
    with torch.no_grad():
        getattr(model, ours).weight.uniform_(0.5, 2.0)
        getattr(model, ours).bias.uniform_(-1.0, 1.0)
    x = torch.randn(segment.spec.shapes[0], dtype=torch.float64)
    model.double()
    in_pytorch = model.tail(x)
    expected = getattr(model, ours)(x)
    assert torch.equal(in_pytorch, expected)
    calls = []

    class Spy(region.Model):  # the region's reference model, recording that the parent called it
        def forward(self, x):
            calls.append(x.shape)
            return super().forward(x)
    spy = Spy()
    model.attach_later(segment.index, spy)
    assert getattr(spy, theirs) is getattr(model, ours)  # the very module, not a copy
    assert torch.equal(model.tail(x), expected) and calls == [x.shape]
    other = first.Model().double()
    model.share_from(other)  # the reference's modules replace ours: the region follows
    assert getattr(spy, theirs) is getattr(other, ours)
    model.eval()
    model.tail(x)
    assert not spy.training
    with pytest.raises(ValueError, match="no later region 5"):
        model.attach_later(5, spy)


def test_export_writes_each_tuned_later_region_beside_the_first(tmp_path: Path) -> None:
    """Every region tuned: the export has r1/ and r2/, each a module of its winners with its winner.json,
    which the first's model loads at construction; a region not tuned stays out, said in winner.json."""
    spec = load_config(TWO_REGIONS)
    shape = spec.shapes[-1]
    cache = Cache(tmp_path / "cache")
    problems = expand(spec, [shape])
    for problem, shapes in problems[:2]:  # the first region and region 1; region 2 left untuned
        result = tune_shape(problem, shapes[0], cache, MACHINE, FakeBench().factory, trials=3, echo=lambda s: None)
        assert result.status == "tuned", result.message
    target = export(spec, [shape], cache, tmp_path / "out", gpu="FakeGPU")
    record = json.loads((target / "winner.json").read_text())
    assert record["later_regions"]["r1"].endswith("tuned kernels")
    assert "PyTorch (" in record["later_regions"]["r2"] and "no tuned winner of later region" in record["later_regions"]["r2"]
    assert (target / "r1" / "model.py").is_file() and not (target / "r2").exists()
    r1 = json.loads((target / "r1" / "winner.json").read_text())
    assert r1["config"] == f"{spec.name}_r1" and r1["shapes"][0]["input_shape"] == list(problems[1][1][0])
    generated = load_generated(target)
    model = generated.ModelNew()
    assert sorted(model._later) == [1]  # region 1's tuned model, loaded from r1/
    assert type(model._later[1]).__module__.endswith("_r1")


def test_a_rewrite_that_holds_at_the_configs_shapes_only_guards_the_model(tmp_path: Path) -> None:
    """An adaptive pool fused as the plain pool its windows are at the config's shapes: the generated model
    knows those shapes (EXACT_AT) and runs PyTorch's forward at any other; without such a rewrite, None."""
    spec = load_config(ROOT / "tests" / "chains" / "conv2d_relu_adaptivemaxpool_grid_divides.yaml")
    plan = make_plan(spec)
    assert plan.at_shapes and plan.pool is not None and plan.pool.kernel_size == (4, 4)
    generated = load_generated(render(plan).write(tmp_path / "guarded"))
    assert generated.EXACT_AT == [list(s) for s in spec.shapes]
    plain = load_generated(render(make_plan(load_config(TWO_REGIONS))).write(tmp_path / "plain"))
    assert plain.EXACT_AT is None


def test_the_later_regions_modules_are_built_in_the_background(monkeypatch, tmp_path: Path) -> None:
    """fusetune search starts the later regions' builds while the first region is searched: every later region's
    full module once, never the first region's (its search builds it), nothing without later regions."""
    import fusetune.build
    from fusetune.later import prebuild

    built: list[list[str]] = []
    monkeypatch.setattr(fusetune.build, "build_many", lambda modules, cache, arch=None: built.append(
        [m.name for m in modules]))
    spec = load_config(TWO_REGIONS)
    problems = [p for p, _ in expand(spec, list(spec.shapes))]
    thread = prebuild(problems + problems, Cache(tmp_path), "9.0")  # a config given twice: built once
    thread.join(30)
    assert built == [[render(make_plan(p)).name for p in problems[1:]]]
    assert prebuild([load_config(ROOT / "configs" / "conv2d_groupnorm_scale_maxpool_clamp.yaml")], Cache(tmp_path),
                    "9.0") is None
