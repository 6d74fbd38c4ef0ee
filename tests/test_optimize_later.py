"""``fusetune.optimize`` and a chain's later regions (fusetune/pipeline.py): each tuned after every chain's first
region, within the same budget, once per problem; attached to its chain's generated model on the user's own
modules; keyed as ``fusetune search`` keys it (either finds what the other tuned). CPU tests: fake builds and
benchmarkers (tests/fake_builds.py), the kernels themselves need a GPU (the test marked gpu runs them)."""
from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import pytest
import torch

from fusetune.cache import Cache
from fusetune.optimizer import _configs, _traced_copy, fused_chains, optimize
from fusetune.pipeline import expand
from fusetune.search import Machine, tune_shape
from fusetune.worlds import WORLDS

from conftest import import_file
from fake_builds import FakeBuilder, FakeLazyFactory, kernel_first_time
from fake_handlers import MACHINE_FIELDS, FakeBench, fake_time

MODELS = Path(__file__).resolve().parent / "models"
MACHINE = Machine(*MACHINE_FIELDS)
#: Two chains, each Conv2d -> ReLU -> MaxPool2d -> GroupNorm: the norm after the pool is each chain's region 1,
#: one problem for both.
STEM = "two_branches_pool_groupnorm"
#: Simulated nvcc per CUDA unit, and the budget: a first region's batch 0 takes a few tenths of a second.
UNIT_S = 0.1
BUDGET_S = 6.0
TRIALS = 2


def _model():
    module = import_file(MODELS / f"{STEM}.py")
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).eval()
    with torch.no_grad():  # off their identity: a region reading a copy, or the other branch's norm, shows
        for norm in (model.gn1, model.gn2):
            norm.weight.uniform_(0.5, 2.0)
            norm.bias.uniform_(-1.0, 1.0)
    return model, tuple(module.get_inputs())


def _assert_attached(opt, model) -> None:
    """Each chain runs its region 1 on its tuned kernels, through the optimized model's norm module (which
    holds the user's tensors) and the user's shift: the region's reference forward on what it is bound to
    computes the user's ops."""
    chains = list(fused_chains(opt))
    assert [c.name for c in chains] == ["Model_chain0", "Model_chain1"]
    for chain, name in zip(chains, ("gn1", "gn2")):
        norm = model.get_submodule(name)
        assert sorted(chain.later) == [1], chain.name
        region = chain.later[1]
        assert region is chain.kernel_model._later[1]
        assert not WORLDS[region.variant["producer"]["impl"]].runs_reference  # kernels won: they run
        assert region.group_norm_0 is opt.get_submodule(name)  # the very module, not a copy
        assert region.group_norm_0.weight is norm.weight and region.group_norm_0.bias is norm.bias
        assert region.shift is model.shift  # a buffer in the generated model's Parameter's place
        assert "later regions on kernels [1]" in repr(chain)
        y = torch.randn(2, 8, 6, 5)
        with torch.no_grad():
            assert torch.equal(type(region).__mro__[1].forward(region, y), norm(y) + model.shift)


def test_later_regions_are_tuned_after_every_first_region_within_the_budget_and_attached(tmp_path: Path) -> None:
    factory = FakeLazyFactory(FakeBuilder(UNIT_S))
    model, inputs = _model()
    twin = copy.deepcopy(model)
    start = time.monotonic()
    opt = optimize(model, inputs, budget_s=BUDGET_S, cache_dir=tmp_path, benchmarker=factory, machine=MACHINE,
                   trials=TRIALS)
    seconds = time.monotonic() - start
    # The first regions first; the later problem the two chains share, once.
    assert list(factory.evaluated) == ["Model_chain0", "Model_chain1", "Model_chain0_r1"]
    assert seconds < BUDGET_S + 3.0  # naming each winner and building the winners' modules come after
    _assert_attached(opt, model)
    fresh = torch.randn_like(inputs[0])
    with torch.no_grad():
        assert torch.equal(opt(fresh), twin(fresh))  # a CPU tensor: each chain's own ops
    for name, tensor in model.named_parameters():  # the regions' norms are the user's, not copies
        assert opt.get_parameter(name) is tensor

    warm = FakeLazyFactory(FakeBuilder(UNIT_S))  # everything cached: attached without a search
    _assert_attached(optimize(model, inputs, budget_s=BUDGET_S, cache_dir=tmp_path, benchmarker=warm,
                              machine=MACHINE, trials=TRIALS), model)
    assert warm.evaluated == {} and warm.builder.built == []

    bench = FakeBench()  # and fusetune search finds each region's winner (the same keys, timed in a graph)
    _, gm = _traced_copy(model, inputs)
    for found in _configs(gm, "Model", "graph"):
        for spec, shapes in expand(found.spec, [found.spec.shapes[0]]):
            result = tune_shape(spec, shapes[0], Cache(tmp_path), MACHINE, bench.factory, echo=lambda line: None)
            assert result.status == "cached", spec.name
    assert bench.prepared == 0

    opt.double()  # replaces the user's buffer by a new tensor: each kernel call binds the new one, regions too
    for chain in fused_chains(opt):
        chain._bind_tensors()
        assert chain.later[1].shift is model.shift and model.shift.dtype == torch.float64


def test_a_budget_the_first_regions_spend_leaves_the_later_regions_in_pytorch(tmp_path: Path, caplog) -> None:
    """The second chain's search spends what the first left of the budget: both chains run their first region's
    kernels, and their later region, not reached, runs in PyTorch inside them."""
    class Spending(FakeLazyFactory):
        def __call__(self, plan, shape, *, batches):
            if plan.spec.name == "Model_chain1":
                time.sleep(3.0)  # of a 4 s budget: the first chain took less than 3, the later region gets < 1
            return super().__call__(plan, shape, batches=batches)
    factory = Spending(FakeBuilder(0.0))
    model, inputs = _model()
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    opt = optimize(model, inputs, budget_s=4.0, cache_dir=tmp_path, benchmarker=factory, machine=MACHINE,
                   trials=TRIALS)
    assert list(factory.evaluated) == ["Model_chain0", "Model_chain1"]
    chains = list(fused_chains(opt))
    assert len(chains) == 2 and all(c.kernel_model is not None and c.later == {} for c in chains)
    assert any("Model_chain0_r1" in r.getMessage() and "budget is spent" in r.getMessage() for r in caplog.records)


def test_optimize_attaches_what_the_search_tuned_without_searching(tmp_path: Path) -> None:
    model, inputs = _model()
    _, gm = _traced_copy(model, inputs)
    for found in _configs(gm, "Model", "graph"):  # as `fusetune search` tunes an imported chain: its regions too
        for spec, shapes in expand(found.spec, [found.spec.shapes[0]]):
            bench = FakeBench(times=kernel_first_time)  # kernels win: there is a region to attach
            result = tune_shape(spec, shapes[0], Cache(tmp_path), MACHINE, bench.factory, trials=TRIALS,
                                echo=lambda line: None)
            assert result.status in ("tuned", "cached"), result.message

    def no_search(plan, shape):
        raise AssertionError(f"{plan.spec.name} searched again")
    opt = optimize(model, inputs, budget_s=BUDGET_S, cache_dir=tmp_path, benchmarker=no_search, machine=MACHINE)
    _assert_attached(opt, model)


def test_a_chain_whose_first_region_runs_no_kernels_gets_no_later_search(tmp_path: Path) -> None:
    """PyTorch's forward wins each first region: the chains keep the model's own ops, where no later region
    runs, so none is searched (the budget goes to nothing it cannot use)."""
    bench = FakeBench(times=lambda c: 0.5 if WORLDS[c.get("producer.impl", "cudnn")].runs_reference else fake_time(c))
    searched = []

    def factory(plan, shape):
        searched.append(plan.spec.name)
        return bench.factory(plan, shape)
    model, inputs = _model()
    opt = optimize(model, inputs, budget_s=BUDGET_S, cache_dir=tmp_path, trials=4, benchmarker=factory,
                   machine=MACHINE)
    assert searched == ["Model_chain0", "Model_chain1"]
    assert not list(fused_chains(opt))
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_later_regions_run_their_kernels(tmp_path: Path) -> None:
    """The real search, builds and kernels: every first region and every later region gets a kernel winner
    (PyTorch's forward left out), the chains run both, and the output is as close to float64 as eager's; a
    second optimize on the cache attaches them without searching."""
    from test_optimize import optimized_on_gpu

    model, inputs = _model()
    model = model.cuda()
    x = inputs[0].cuda()
    opt = optimized_on_gpu(model, (x,), tmp_path, budget_s=600)
    chains = list(fused_chains(opt))
    assert [sorted(c.later) for c in chains] == [[1], [1]]
    calls = []
    for chain in chains:
        chain.later[1].register_forward_hook(lambda module, args, out: calls.append(tuple(args[0].shape)))
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        want, got = model(x), opt(x)

    def error(y: torch.Tensor) -> float:
        return ((y.double() - exact).norm() / exact.norm()).item()
    print(f"\n{STEM}: error vs float64: eager {error(want):.2e}, optimized {error(got):.2e}")
    assert all(c.kernel_calls == 1 for c in chains) and calls == [(2, 8, 6, 5)] * 2  # each region's kernels ran
    assert error(got) <= max(8 * error(want), 1e-5)

    def no_search(plan, shape):
        raise AssertionError(f"{plan.spec.name} searched again")
    warm = optimize(model, (x,), cache_dir=tmp_path, benchmarker=no_search, machine=Machine.detect())
    assert [sorted(c.later) for c in fused_chains(warm)] == [[1], [1]]
    with torch.no_grad():
        assert torch.equal(warm(x), got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_optimizes_own_budgeted_search_reaches_the_later_regions(tmp_path: Path) -> None:
    """optimize's own search (batches built as they are timed, fusetune.lazy) on a later region, whose producer
    is a tensor: where a chain's first region runs kernels, its later region gets a winner within the budget;
    the model's output is as close to float64 as eager's."""
    model, inputs = _model()
    model = model.cuda()
    x = inputs[0].cuda()
    start = time.monotonic()
    opt = optimize(model, x, budget_s=240, cache_dir=tmp_path)
    seconds = time.monotonic() - start
    chains = list(fused_chains(opt))
    regions = [e for e in Cache(tmp_path).entries()
               if e.winner is not None and e.fields["problem"]["producer"]["kind"].startswith("tensor")]
    print(f"\n{STEM}: {len(chains)} chains on kernels, later regions attached {[sorted(c.later) for c in chains]}, "
          f"{len(regions)} later winners cached, in {seconds:.1f} s")
    assert seconds < 240 + 120
    if chains:  # a first region on kernels: its later region was searched after it
        assert len(regions) == 1  # one problem for both chains
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        want, got = model(x), opt(x)
    error = lambda y: ((y.double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert error(got) <= max(8 * error(want), 1e-5)
