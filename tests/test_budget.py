"""optimize under a time budget (fusetune.lazy): builds of just the candidates about to be timed, cheapest
first, in one pool for all chains; every distinct chain gets a winner within the budget even where the module
of every variant would not build in it. Builds cost simulated seconds (tests/fake_builds.py): no nvcc, no GPU."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from fusetune.cache import Cache
from fusetune.codegen import PER_VARIANT_UNITS, plan_space, render
from fusetune.lazy import Batches, BuildPool, _fits, cheapest, module_only
from fusetune.optimizer import _configs, _traced_copy, fused_chains, optimize
from fusetune.plan import make_plan
from fusetune.search import Machine, tune_shape
from fusetune.space import candidate_key
from fusetune.worlds import WORLDS

from conftest import REFERENCE_WORLDS, import_file
from fake_builds import FailingBuilder, FakeBuilder, FakeLazyFactory
from fake_handlers import MACHINE_FIELDS, FakeBench

MODELS = Path(__file__).resolve().parent / "models"
MACHINE = Machine(*MACHINE_FIELDS)
#: Seconds of simulated nvcc per CUDA unit: the module of every variant of a chain of resnet_blocks
#: (34 to 46 units) then costs over 3 s, the six distinct chains' over twice the budget; a batch's
#: (2 to 6 units) half a second at most.
UNIT_S = 0.1
BUDGET_S = 9.0
#: Trials per chain: each costs a few journal writes (fsync) whatever the benchmarker.
TRIALS = 2


def _resnet():
    module = import_file(MODELS / "resnet_blocks.py")
    torch.manual_seed(0)
    return module.Model().eval(), tuple(module.get_inputs())


def _found():
    model, inputs = _resnet()
    _, gm = _traced_copy(model, inputs)
    return _configs(gm, "Model", "graph")  # as optimize tunes them (its forward replays from a CUDA graph)


def _distinct(opt) -> set[str]:
    return {repr((c.state.spec.canonical(), sorted(c.state.spec.shapes))) for c in fused_chains(opt)}


def test_every_distinct_chain_gets_a_winner_within_the_budget(tmp_path: Path) -> None:
    builder = FakeBuilder(UNIT_S)
    factory = FakeLazyFactory(builder)
    model, inputs = _resnet()
    start = time.monotonic()
    opt = optimize(model, inputs, budget_s=BUDGET_S, cache_dir=tmp_path, benchmarker=factory, machine=MACHINE,
                   trials=TRIALS)
    seconds = time.monotonic() - start
    chains = list(fused_chains(opt))
    assert len(chains) == sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert all(c.kernel_model is not None for c in chains), [c.name for c in chains if c.kernel_model is None]
    assert len(factory.evaluated) == len(_distinct(opt)) < len(chains)  # repeated blocks are tuned once
    assert seconds < BUDGET_S + 3.0  # naming each winner and building the winners' modules come after
    full = {m.name: len(m.cuda_sources) for m in (render(make_plan(c.state.spec)) for c in chains)}
    assert sum(full.values()) * UNIT_S > 2 * BUDGET_S  # every variant of every chain would not build in it
    assert not {name for name, _ in builder.built} & {name for name, units in full.items() if units > 4}
    assert sum(units for _, units in builder.built) < sum(full.values()) / 2  # batches only
    assert builder.peak >= 2  # the chains' batches build at once
    with torch.no_grad():
        assert torch.allclose(opt(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)


def test_a_chain_whose_share_is_too_small_still_gets_its_cheapest_candidates(tmp_path: Path) -> None:
    """The first chain's share (the budget over six distinct chains) is shorter than its first build: batch 0
    (cuDNN's defaults, PyTorch's forward) is waited for anyway; its later batches and torch.compile's world are
    deferred (never recorded: a later run tries them)."""
    builder = FakeBuilder(1.5)  # batch 0: 3 s or more, two builds at a time
    factory = FakeLazyFactory(builder)
    model, inputs = _resnet()
    opt = optimize(model, inputs, budget_s=4.0, cache_dir=tmp_path, benchmarker=factory, machine=MACHINE,
                   trials=TRIALS)
    first = next(fused_chains(opt))
    assert first.kernel_model is not None
    found = _found()[0]
    plan = make_plan(found.spec)
    tried = factory.evaluated[found.spec.name]
    assert candidate_key(cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)) in tried
    assert any("producer.impl=eager" in key for key in tried)
    assert not any("producer.impl=inductor" in key for key in tried)
    from fusetune.cache import make_key
    from fusetune.search import key_fields

    entry = Cache(tmp_path).load(make_key(key_fields(found.spec, found.spec.shapes[0], MACHINE,
                                                     render(plan).source_hash)))
    assert not any(o["candidate"]["producer.impl"] == "inductor" for o in entry.outcomes.values())


def test_a_winner_found_under_a_budget_is_found_again_by_the_search(tmp_path: Path) -> None:
    model, inputs = _resnet()
    optimize(model, inputs, budget_s=BUDGET_S, cache_dir=tmp_path, benchmarker=FakeLazyFactory(FakeBuilder(0.0)),
             machine=MACHINE, trials=TRIALS)
    bench = FakeBench()
    for found in _found():
        result = tune_shape(found.spec, found.spec.shapes[0], Cache(tmp_path), MACHINE, bench.factory,
                            echo=lambda line: None)
        assert result.status == "cached", found.spec.name
    assert bench.prepared == 0


def test_batches_run_the_cheapest_first_and_every_candidate_fits_its_module() -> None:
    found = max(_found(), key=lambda f: len(make_plan(f.spec).impl_stages))
    plan = make_plan(found.spec)
    space = plan_space(plan)
    first = cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)
    assert first["producer.impl"] == "cudnn"
    only = module_only(plan, [first])
    assert all(not only[stage] for stage in PER_VARIANT_UNITS if stage in only)  # cuDNN runs none of them
    queued = list(space.all())[:60] + space.producer_starts()
    pool = BuildPool(FakeBuilder(0.0))
    try:
        batches = Batches(plan, pool, deadline=time.monotonic() + 60, first=first)
        order = batches.schedule(queued)
        assert {candidate_key(c) for c in order} == {candidate_key(c) for c in queued}
        worlds = [c["producer.impl"] for c in order]
        assert worlds[0] in ("cudnn", "eager") and worlds[-1] == "inductor"
        assert [batches.where[candidate_key(c)] for c in order if WORLDS[c["producer.impl"]].warmup_s == 0] == \
            sorted(batches.where[candidate_key(c)] for c in order if WORLDS[c["producer.impl"]].warmup_s == 0)
        for candidate in order:
            index = batches.where[candidate_key(candidate)]
            assert _fits(batches.modules[index][0], plan, space, candidate)
            if candidate["producer.impl"] in ("eager", "cudnn") and candidate_key(candidate) == candidate_key(first):
                assert index == 0
        assert batches.where[candidate_key(next(c for c in queued if c["producer.impl"] == "eager"))] == 0
        assert all(len(m.cuda_sources) < len(render(plan).cuda_sources) for _, m in batches.modules)
    finally:
        pool.close()


def test_a_module_not_built_by_the_deadline_defers_its_candidate_but_never_batch_0() -> None:
    from fusetune.search import Deferred

    found = max(_found(), key=lambda f: len(make_plan(f.spec).impl_stages))
    plan = make_plan(found.spec)
    space = plan_space(plan)
    first = cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)
    pool = BuildPool(FakeBuilder(0.2), jobs=1)
    try:
        batches = Batches(plan, pool, deadline=time.monotonic() + 0.05, first=first)
        other = next(c for c in space.all() if c["producer.impl"] not in ("cudnn", *REFERENCE_WORLDS)
                     and not _fits(batches.modules[0][0], plan, space, c))
        batches.schedule([first, other])
        assert batches.module_for(first).ok  # batch 0: waited for past the deadline
        with pytest.raises(Deferred):
            batches.module_for(other)
        assert batches.module_for(other, final=True).ok  # naming the winner waits
    finally:
        pool.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_every_distinct_chain_of_resnet18_gets_a_winner_within_the_budget(tmp_path: Path) -> None:
    """The real builds and timings: resnet18 at batch 32, 224x224 (its 20 chains, fewer distinct), under
    FUSETUNE_TEST_BUDGET_S (default 300 s): a winner for every distinct chain, cached, within the budget
    (and what naming the last winner and building the winners' modules add)."""
    import json
    import os

    models = pytest.importorskip("torchvision.models", reason="torchvision is not installed")
    budget = float(os.environ.get("FUSETUNE_TEST_BUDGET_S", "300"))
    torch.manual_seed(0)
    model = models.resnet18(weights=None).cuda().eval()
    x = torch.randn(32, 3, 224, 224, device="cuda")
    start = time.monotonic()
    opt = optimize(model, x, budget_s=budget, cache_dir=tmp_path)
    seconds = time.monotonic() - start
    _, gm = _traced_copy(model, (x,))
    found = _configs(gm, "ResNet")
    distinct = {json.dumps([f.spec.canonical(), list(f.spec.shapes[0])], default=list) for f in found}
    won = [e for e in Cache(tmp_path).entries() if e.winner is not None]
    tuned = [c for c in fused_chains(opt) if c.kernel_model is not None]
    print(f"\nresnet18: {len(found)} chains, {len(distinct)} distinct, {len(won)} winners, {len(tuned)} fused, "
          f"in {seconds:.1f} s of a {budget:.0f} s budget")
    assert len(won) == len(distinct)
    assert seconds < budget + 120


def test_a_batch_that_fails_to_build_costs_only_the_candidate_that_does_not_compile() -> None:
    found = max(_found(), key=lambda f: len(make_plan(f.spec).impl_stages))
    plan = make_plan(found.spec)
    space = plan_space(plan)
    world = next(w for w in plan.impl_stages if w not in ("cudnn", *REFERENCE_WORLDS))
    first = cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)
    ours = [c for c in space.all() if c["producer.impl"] == world]
    family = next(f for f in space.active(ours[0]) if f.family in PER_VARIANT_UNITS)
    good = ours[0]
    bad = next(c for c in ours if {p.name: c[f"{family.family}.{p.name}"] for p in family.compile_params}
               != {p.name: good[f"{family.family}.{p.name}"] for p in family.compile_params})
    bad_variant = repr({p.name: bad[f"{family.family}.{p.name}"] for p in family.compile_params})
    builder = FailingBuilder(lambda module: bad_variant in module.files["model.py"].split("VARIANTS = ")[1]
                             .split("\n")[0])
    pool = BuildPool(builder)
    try:
        batches = Batches(plan, pool, deadline=time.monotonic() + 60, first=first)
        batches.schedule([first, good, bad])
        assert batches.where[candidate_key(good)] == batches.where[candidate_key(bad)]  # one batch
        assert not batches.module_for(bad).ok
        assert batches.module_for(good).ok  # a module of its own
        assert batches.module_for(first).ok
    finally:
        pool.close()


def test_a_build_one_chain_dropped_is_built_again_for_another_chain_of_the_same_problem() -> None:
    """Two chains of one problem at two shapes share their modules (the sources do not depend on the shape):
    the first chain, done, drops its builds not started; the second still gets them. A builder that raises
    is a failed build, not a failed search."""
    found = max(_found(), key=lambda f: len(make_plan(f.spec).impl_stages))
    plan = make_plan(found.spec)
    first = cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)
    queued = plan_space(plan).producer_starts()
    pool = BuildPool(FakeBuilder(0.3), jobs=1)
    try:
        one, two = (Batches(plan, pool, deadline=time.monotonic() + 60, first=first) for _ in range(2))
        one.schedule(queued)
        two.schedule(queued)
        later = next(c for c in queued if two.where[candidate_key(c)] > 0)
        one.cancel_pending()  # batch 0 is running: the later batches have not started
        assert two.module_for(later, final=True).ok
    finally:
        pool.close()

    def broken(module):
        raise OSError("no space left on device")
    pool = BuildPool(broken)
    try:
        result = Batches(plan, pool, deadline=time.monotonic() + 60, first=first).module_for(first)
        assert not result.ok and "OSError" in result.log
    finally:
        pool.close()


def test_the_gpu_benchmarker_under_a_budget_runs_each_candidate_in_its_batchs_module(tmp_path: Path) -> None:
    """optimize's own factory (runner.LazyGpuBenchmarker) with a fake worker and builder: every job runs in the
    module of the candidate's batch (which holds the candidate's variants), no module of every variant is
    built, and every distinct chain gets a winner."""
    from fusetune.optimizer import _GpuFactory

    from fake_builds import FakeWorker

    builder = FakeBuilder(0.01)

    class Factory(_GpuFactory):
        def builder(self, module):
            module.write(self.cache.module_dir(module.name))  # as fusetune.build.build does
            return builder(module)

    factory = Factory(Cache(tmp_path), MACHINE)
    factory.worker = FakeWorker()
    model, inputs = _resnet()
    opt = optimize(model, inputs, budget_s=60, cache_dir=tmp_path, benchmarker=factory, machine=MACHINE, trials=4)
    assert all(c.kernel_model is not None for c in fused_chains(opt))
    built = {name for name, _ in builder.built}
    runs = [(kind, module, variant) for kind, module, variant in factory.worker.jobs if kind != "open"]
    assert {kind for kind, _, _ in runs} == {"evaluate", "confirm", "eager"}
    assert all(module in built for _, module, _ in runs)
    fulls = {render(make_plan(f.spec)).name for f in _found()}
    assert not built & fulls
    assert len({module for kind, module, _ in runs if kind == "evaluate"}) > len(fulls)  # several batches a chain
    for kind, module, variant in runs:
        if variant is not None:  # the module's model.py compiled the candidate's variant of every stage it runs
            text = (Cache(tmp_path).module_dir(module) / "model.py").read_text()
            compiled = eval(text.split("VARIANTS = ")[1].split("\n")[0])  # noqa: S307 - our own rendering
            for stage, values in compiled.items():
                if values:
                    assert {k: variant[stage][k] for k in values[0]} in values


# --------------------------------------------------------------------------------------------------
# fusetune search: the same batches (runner.SearchFactory), the whole shape under --budget-s

#: A chain with three worlds of kernels besides cuDNN's, eager's and inductor's (refused without triton),
#: whose module of every variant is 35 units.
SEARCHED = Path(__file__).resolve().parent / "chains" / "conv2d_hardswish_relu.yaml"


def _search(tmp_path: Path, monkeypatch, builder: FakeBuilder, worker, **kwargs):
    """One ``fusetune search`` of SEARCHED's first shape through the command's own factory, with ``builder``'s
    builds and ``worker``'s jobs: (result, seconds, the plan)."""
    from fusetune import runner
    from fusetune.config import load_config

    from fake_builds import fake_build

    monkeypatch.setattr(runner, "build", fake_build(builder))
    spec = load_config(str(SEARCHED))
    cache = Cache(tmp_path)
    start = time.monotonic()
    with runner.SearchFactory(cache, MACHINE, worker, echo=lambda line: None) as make:
        result = tune_shape(spec, spec.shapes[0], cache, MACHINE, make, echo=lambda line: None, **kwargs)
    return result, time.monotonic() - start, make_plan(spec), start


def _outcomes(tmp_path: Path, result) -> dict:
    return Cache(tmp_path).load(result.key).outcomes


def test_search_builds_in_batches_and_times_the_first_before_the_builds_end(tmp_path: Path, monkeypatch) -> None:
    from fake_builds import FakeWorker

    builder, worker = FakeBuilder(0.05), FakeWorker()
    result, _, plan, _ = _search(tmp_path, monkeypatch, builder, worker, trials=8)
    assert result.status == "tuned"
    full = render(plan)
    built = {name for name, _ in builder.built}
    assert full.name not in built and len(built) >= 3  # batches, never the module of every variant
    assert sum(units for _, units in builder.built) < len(full.cuda_sources)
    first = worker.at[next(i for i, (kind, _, _) in enumerate(worker.jobs) if kind == "evaluate")]
    assert first < max(builder.finished_at)  # trials began while later batches were building
    evaluated = {module for kind, module, _ in worker.jobs if kind == "evaluate"}
    assert evaluated <= built and len(evaluated) >= 3


def test_search_stops_at_its_budget_with_the_best_so_far(tmp_path: Path, monkeypatch) -> None:
    """Builds far slower than the budget: batch 0 (cuDNN's defaults, PyTorch's forward) is timed, the rest is
    deferred (no outcome recorded: a later search tries it) and the search ends at the budget with a winner."""
    from fake_builds import FakeWorker

    budget = 3.0
    builder, worker = FakeBuilder(0.3), FakeWorker()
    result, seconds, plan, _ = _search(tmp_path, monkeypatch, builder, worker, trials=16, budget_s=budget)
    assert result.status == "tuned" and result.candidate is not None
    assert seconds < budget + 1.0
    outcomes = _outcomes(tmp_path, result)
    assert 0 < len([o for o in outcomes.values() if o["status"] == "ok"]) < 16
    assert not any(o["status"] == "compile_error" for o in outcomes.values())  # deferred, not failed
    assert {o["candidate"]["producer.impl"] for o in outcomes.values()} >= {"cudnn", "eager"}


def test_search_in_batches_explores_what_the_module_of_every_variant_did(tmp_path: Path, monkeypatch) -> None:
    """With builds that cost nothing and a full budget, the search in batches tries the same candidates as
    the search in one module of every variant (runner.GpuBenchmarker) and names the same winner."""
    from fusetune import runner
    from fusetune.config import load_config

    from fake_builds import FakeWorker, fake_build

    result, _, _, _ = _search(tmp_path / "batches", monkeypatch, FakeBuilder(0.0), FakeWorker(), trials=12)
    whole_builder, worker = FakeBuilder(0.0), FakeWorker()
    monkeypatch.setattr(runner, "build", fake_build(whole_builder))
    spec = load_config(str(SEARCHED))
    cache = Cache(tmp_path / "whole")

    def make(plan, shape):
        return runner.GpuBenchmarker(plan, shape, cache, MACHINE, worker, echo=lambda line: None)
    whole = tune_shape(spec, spec.shapes[0], cache, MACHINE, make, trials=12, echo=lambda line: None)
    assert [name for name, _ in whole_builder.built] == [render(make_plan(spec)).name]
    assert set(_outcomes(tmp_path / "batches", result)) == set(_outcomes(tmp_path / "whole", whole))
    assert result.candidate == whole.candidate and result.time_ms == whole.time_ms


def test_the_worker_keeps_one_reference_for_every_batch_of_a_problem(monkeypatch) -> None:
    """evaluate._session: a job in another module of the same problem at the same shape rebinds the session
    (its float64 reference and inputs kept, as one module of every variant kept them); another problem or
    shape, or a job that names no problem, opens a new session."""
    from fusetune import evaluate

    opened: list[tuple[str, str | None]] = []

    class Fake:
        def __init__(self, module_dir, build_dir, shape, seed, arch=None, problem=None, input_shapes=()):
            opened.append((module_dir, problem))
            self.module_dir, self.shape, self.problem = module_dir, shape, problem

        def rebound(self, module_dir, build_dir, arch):
            again = Fake.__new__(Fake)
            again.module_dir, again.shape, again.problem = module_dir, self.shape, self.problem
            return again

    monkeypatch.setattr(evaluate, "Session", Fake)
    monkeypatch.setattr(evaluate, "_sessions", {})

    def job(module: str, problem: str | None, shape=(2, 3)) -> dict:
        return {"module_dir": module, "build_dir": module, "shape": list(shape), "problem": problem}
    first = evaluate._session(job("a", "p"))
    assert evaluate._session(job("b", "p")).module_dir == "b" and opened == [("a", "p")]  # rebound
    assert evaluate._session(job("a", "p")) is not first  # the current session was b's: rebound again
    evaluate._session(job("c", "q"))
    evaluate._session(job("d", "q", shape=(4, 3)))
    evaluate._session(job("e", None))
    evaluate._session(job("f", None))
    assert opened == [("a", "p"), ("c", "q"), ("d", "q"), ("e", None), ("f", None)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_cold_search_of_a_corpus_chain_keeps_its_budget(tmp_path: Path, worker) -> None:
    """Issue 22's number, in one chain: a cold search (an empty cache: every module built) under --budget-s
    (FUSETUNE_TEST_BUDGET_S, default 60 s) ends within it, naming the winner after, with kernels timed
    beside cuDNN's and PyTorch's own. scripts/cold-search measures several chains without a budget."""
    import os

    from fusetune.config import load_config
    from fusetune.runner import SearchFactory

    budget = float(os.environ.get("FUSETUNE_TEST_BUDGET_S", "60"))
    spec = load_config(str(SEARCHED))
    machine = Machine.detect()
    cache = Cache(tmp_path)
    start = time.monotonic()
    with SearchFactory(cache, machine, worker, echo=lambda line: None) as make:
        result = tune_shape(spec, spec.shapes[0], cache, machine, make, budget_s=budget, echo=lambda line: None)
    seconds = time.monotonic() - start
    outcomes = Cache(tmp_path).load(result.key).outcomes.values()
    worlds = {o["candidate"]["producer.impl"] for o in outcomes if o["status"] == "ok"}
    print(f"\n{spec.name}: cold search {seconds:.1f} s under a {budget:.0f} s budget; {len(outcomes)} outcomes, "
          f"worlds timed {sorted(worlds)}, winner {result.candidate and result.candidate['producer.impl']} "
          f"{result.time_ms} ms; {result.timings}")
    assert result.status == "tuned"
    assert seconds < budget + 30  # naming the winner (re-timing the best three, a confirmation) comes after
    assert {"cudnn", "eager"} <= worlds and worlds & {"direct", "gemm"}


def test_batches_build_a_world_s_rest_in_one_module_ahead_of_the_sampler_and_only_when_asked() -> None:
    found = max(_found(), key=lambda f: len(make_plan(f.spec).impl_stages))
    plan = make_plan(found.spec)
    space = plan_space(plan)
    first = cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)
    world = next(w for w in plan.impl_stages if w not in ("cudnn", "eager") and not WORLDS[w].runs_reference)
    rest = [c for c in space.all() if c["producer.impl"] == world][:200]
    pool = BuildPool(FakeBuilder(0.0))
    try:
        assert Batches(plan, pool, deadline=time.monotonic() + 60, first=first).expect(rest) == 0  # not asked
        late = Batches(plan, pool, deadline=time.monotonic() - 1, first=first, ahead=True)
        assert late.expect(rest) == 0 and len(late.modules) == 1  # past its deadline
        batches = Batches(plan, pool, deadline=time.monotonic() + 60, first=first, ahead=True)
        assert batches.expect(rest) == 1 and len(batches.modules) == 2  # one module for the world
        assert all(_fits(batches.modules[1][0], plan, space, c) for c in rest)
        assert all(batches.module_for(c).ok for c in rest[:5]) and len(batches.modules) == 2  # nothing more built
    finally:
        pool.close()


def test_a_world_s_module_that_fails_to_build_costs_only_the_candidate_that_does_not_compile() -> None:
    """The module expect built for a world fails (one of its variants does not compile): each candidate asked
    for then gets a module of its own, as a failed batch's do."""
    found = max(_found(), key=lambda f: len(make_plan(f.spec).impl_stages))
    plan = make_plan(found.spec)
    space = plan_space(plan)
    first = cheapest(found.spec, plan, found.spec.shapes[0], MACHINE.capability)
    world = next(w for w in plan.impl_stages if w not in ("cudnn", "eager") and not WORLDS[w].runs_reference)
    rest = [c for c in space.all() if c["producer.impl"] == world][:200]
    whole = len(render(plan, module_only(plan, rest)).cuda_sources)
    assert len(render(plan, module_only(plan, rest[:1])).cuda_sources) < whole
    pool = BuildPool(FailingBuilder(lambda module: len(module.cuda_sources) >= whole))
    try:
        batches = Batches(plan, pool, deadline=time.monotonic() + 60, first=first, ahead=True)
        assert batches.expect(rest) == 1
        assert batches.module_for(rest[0]).ok and len(batches.modules) == 3
    finally:
        pool.close()
