"""Later regions (fusetune/pipeline.py): what follows the first region is cut into later regions of kernels,
each a problem of its own, and PyTorch segments; the generated model runs a later region's tuned model where
one is attached, its ops in PyTorch otherwise; export writes each tuned one beside the first."""
from __future__ import annotations

import json
import math
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
    shapes are the tensor's at the config's shapes (through its view, where it has one: the same elements, and
    its output as many as the chain's shape after it)."""
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
                seen = segment.view.shape(tensor) if segment.view else tensor
                assert segment.spec.shapes[spec.shapes.index(shape)] == seen
                assert segment.inputs[spec.shapes.index(shape)] == tensor
                region = make_plan(segment.spec)
                assert region.head and not region.tail
                assert not segment.spec.producer.convolves and set(region.impl_stages) <= {"cudnn", "eager"}
                if segment.view:
                    assert math.prod(seen) == math.prod(tensor) and len(seen) == 3
                    assert segment.spec.producer.any_channels and segment.spec.producer.out_shape(seen) == seen
                    assert segment.view.back(tensor) == _through(segment, tensor)
                    assert math.prod(region.fused_output_shape(seen)) == math.prod(_through(segment, tensor))
                else:
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


def test_a_rewrite_that_holds_at_the_configs_shapes_only_guards_the_model(monkeypatch, tmp_path: Path) -> None:
    """A rule that holds at the config's shapes only (Rule.at_shapes: regions.RULES' ceil_adds_no_window, and a
    test's own here): the generated model knows those shapes (EXACT_AT) and runs PyTorch's forward at any other,
    whichever world won (EXACT_WORLDS None). An adaptive pool is no such rewrite: the kernels pool its windows at any shape; only
    the worlds that pool it as the fixed window it is at the config's shapes are guarded (tests/test_adaptive.py)."""
    import dataclasses

    from fusetune import regions
    from fusetune.ops import AdaptivePool

    spec = load_config(ROOT / "tests" / "chains" / "conv2d_relu_adaptivemaxpool_grid_divides.yaml")
    plan = make_plan(spec)
    assert not plan.at_shapes and isinstance(plan.pool, AdaptivePool)
    assert load_generated(render(plan).write(tmp_path / "adaptive")).EXACT_WORLDS == ["direct", "gemm"]
    assert load_generated(render(make_plan(load_config(TWO_REGIONS))).write(tmp_path / "plain")).EXACT_AT is None
    marking = regions.Rule("test_at_shapes", "a test's rule that holds at the config's shapes only",
                           lambda steps, spec: [dataclasses.replace(steps[0], marks=("test",))] + steps[1:],
                           at_shapes=True)
    monkeypatch.setattr(regions, "RULES", regions.RULES + (marking,))
    guarded = make_plan(spec)
    assert guarded.at_shapes and "test_at_shapes" in guarded.rules
    generated = load_generated(render(guarded).write(tmp_path / "guarded"))
    assert generated.EXACT_AT == [list(s) for s in spec.shapes] and generated.EXACT_WORLDS is None


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


#: Each corpus chain's later regions, reviewed: kernels (and their view) or PyTorch (and why).
LATER_EXPECTED = ROOT / "tests" / "later_expected.yaml"


def _later_expected() -> dict[str, list[dict]]:
    import yaml

    return {entry["chain"]: entry["later"] for entry in yaml.safe_load(LATER_EXPECTED.read_text())}


def _view_chains() -> list[str]:
    return [chain for chain, later in _later_expected().items() if any("view" in e for e in later)]


@pytest.mark.parametrize("path", CHAINS, ids=lambda p: p.stem)
def test_each_chains_later_regions_are_the_reviewed_ones(path: Path) -> None:
    """Which regions of each corpus chain run in the kernels (on which view) and which in PyTorch (why) is
    tests/later_expected.yaml's: a change that moves one is meant, and said there."""
    got = []
    for segment in later_segments(make_plan(load_config(path))):
        if segment.kernels:
            got.append({"runs": "kernels", **({"view": segment.view.fact()} if segment.view else {})})
        else:
            got.append({"runs": "pytorch", "why": segment.why})
    want = _later_expected().get(path.stem, [])
    assert [{k: v for k, v in g.items() if k != "why"} for g in got] == [
        {k: v for k, v in w.items() if k != "why"} for w in want], (
        f"{path.stem}: its later regions are now {got}; where that is meant, say so in {LATER_EXPECTED.name}")
    for g, w in zip(got, want):
        assert g.get("why", "").startswith(w.get("why", "")), (path.stem, g, w)


def test_the_view_chains_of_issue_22_run_on_views() -> None:
    """Reductions over dims other than the channel dim or every spatial one, and a softmax and a reduction on a
    2-D tensor after a flatten: later regions of kernels on views, not PyTorch."""
    assert {"conv3d_hardsigmoid_max_channels_logsumexp", "convt2d_min_channels_sum_height_gelu_add",
            "conv1d_elu_dropout_train_p0_max_time_softmax", "conv2d_amax_spatial_amin_channels"} <= set(_view_chains())


#: Configs beyond the corpus whose later regions run on views and beside them (tests/views/).
VIEW_CONFIGS = sorted((ROOT / "tests" / "views").glob("*.yaml"))


def _view_config(stem: str) -> Path:
    return next((p for p in VIEW_CONFIGS if p.stem == stem), ROOT / "tests" / "chains" / f"{stem}.yaml")


def test_a_view_config_splits_where_no_view_serves() -> None:
    """A map that reads a per-channel parameter leaves the region on a view for one of its own (on the tensor
    as it is); a reduction over dims that are not consecutive stays in PyTorch and says so; a map before an op
    that chose a view joins it."""
    (path,) = [p for p in VIEW_CONFIGS if p.stem == "layernorm_sum_height_scale_amax_split_logsoftmax"]
    segments = later_segments(make_plan(load_config(path)))
    kinds = [(s.kernels, s.view is not None, [step.op.kind for step in s.steps]) for s in segments]
    assert (True, True, ["reduce"]) in kinds and (True, False, ["mul", "relu"]) in kinds
    assert (True, True, ["mul", "log_softmax"]) in kinds
    (amax,) = [s for s in segments if [step.op.kind for step in s.steps] == ["reduce"] and not s.kernels]
    assert amax.why.endswith("dims [1, 3] are not consecutive: no view of the tensor makes them one dim")


@pytest.mark.parametrize("stem", _view_chains() + [p.stem for p in VIEW_CONFIGS])
def test_a_later_region_runs_on_its_view_and_back(stem: str, tmp_path: Path) -> None:
    """The generated model's tail runs each later region on a view through the region's module (its
    reference model here, PyTorch's ops on the view's shape: on the CPU no kernels are needed), and gives
    exactly what the chain's own ops give, in float64, at every shape of the config; the region sees the
    view's shape, contiguous. A tensor that is not contiguous (no free view) runs the region's ops in PyTorch."""
    spec = load_config(_view_config(stem))
    plan = make_plan(spec)
    first = load_generated(render(plan).write(tmp_path / f"{stem}_first"))  # imported by its folder's name
    model = first.ModelNew().double()
    viewed = [s for s in later_segments(plan) if s.view is not None]
    calls: list[tuple[int, tuple[int, ...], bool]] = []
    spies = {}
    for segment in viewed:
        region = load_generated(render(make_plan(segment.spec)).write(tmp_path / f"{stem}_r{segment.index}"))

        class Spy(region.Model):  # the region's reference: PyTorch's ops on the view, recording its input
            def forward(self, x, index=segment.index):
                calls.append((index, tuple(x.shape), x.is_contiguous()))
                return super().forward(x)
        spies[segment.index] = Spy().double()
    torch.manual_seed(0)
    for i, shape in enumerate(spec.shapes):
        x = torch.randn(plan.fused_output_shape(shape), dtype=torch.float64)
        model._later.clear()
        expected = model.tail(x)
        for index, spy in spies.items():
            model.attach_later(index, spy)
        calls.clear()
        got = model.tail(x)
        assert got.shape == expected.shape == spec.output_shape(shape)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        assert [c[0] for c in calls] == [s.index for s in viewed]
        assert [c[1] for c in calls] == [s.spec.shapes[i] for s in viewed] and all(c[2] for c in calls)
        if x.dim() > 1 and viewed[0].index == 1 and x.shape[-1] > 1:  # the tail's input is the region's
            strided = torch.empty(x.shape[::-1], dtype=x.dtype).permute(*range(x.dim() - 1, -1, -1))
            strided.copy_(x)
            assert not strided.is_contiguous()
            calls.clear()
            torch.testing.assert_close(model.tail(strided), expected, rtol=1e-12, atol=1e-12)
            assert 1 not in [c[0] for c in calls]


def test_the_generated_fold_and_unfold_are_the_region_views(tmp_path: Path) -> None:
    """templates/model.py.j2's _fold and _unfold compute RegionView.shape and .back, for every view of
    tensors of rank 2 to 5 (sizes no view divides evenly)."""
    import itertools

    from fusetune.views import AFTER, FORMS, RegionView

    generated = load_generated(render(make_plan(load_config(
        ROOT / "tests" / "chains" / f"{_view_chains()[0]}.yaml"))).write(tmp_path / "fold_unfold"))
    for rank in range(2, 6):
        shape = tuple([3, 5, 7, 2, 11][:rank])
        for first, last in itertools.combinations_with_replacement(range(1, rank), 2):
            for form, after in itertools.product(FORMS, AFTER):
                if form == "plane" and last != rank - 1:
                    continue
                view = RegionView(first=first, last=last, form=form, after=after)
                assert generated._fold(shape, view.fact()) == view.shape(shape)
                assert generated._unfold(shape, view.fact()) == view.back(shape)
                assert math.prod(view.shape(shape)) == math.prod(shape)


def test_a_run_no_view_makes_the_kernels_stays_in_pytorch_with_why() -> None:
    """Dims that are not consecutive, a second reduction in one region, a map that reads a per-channel
    parameter on a view: no view; an (N, C, spatial...) tensor in the kernels' forms needs none."""
    from fusetune.ops import DimReduce, Mul, Relu
    from fusetune.ops.reduce import LogSoftmax
    from fusetune.views import RegionView, region_view

    def reduce(dims, keepdim=False, mode="sum"):
        return DimReduce(mode=mode, over="dim", dim=dims[0], dims=dims, keepdim=keepdim)
    tensor = (2, 6, 5, 7)
    assert "not consecutive" in region_view([reduce((1, 3))], tensor)
    assert "starts another" in region_view([reduce((2,), True), Relu(), reduce((1,))], tensor)
    assert "per-channel parameter" in region_view([reduce((2,), True), Mul(param="scale")], tensor)
    assert region_view([Relu(), reduce((1,)), Mul(param="scale")], tensor) is None  # the kernels' own form
    assert region_view([reduce((2, 3), True, "max")], tensor) is None  # every spatial dim, kept: plane_reduce's
    assert region_view([reduce((2, 3), True, "logsumexp")], tensor) == RegionView(2, 3, "channels", "keepdim")
    assert region_view([reduce((2, 3), False, "amin")], tensor) == RegionView(2, 3, "plane", "drop")
    assert region_view([Relu(), reduce((2,), True), Relu()], tensor) == RegionView(2, 2, "channels", "keepdim")
    assert region_view([LogSoftmax(dim=3)], tensor) == RegionView(3, 3, "channels", "same")
    assert "over the batch dim" in region_view([LogSoftmax(dim=0)], tensor)
    assert region_view([Relu()], (2, 6)) == RegionView(1, 1, "channels", "same")


def test_fusetune_plan_shows_each_regions_view() -> None:
    """`fusetune plan` prints a later region's view under it (what it reads, the shape its problem sees, the
    chain's shape after it); `--json` gives the same as data, at each of the config's shapes."""
    from click.testing import CliRunner

    from fusetune.cli import main

    chain = ROOT / "tests" / "chains" / "conv3d_hardsigmoid_max_channels_logsumexp.yaml"
    spec = load_config(chain)
    segments = [s for s in later_segments(make_plan(spec)) if s.view is not None]
    text = CliRunner().invoke(main, ["plan", str(chain)])
    assert text.exit_code == 0, text.output
    for segment in segments:
        assert f"    view: {segment.view.describe(segment.inputs[0])}\n" in text.output
    assert "    view: dims 1..3 of [2, 7, 10, 13] as [2, 910, 1] (channels), back to [2]" in text.output
    result = CliRunner().invoke(main, ["plan", "--json", str(chain)])
    assert result.exit_code == 0, result.output
    (document,) = json.loads(result.output)
    views = {r["region"]: r["view"] for r in document["later"] if r["runs"] == "kernels"}
    first = views[segments[0].index]
    assert {k: first[k] for k in ("first", "last", "form", "after")} == {"first": 1, "last": 3, "form": "channels",
                                                                         "after": "drop"}
    assert first["tensor"] == [[2, 7, 10, 13], [3, 5, 9, 6]] and first["as"] == [[2, 910, 1], [3, 270, 1]]
    assert first["back"] == [[2], [3]]
    assert all(r["view"] is None for r in document["later"] if r["runs"] == "kernels" and r["region"] not in
               {s.index for s in segments})


def test_a_view_region_is_tuned_at_every_shape_and_exported(tmp_path: Path) -> None:
    """A region on a view whose dim 1 the input's size sets (a logsumexp over D, H, W: 910 and 270 at the
    config's shapes) is one problem, tuned at each shape (its producer takes any channel count), exported beside the
    first region, and attached by the first's model at load."""
    from fake_handlers import fake_time
    from fusetune.worlds import reference_won

    spec = load_config(ROOT / "tests" / "chains" / "conv3d_hardsigmoid_max_channels_logsumexp.yaml")
    cache = Cache(tmp_path / "cache")
    problems = expand(spec, list(spec.shapes))
    views = [s for s in later_segments(make_plan(spec)) if s.view is not None]
    assert len({shape[1] for shape in views[0].spec.shapes}) == 2
    for problem, shapes in problems:
        for shape in shapes:
            bench = FakeBench(times=lambda c: 9.0 if reference_won(c) else fake_time(c))  # the kernels win
            result = tune_shape(problem, shape, cache, MACHINE, bench.factory, trials=3, echo=lambda s: None)
            assert result.status == "tuned", (problem.name, shape, result.message)
    target = export(spec, list(spec.shapes), cache, tmp_path / "out", gpu="FakeGPU")
    record = json.loads((target / "winner.json").read_text())
    for segment in views:
        assert record["later_regions"][f"r{segment.index}"].endswith("tuned kernels")
        region = json.loads((target / f"r{segment.index}" / "winner.json").read_text())
        assert [s["input_shape"] for s in region["shapes"]] == [list(s) for s in segment.spec.shapes]
    model = load_generated(target).ModelNew()
    assert sorted(model._later) == sorted(s.index for s in later_segments(make_plan(spec)) if s.kernels)
