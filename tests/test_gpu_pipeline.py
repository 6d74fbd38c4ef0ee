"""GPU tests of later regions (fusetune/pipeline.py): a chain and each of its later regions are searched with
a small budget, load_tuned attaches every later region's tuned model, and the whole model matches float64 with
the norms moved off their identity, NaN-filled outputs and shapes no tile divides; the export runs the same;
a rewrite that holds at the config's shapes only falls back to PyTorch at another shape.

Skipped without a CUDA GPU: pytest -m gpu tests/test_gpu_pipeline.py
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.config import load_config  # noqa: E402
from fusetune.deploy import load_tuned  # noqa: E402
from fusetune.export import export  # noqa: E402
from fusetune.later import region_winners  # noqa: E402
from fusetune.worlds import reference_won  # noqa: E402
from fusetune.pipeline import expand, later_segments  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.runner import GpuBenchmarker  # noqa: E402
from fusetune.search import Machine, tune_shape  # noqa: E402

from conftest import ROOT  # noqa: E402
from export_run import run_export  # noqa: E402

CHAINS = ROOT / "tests" / "chains"
#: Each later region's kind: a group norm after a pool (statistics, finalize, map), two pools that do not
#: compose, a channel reduction of a pooled 3-D tensor, a full reduction split in two, a map after a layer
#: norm in PyTorch, an adaptive pool's grid in the kernels (a flatten after it).
PIPELINES = ["conv2d_relu6_maxpool_groupnorm", "conv2d_gelu_avgpool_maxpool_avgpool",
             "convt3d_maxpool_maxpool_sum_channels", "conv2d_sigmoid_sum_all", "conv2d_layernorm_w_gelu",
             "conv2d_relu_adaptivemaxpool_grid_divides", "convt2d_outpad_batchnorm_tanh_maxpool_groupnorm"]


def _factory(cache, machine, worker):
    return lambda plan, shape: GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)


def _off_identity(model: torch.nn.Module) -> None:
    """Norms' affine parameters and running statistics away from 1 and 0, so a map that skips them shows."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if not name.startswith("producer.") and (tensor.dim() == 1 or "norm" in name):  # a layer norm's (H, W)
                tensor.uniform_(0.5, 1.5) if name.endswith("weight") else tensor.uniform_(-0.5, 0.5)
        for name, tensor in model.named_buffers():
            if name.endswith("running_mean"):
                tensor.uniform_(-0.3, 0.3)
            elif name.endswith("running_var"):
                tensor.uniform_(0.5, 2.0)


def _error(model: torch.nn.Module, reference: torch.nn.Module, shape) -> float:
    x = torch.randn(shape, device="cuda")
    with torch.no_grad():
        out = model(x)
        want = reference(x.double())
    assert out.shape == want.shape and not torch.isnan(out).any()
    return ((out.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


#: Chains whose later regions run on views (VIEW_CHAINS below), end to end as well: a channels view whose dim 1
#: the input's size sets, a plane view of a flattened 2-D tensor, and a layer norm over (H, W) of a 3-D output on
#: a plane view (its (H, W) weight and bias, off their identity, read flat).
VIEW_PIPELINES = ["conv3d_hardsigmoid_max_channels_logsumexp", "conv2d_amax_spatial_amin_channels",
                  "conv3d_layernorm_hw_gelu"]


@pytest.mark.parametrize("name", PIPELINES + VIEW_PIPELINES)
def test_every_region_tuned_and_the_whole_model_matches_float64(name, cache, worker, tmp_path):
    path = CHAINS / f"{name}.yaml"
    spec = load_config(path)
    machine = Machine.detect()
    for problem, shapes in expand(spec, list(spec.shapes)):
        for shape in shapes:
            result = tune_shape(problem, shape, cache, machine, _factory(cache, machine, worker), trials=3)
            assert result.status == "tuned", (problem.name, shape, result.message)
    model = load_tuned(path, cache)
    kernels = [s.index for s in later_segments(make_plan(spec)) if s.kernels and not all(
        reference_won(e.winner["candidate"]) for e in region_winners(s, cache, machine.gpu).values())]
    assert sorted(model._later) == kernels  # each region whose winner is kernels (eager's run inline)
    model.fill_value = float("nan")
    for region in model._later.values():
        region.fill_value = float("nan")  # unwritten elements show
    _off_identity(model)
    model.eval()
    reference = sys.modules[type(model).__module__].Model().cuda()
    reference.load_state_dict(model.state_dict())
    reference.double().eval()
    for shape in spec.shapes:
        assert _error(model, reference, shape) < 1e-2, (name, shape)
    target = export(spec, list(spec.shapes), cache, tmp_path, machine.gpu)
    assert sorted(p.name for p in target.iterdir() if p.is_dir() and p.name.startswith("r")) == [f"r{i}" for i in kernels]
    got = run_export(target, spec.shapes[-1], {**os.environ, "FUSETUNE_BUILD_DIR": str(target / "build")})
    assert got["error"] < 1e-2, got


def test_an_adaptive_pool_runs_in_the_kernels_at_another_shape(cache, worker, monkeypatch):
    """An adaptive pool whose windows are one 4 x 4 window at the config's shapes: the tuned model is exact at a
    shape where they are unequal; there the cuDNN world's kernels pool PyTorch's windows themselves (with the
    reference's forward made to fail, its output NaN-filled first); a world that pools fixed windows (direct,
    EXACT_WORLDS) falls back to those cuDNN kernels there (the module compiles them), not to the reference."""
    path = CHAINS / "conv2d_relu_adaptivemaxpool_grid_divides.yaml"
    spec = load_config(path)
    machine = Machine.detect()
    result = tune_shape(spec, spec.shapes[0], cache, machine, _factory(cache, machine, worker), trials=3)
    assert result.status in ("tuned", "cached")
    model = load_tuned(path, cache).eval()
    module = sys.modules[type(model).__module__]
    assert module.POOL_OUTPUT == [1, 4, 5] and module.EXACT_WORLDS == ["direct", "gemm"]
    reference = module.Model().cuda()
    reference.load_state_dict(model.state_dict())
    reference.double()
    other = (2, 8, 21, 25)  # 19 x 23 after the convolution: adaptive windows of unequal sizes
    assert _error(model, reference, other) < 1e-5
    from fusetune.build import build_and_load
    from fusetune.codegen import render

    full = build_and_load(render(make_plan(spec)), cache, machine.capability)  # every variant of every world
    x = torch.randn(other, device="cuda")
    with torch.no_grad():
        want = reference(x.double())

    def refused(self, *args):
        raise AssertionError("the reference's forward ran")
    monkeypatch.setattr(full.Model, "forward", refused)
    cudnn = full.ModelNew(variant={"producer": {"impl": "cudnn"}}).cuda().eval()
    cudnn.load_state_dict(model.state_dict())
    cudnn.fill_value = float("nan")
    with torch.no_grad():
        got = cudnn(x)
    assert not got.isnan().any() and ((got.double() - want).norm() / want.norm()).item() < 1e-5
    direct = full.ModelNew(variant={"producer": {"impl": "direct"}}).cuda().eval()
    direct.load_state_dict(model.state_dict())
    direct.fill_value = float("nan")
    with torch.no_grad():
        got = direct(x)
    # (the reference's forward raises: the cuDNN world's kernels ran)
    assert not got.isnan().any() and ((got.double() - want).norm() / want.norm()).item() < 1e-5


#: Chains whose later regions run on views of their input (fusetune/views.py): a logsumexp over every dim of
#: a 4-D tensor (a channels view whose dim 1 the input's size sets), a sum over H that keeps its dim with a map
#: after it, a softmax over a flattened 2-D tensor, a min over one (a plane view), a std over (H, W) (a channels
#: view: the var accumulator over H * W values).
VIEW_CHAINS = ["conv3d_hardsigmoid_max_channels_logsumexp", "convt2d_min_channels_sum_height_gelu_add",
               "conv1d_elu_dropout_train_p0_max_time_softmax", "conv2d_amax_spatial_amin_channels",
               "conv2d_instancenorm_affine_gelu_std_spatial"]


@pytest.mark.parametrize("name", VIEW_CHAINS)
def test_a_later_region_on_a_view_is_tuned_and_runs_through_its_view(name, cache, worker, tmp_path):
    """Each view region is searched (every candidate verified against float64 on the view's shapes); then the
    first region's model runs its tail with each region's kernels attached (its winner's variant, or the cuDNN
    world's default where PyTorch's own ops won), NaN-filled outputs, at the config's shapes and at one whose
    views have other sizes (untuned: the default variant), against the tail's PyTorch ops in float64."""
    from fusetune.build import build_and_load, load_generated
    from fusetune.codegen import render

    spec = load_config(CHAINS / f"{name}.yaml")
    plan = make_plan(spec)
    machine = Machine.detect()
    viewed = [s for s in later_segments(plan) if s.view is not None]
    assert viewed, name
    first = load_generated(render(plan).write(tmp_path / f"{name}_first")).ModelNew().cuda()
    regions = {}
    for segment in viewed:
        for shape in segment.spec.shapes:
            result = tune_shape(segment.spec, shape, cache, machine, _factory(cache, machine, worker), trials=3)
            assert result.status in ("tuned", "cached"), (segment.spec.name, shape, result.message)  # the module's cache
        generated = build_and_load(render(make_plan(segment.spec)), cache, machine.capability)
        winners = region_winners(segment, cache, machine.gpu)
        region = generated.ModelNew()  # the cuDNN world's default: kernels, whatever won
        for shape, entry in winners.items():
            if not reference_won(entry.winner["candidate"]):
                region._by_shape[shape] = region._resolve(entry.winner["variant"])
        region.fill_value = float("nan")
        region.calls = 0
        region.register_forward_hook(lambda module, args, out: setattr(module, "calls", module.calls + 1))
        regions[segment.index] = region
    cin, spatial = spec.shapes[0][1], spec.shapes[0][2:]
    other = (2, cin, *(s + 3 for s in spatial))
    for shape in [*spec.shapes, other]:
        x = torch.randn(plan.fused_output_shape(shape), device="cuda")
        first._later.clear()
        want = first.tail(x.double())
        for index, region in regions.items():
            first.attach_later(index, region)
            region.calls = 0
        with torch.no_grad():
            got = first.tail(x)
        assert all(region.calls == 1 for region in regions.values()), (name, shape)
        assert got.shape == want.shape == tuple(spec.output_shape(shape)) and not torch.isnan(got).any()
        error = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert error < 1e-5, (name, shape, error)
