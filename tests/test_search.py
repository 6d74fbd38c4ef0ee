"""The search with a fake benchmarker: winners, caching, resume, failures, infeasible candidates, concurrency."""
from __future__ import annotations

import collections

import json
import math
import multiprocessing
import warnings
from pathlib import Path

import pytest

from fusetune.cache import STATUSES, Cache, CacheWarning, make_key
from fusetune.codegen import plan_facts, plan_space, render
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.search import RETIME_ROUNDS, RETIME_TOP, Machine, _nearest, key_fields, shape_facts, tune_shape
from fusetune.space import candidate_key
from fusetune.tiles import cluster_boxes

from conftest import REFERENCE_WORLDS, SEEDS, run_processes
from fake_handlers import MACHINE_FIELDS, FakeBench, fake_time, tune_in_process

MACHINE = Machine("FakeGPU", "9.0", "13.0", "2.13")
FAILURES = ("compile_error", "launch_error", "crash", "timeout", "wrong_result")


def quiet(line: str) -> None:
    pass


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


def _feasible(spec, shape):
    plan = make_plan(spec)
    space = plan_space(plan)
    facts = shape_facts(spec, plan, shape, MACHINE.capability)
    return [c for c in space.all() if not space.violations(c, facts)], space


def _best_ok(entry):
    oks = {k: o for k, o in entry.outcomes.items() if o["status"] == "ok"}
    return min(oks, key=lambda k: oks[k]["time_ms"])


# -- a small space is searched exhaustively --------------------------------------------------
# The budget is the number of feasible candidates at this shape, computed from the declared
# space (not hard-coded): the smallest budget for which the search must try all of them.

SMALL = (SEEDS["maxpool_gap"], (3, 3, 7, 11, 13))


def _small():
    """The SMALL problem, its feasible candidates, its space, and a budget that covers them exactly."""
    spec = load_config(SMALL[0])
    feasible, space = _feasible(spec, SMALL[1])
    return spec, feasible, space, len(feasible)


def test_small_space_is_searched_exhaustively_and_the_fastest_wins(cache):
    spec, feasible, space, trials = _small()
    # the shape rules some candidates out (plane_reduce: too many blocks per plane): they must never run
    assert 0 < len(feasible) < space.size()
    bench = FakeBench()
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    assert result.status == "tuned"
    evaluated = bench.search_evaluations()
    assert sorted(evaluated) == sorted(candidate_key(c) for c in feasible)  # each once, nothing else
    fastest = min(feasible, key=fake_time)
    assert result.candidate == fastest
    assert result.time_ms == pytest.approx(fake_time(fastest))
    assert result.eager_ms == bench.eager and result.speedup == pytest.approx(bench.eager / fake_time(fastest))
    assert result.counts == {"ok": len(feasible)}  # nothing infeasible recorded either
    entry = cache.load(result.key)
    assert entry.winner["candidate"] == fastest
    assert entry.winner["variant"] == space.stage_values(fastest)
    assert entry.winner["module"] == render(make_plan(spec)).name
    assert _best_ok(entry) == candidate_key(fastest)
    assert entry.fields["problem_name"] == spec.name and entry.fields["gpu"] == "FakeGPU"
    for ckey, outcome in entry.outcomes.items():
        assert outcome["status"] == "ok" and candidate_key(outcome["candidate"]) == ckey
    # the winner was confirmed on fresh inputs, and only the winner
    assert [k for _, kind, k in bench.calls if kind == "confirm"] == [candidate_key(fastest)]


def test_second_call_is_cached_and_runs_nothing(cache):
    spec, _, _, trials = _small()
    first = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=trials, echo=quiet)
    again = FakeBench()
    second = tune_shape(spec, SMALL[1], cache, MACHINE, again.factory, trials=trials, echo=quiet)
    assert second.status == "cached"
    assert again.made == 0 and again.calls == []  # no benchmarker at all, let alone a build
    assert (second.key, second.candidate, second.time_ms) == (first.key, first.candidate, first.time_ms)
    assert second.counts == first.counts


def test_cached_winner_depends_on_the_machine(cache):
    spec, feasible, _, trials = _small()
    tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=trials, echo=quiet)
    other = FakeBench()
    result = tune_shape(spec, SMALL[1], cache, Machine("OtherGPU", "8.0", "13.0", "2.13"), other.factory,
                        trials=trials, echo=quiet)
    assert result.status == "tuned"
    assert sorted(other.search_evaluations()) == sorted(candidate_key(c) for c in feasible)  # all of it, again


@pytest.mark.parametrize("status", FAILURES)
def test_every_failure_status_is_recorded_and_never_wins(cache, status):
    spec, feasible, _, trials = _small()
    by_speed = sorted(feasible, key=fake_time)
    failing = {candidate_key(c): status for c in by_speed[:3]}  # the three fastest fail
    bench = FakeBench(failures=failing)
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    assert result.status == "tuned"
    assert result.candidate == by_speed[3]
    assert result.counts == {"ok": len(feasible) - 3, status: 3}
    entry = cache.load(result.key)
    for ckey in failing:
        assert entry.outcomes[ckey]["status"] == status
        assert entry.outcomes[ckey]["log"] == f"fake {status} of {ckey}"
        assert "time_ms" not in entry.outcomes[ckey]
    assert candidate_key(entry.winner["candidate"]) not in failing
    # failures are not re-timed or confirmed in the final round
    final = [k for phase, _, k in bench.calls if phase == "final"]
    assert not set(final) & set(failing)


def test_all_failure_statuses_together(cache):
    spec, feasible, _, trials = _small()
    by_speed = sorted(feasible, key=fake_time)
    failing = {candidate_key(c): s for c, s in zip(by_speed, FAILURES)}
    result = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench(failures=failing).factory, trials=trials,
                        echo=quiet)
    assert result.candidate == by_speed[len(FAILURES)]
    entry = cache.load(result.key)
    assert {k: o["status"] for k, o in entry.outcomes.items() if o["status"] != "ok"} == failing
    assert set(FAILURES) | {"ok", "infeasible"} == set(STATUSES)


def test_nothing_ok_means_failed_and_no_winner(cache):
    spec, feasible, _, trials = _small()
    bench = FakeBench(failures={candidate_key(c): "wrong_result" for c in feasible})
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    assert result.status == "failed" and result.candidate is None and result.time_ms is None
    assert result.message == "no candidate passed verification"
    assert result.counts == {"wrong_result": len(feasible)}
    assert cache.load(result.key).winner is None
    assert [kind for _, kind, _ in bench.calls if kind == "confirm"] == []


def test_candidate_failing_confirm_is_not_the_winner(cache):
    spec, feasible, _, trials = _small()
    by_speed = sorted(feasible, key=fake_time)
    bad = candidate_key(by_speed[0])
    bench = FakeBench(confirm_failures={bad})
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    assert result.status == "tuned"
    assert result.candidate == by_speed[1]
    entry = cache.load(result.key)
    assert entry.winner["candidate"] == by_speed[1]
    assert entry.outcomes[bad]["status"] == "wrong_result"  # the confirm failure is recorded
    confirms = [k for _, kind, k in bench.calls if kind == "confirm"]
    assert confirms == [bad, candidate_key(by_speed[1])]


@pytest.mark.parametrize("other_is_faster", [True, False])
def test_a_winner_named_meanwhile_by_another_search(cache, other_is_faster):
    """Another search of the same key names its winner while this one confirms: the faster one stays."""
    spec, feasible, space, trials = _small()
    fastest = min(feasible, key=fake_time)
    theirs = {"candidate": {"theirs": 1}, "variant": {}, "module": "m",
              "time_ms": fake_time(fastest) * (0.5 if other_is_faster else 2.0)}
    box = {}

    def other_search_finishes(candidate):
        def put(entry):
            entry.winner = theirs
        cache.update(box["key"], {}, put)

    bench = FakeBench(on_confirm=other_search_finishes)
    original = bench.factory

    def factory(plan, shape):
        box["key"] = make_key(key_fields(spec, shape, MACHINE, render(plan).source_hash))
        return original(plan, shape)
    result = tune_shape(spec, SMALL[1], cache, MACHINE, factory, trials=trials, echo=quiet)
    entry = cache.load(result.key)
    assert result.key == box["key"]
    if other_is_faster:
        assert entry.winner == theirs
        assert result.candidate == {"theirs": 1} and result.time_ms == theirs["time_ms"]
    else:
        assert entry.winner["candidate"] == fastest and result.candidate == fastest


def test_every_confirm_failing_means_failed(cache):
    spec, feasible, _, trials = _small()
    bench = FakeBench(confirm_failures={candidate_key(c) for c in feasible})
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    assert result.status == "failed"
    assert cache.load(result.key).winner is None
    # only the re-timed best few were tried, and eager (the floor, always re-timed)
    confirmed = [key for _, kind, key in bench.calls if kind == "confirm"]
    best = sorted(feasible, key=fake_time)[:RETIME_TOP]
    eager = [candidate_key(c) for c in feasible if c["producer.impl"] == "eager" and c not in best]
    assert sorted(confirmed) == sorted([candidate_key(c) for c in best] + eager)


def test_force_reruns_known_outcomes(cache):
    spec, feasible, _, trials = _small()
    tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=trials, echo=quiet)
    # now everything is twice as slow and the old winner is broken
    old_best = candidate_key(min(feasible, key=fake_time))
    bench = FakeBench(times=lambda c: 2 * fake_time(c), failures={old_best: "crash"})
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, force=True, echo=quiet)
    assert result.status == "tuned"
    assert bench.made == 1
    assert sorted(bench.search_evaluations()) == sorted(candidate_key(c) for c in feasible)
    entry = cache.load(result.key)
    assert entry.outcomes[old_best]["status"] == "crash"
    for c in feasible:
        if candidate_key(c) != old_best:
            assert entry.outcomes[candidate_key(c)]["time_ms"] == pytest.approx(2 * fake_time(c))


def test_force_replaces_a_stale_winner(cache):
    spec, feasible, _, trials = _small()
    first = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=trials, echo=quiet)
    old_best = candidate_key(first.candidate)
    bench = FakeBench(times=lambda c: 2 * fake_time(c), failures={old_best: "crash"})
    result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=trials, force=True, echo=quiet)
    entry = cache.load(result.key)
    assert entry.outcomes[old_best]["status"] == "crash"
    assert candidate_key(entry.winner["candidate"]) != old_best  # never a winner whose latest outcome failed
    assert candidate_key(result.candidate) == _best_ok(entry)


# -- a large space: optuna samples, the budget counts ---------------------------------------

LARGE = (SEEDS["groupnorm"], (128, 8, 128, 128))


def test_large_space_spends_exactly_the_budget(cache):
    spec = load_config(LARGE[0])
    bench = FakeBench()
    result = tune_shape(spec, LARGE[1], cache, MACHINE, bench.factory, trials=10, echo=quiet)
    evaluated = bench.search_evaluations()
    assert len(evaluated) == len(set(evaluated)) == 10
    feasible, space = _feasible(spec, LARGE[1])
    assert len(feasible) > 10  # so the budget, not the space, is what stopped the search
    assert evaluated[0] == candidate_key(space.default())  # the declared default goes first ...
    # ... then one start per other world: the direct kernels' default, or (its two windows a thread
    # being more inputs than this convolution's fit in registers) the feasible direct candidate
    # nearest to it, and the
    # tensor-core kernels' default in each of their worlds, and eager PyTorch (the floor a winner must
    # beat) and torch.compile's code for it in its default mode and in max-autotune; then cuDNN's other layout.
    # A budget of 8 reaches every world.
    entry = cache.load(result.key)
    by_key = {k: o["candidate"] for k, o in entry.outcomes.items()}
    first = [by_key[k] for k in evaluated[:9]]
    assert [(c["producer.impl"], c["producer.layout"]) for c in first] == [
        ("cudnn", "contiguous"), ("direct", "contiguous"), ("gemm", "contiguous"), ("gemm_extrema", "contiguous"),
        ("gemm_store", "contiguous"), ("eager", "contiguous"), ("inductor_default", "contiguous"),
        ("inductor", "contiguous"), ("cudnn", "channels_last")]
    for i, impl in ((2, "gemm"), (3, "gemm_extrema"), (4, "gemm_store"), (5, "eager"), (6, "inductor_default"),
                    (7, "inductor")):
        assert first[i] == space.canonical({**space.default(), "producer.impl": impl})
    assert first[8] == space.canonical({**space.default(), "producer.layout": "channels_last"})
    direct_default = space.canonical({**space.default(), "producer.impl": "direct"})
    assert space.violations(direct_default, shape_facts(spec, make_plan(spec), LARGE[1], MACHINE.capability))
    assert {k for k in first[1] if first[1][k] != direct_default[k]} == {"direct_main.cells"}
    assert {k for k, o in entry.outcomes.items() if o["status"] != "infeasible"} == set(evaluated)
    assert candidate_key(result.candidate) == _best_ok(entry)


def test_a_competitive_world_is_explored_beyond_its_start(cache):
    """After the starts, each world whose best is within COMPETITIVE times the best of all gets
    neighbours of its best (one choice changed), the fastest world's first, before the sampler: a
    world whose default came second but whose neighbour is the fastest of all is not left to chance.
    A world further off gets none."""
    from fusetune.search import COMPETITIVE, NEIGHBOURS_PER_WORLD

    spec = load_config(LARGE[0])
    feasible, space = _feasible(spec, LARGE[1])
    gemm = _nearest(space.canonical({**space.default(), "producer.impl": "gemm"}), feasible)

    def changed(a, b) -> int:
        return sum(a[k] != b[k] for k in a)

    def times(c):  # cuDNN's world best at about 1 ms; gemm's default 1.3, its neighbours 0.5; the rest 3+
        jitter = fake_time(c) / 100
        if c["producer.impl"] == "gemm":
            return 0.5 + jitter if changed(c, gemm) == 1 else 1.3 + jitter
        return (1.0 if c["producer.impl"] == "cudnn" else 3.0) + jitter
    assert 3.0 > COMPETITIVE * 1.02 and 1.3 < COMPETITIVE * 1.0
    bench = FakeBench(times=times)
    trials = 24
    result = tune_shape(spec, LARGE[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    evaluated = bench.search_evaluations()
    assert len(evaluated) == trials
    by_key = {k: o["candidate"] for k, o in cache.load(result.key).outcomes.items()}
    nearest = (_nearest(start, feasible) for start in space.producer_starts())
    starts = len({candidate_key(c) for c in nearest if c is not None})  # the worlds this shape can run
    phase = [by_key[k] for k in evaluated[starts:starts + 2 * NEIGHBOURS_PER_WORLD]]
    assert (trials - starts) // 3 >= 2 * NEIGHBOURS_PER_WORLD  # room for both competitive worlds
    # cuDNN's (the fastest world), then gemm's (its start, 1.3 ms, within the factor); no other world's
    assert [c["producer.impl"] for c in phase] == ["cudnn"] * NEIGHBOURS_PER_WORLD + ["gemm"] * NEIGHBOURS_PER_WORLD
    assert all(changed(c, gemm) == 1 for c in phase[NEIGHBOURS_PER_WORLD:])
    assert result.candidate["producer.impl"] == "gemm" and result.time_ms < 0.52


def test_the_last_trials_climb_from_the_best_candidate(cache):
    """The polish (the last POLISH_SHARE of the budget) tries untried one-change neighbours of the fastest
    candidate so far, re-centred on each that beats it: each of its trials is a neighbour of the best before it
    (the sampler's suggestions seldom are). Each stage's time adds to the forward's, so a choice of one stage
    alone can make the winner: here, one of cuDNN's default start's neighbours is faster still."""
    from fusetune.search import POLISH_SHARE

    spec = load_config(LARGE[0])
    feasible, space = _feasible(spec, LARGE[1])
    start = space.canonical(space.default())

    def changed(a, b) -> int:
        return sum(a.get(k) != v for k, v in b.items())
    better = sorted((c for c in feasible if changed(c, start) == 1 and c["producer.impl"] == start["producer.impl"]
                     and c["producer.layout"] == start["producer.layout"]), key=candidate_key)[-1]

    def times(c):
        special = {candidate_key(start): 1.0, candidate_key(better): 0.7}
        return special.get(candidate_key(c), 3.0 + fake_time(c) / 100)
    trials = 24
    bench = FakeBench(times=times)
    result = tune_shape(spec, LARGE[1], cache, MACHINE, bench.factory, trials=trials, echo=quiet)
    evaluated = bench.search_evaluations()
    assert len(evaluated) == trials
    by_key = {k: o for k, o in cache.load(result.key).outcomes.items()}
    polish = int(POLISH_SHARE * trials)
    assert polish >= 4
    for n in range(trials - polish, trials):
        before = [by_key[k] for k in evaluated[:n] if by_key[k]["status"] == "ok"]
        best = min(before, key=lambda o: o["time_ms"])["candidate"]
        assert changed(by_key[evaluated[n]]["candidate"], best) == 1, f"trial {n + 1} is not a neighbour of the best"


def _interrupted_then_resumed(cache, after: int, trials: int = 10):
    spec = load_config(LARGE[0])
    first = FakeBench(interrupt_after=after)
    with pytest.raises(KeyboardInterrupt):
        tune_shape(spec, LARGE[1], cache, MACHINE, first.factory, trials=trials, echo=quiet)
    done = first.search_evaluations()
    assert len(done) == after - 1 and len(first.interrupted()) == 1
    second = FakeBench()
    result = tune_shape(spec, LARGE[1], cache, MACHINE, second.factory, trials=trials, echo=quiet)
    return done, first.interrupted()[0], second.search_evaluations(), result


@pytest.mark.parametrize("after", [2, 5])
def test_resume_never_reruns_a_known_outcome(cache, after):
    done, interrupted, resumed, result = _interrupted_then_resumed(cache, after)
    assert result.status == "tuned"
    both = done + resumed
    assert len(both) == len(set(both)), "a candidate was evaluated twice"
    assert not set(done) & set(resumed)
    assert len(both) <= 10
    entry = cache.load(result.key)
    ran = {k for k, o in entry.outcomes.items() if o["status"] != "infeasible"}
    assert ran == set(both)  # the interrupted trial left no outcome behind ...
    assert interrupted not in entry.outcomes or interrupted in resumed  # ... unless it ran again


def test_resume_spends_exactly_the_budget(cache):
    done, _, resumed, result = _interrupted_then_resumed(cache, after=5)
    assert len(done) + len(resumed) == 10
    outcomes = cache.load(result.key).outcomes.values()
    assert sum(o["status"] != "infeasible" for o in outcomes) == 10


def test_infeasible_candidates_are_recorded_and_free(cache):
    spec = load_config(SEEDS["groupnorm"])
    shape = (3, 8, 37, 45)
    facts = shape_facts(spec, make_plan(spec), shape, MACHINE.capability)
    assert facts["S"] == 35 * 43 and facts["S"] % 4  # contiguous: 16-byte loads impossible
    feasible, space = _feasible(spec, shape)
    feasible_keys = {candidate_key(c) for c in feasible}
    assert len(feasible) > 24  # sampled, not searched exhaustively
    bench = FakeBench()
    result = tune_shape(spec, shape, cache, MACHINE, bench.factory, trials=24, echo=quiet)  # the sampler gets a turn
    entry = cache.load(result.key)
    infeasible = {k: o for k, o in entry.outcomes.items() if o["status"] == "infeasible"}
    assert infeasible, "the sampler never proposed an infeasible candidate"
    def contiguous_vec4(candidate):
        return (candidate["producer.impl"] == "cudnn" and candidate["stats.vec"] == 4
                and candidate["producer.layout"] == "contiguous")
    # Whatever the sampler proposed that cannot run here was answered from the constraints alone.
    for ckey, o in infeasible.items():
        assert ckey not in feasible_keys and candidate_key(o["candidate"]) == ckey
        broken = space.violations(o["candidate"], facts)
        assert broken and o["log"] == "; ".join(broken)  # every broken constraint is named
        if contiguous_vec4(o["candidate"]):
            assert "S % vec == 0" in o["log"]
    assert space.violations({**space.default(), "producer.layout": "contiguous"}, facts)  # contiguous vec 4: out
    evaluated = bench.search_evaluations()
    assert not set(evaluated) & set(infeasible)  # never run
    assert set(evaluated) <= feasible_keys
    assert len(evaluated) == len(set(evaluated)) == 24  # and not counted against the budget
    ran = {k for k, o in entry.outcomes.items() if o["status"] != "infeasible"}
    assert ran == set(evaluated)
    assert result.counts["infeasible"] == len(infeasible) and result.counts["ok"] == 24
    assert candidate_key(result.candidate) in feasible_keys


def test_concurrent_searches_of_one_key(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    root = tmp_path / "cache"
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    procs = [ctx.Process(target=tune_in_process, args=(str(root), str(LARGE[0]), list(LARGE[1]), 12, str(out), barrier))
             for out in outs]
    assert run_processes(procs, timeout=90) == [0, 0]
    results = [json.loads(out.read_text()) for out in outs]
    assert results[0]["key"] == results[1]["key"]
    cache = Cache(root)
    entry = cache.load(results[0]["key"])
    # no outcome was lost to the other process's write
    assert set(results[0]["evaluated"]) | set(results[1]["evaluated"]) <= set(entry.outcomes)
    best = _best_ok(entry)
    assert candidate_key(entry.winner["candidate"]) == best
    assert entry.winner["time_ms"] == pytest.approx(entry.outcomes[best]["time_ms"])
    for r in results:
        assert r["status"] == "tuned" and r["time_ms"] >= entry.winner["time_ms"]
    # a third search finds the winner cached
    again = FakeBench()
    result = tune_shape(load_config(LARGE[0]), LARGE[1], cache, Machine(*MACHINE_FIELDS), again.factory,
                        trials=12, echo=quiet)
    assert result.status == "cached" and result.candidate == entry.winner["candidate"]


# -- shape facts ------------------------------------------------------------------------------

FACTS = {
    ("groupnorm", (128, 8, 128, 128)): dict(N=128, C=64, D=1, H=126, W=126, S=15876, OD=1, OH=31, OW=31, P=961),
    ("groupnorm", (3, 8, 37, 45)): dict(N=3, C=64, D=1, H=35, W=43, S=1505, OD=1, OH=8, OW=10, P=80),
    ("instancenorm", (128, 3, 16, 32, 32)): dict(N=128, C=16, D=14, H=30, W=30, S=12600, OD=14, OH=30, OW=30, P=12600),
    ("instancenorm", (3, 3, 11, 19, 23)): dict(N=3, C=16, D=9, H=17, W=21, S=3213, OD=9, OH=17, OW=21, P=3213),
    ("batchnorm", (16, 64, 16, 32, 32)): dict(N=16, C=128, D=20, H=36, W=36, S=25920, OD=20, OH=36, OW=36, P=25920),
    ("batchnorm", (3, 64, 5, 7, 9)): dict(N=3, C=128, D=9, H=11, W=13, S=1287, OD=9, OH=11, OW=13, P=1287),
    ("maxpool_gap", (128, 3, 16, 32, 32)): dict(N=128, C=16, D=31, H=63, W=63, S=123039, OD=15, OH=31, OW=31, P=14415),
    ("maxpool_gap", (3, 3, 7, 11, 13)): dict(N=3, C=16, D=13, H=21, W=25, S=6825, OD=6, OH=10, OW=12, P=720),
}


#: The K-tiled tensor-core kernel's facts, for the one seed it takes (64 -> 128, k 5, its forward form
#: stride 1 and padding 4): every (bm, bn) within the shared memory, 3 stages but at 256 x 128 (2); two
#: blocks a multiprocessor at 64 channels only (2 stages at 256 outputs). Beside them, wide_rows_fit.
WIDE_FACTS = {"batchnorm": {"wide": 1, "wide_main": 0, "wide_depth": {
    **{(128, 64, 1, "row"): 3, (128, 64, 2, "row"): 3, (128, 128, 1, "row"): 3, (128, 128, 2, "row"): 0,
       (256, 64, 1, "row"): 3, (256, 64, 2, "row"): 2, (256, 128, 1, "row"): 2, (256, 128, 2, "row"): 0},
    # a plane of 5 x 5 taps: its weights alone take 100 KB a stage at 64 channels
    **{(bm, bn, blocks, "plane"): 0 for bm in (128, 256) for bn in (64, 128) for blocks in (1, 2)}}}}


@pytest.mark.parametrize("seed, shape", sorted(FACTS), ids=[f"{k}-{'x'.join(map(str, s))}" for k, s in sorted(FACTS)])
def test_shape_facts(seed, shape):
    spec = load_config(SEEDS[seed])
    assert shape in spec.shapes
    plan = make_plan(spec)
    facts = shape_facts(spec, plan, shape, MACHINE.capability)
    expected = FACTS[(seed, shape)]
    rows_fit = facts.pop("wide_rows_fit")  # the seed's output rows fit a staged channel at every bm
    main_rows_fit = facts.pop("wide_main_rows_fit")  # no pool: the same check
    pool_fits = facts.pop("wide_pool_fits")  # no pool: every variant (in the seeds that offer wide at all)
    assert pool_fits(256, 64, 2, 1, "plane") == (seed == "batchnorm")
    for check in (rows_fit, main_rows_fit):
        assert [check(bm, expected["H"], expected["W"], "row") for bm in (128, 256)] == [seed == "batchnorm"] * 2
    bins = expected["D"] * expected["H"] * (expected["W"] // 2 + 1)  # the output's half spectrum
    world = plan_facts(plan)
    assert facts == {**expected, "F": bins, "direct": int("direct" in plan.impl_stages), "gemm": int("gemm" in plan.impl_stages),
                     "gemm_th": world["gemm_th"], "direct_cells": world["direct_cells"], "half_store": world["half_store"],
                     "direct_element_values": 0,  # no seed has a layer norm's per-element affine
                     "tf32_terms": 1,  # the seeds' precision tf32: products rounded to TF32, not split
                     "gemm_elem": 4, "gemm_stride": max(spec.producer.geometry()["stride"]),  # float32 seeds
                     "gemm_taps": 1,  # float32: one tap of the input channels a half k step (tiles.gemm_taps)
                     "gemm_b_kept": world["gemm_b_kept"],
                     "pool_extremes": world["pool_extremes"], "offered_impls": tuple(plan.impl_stages),
                     "extrema": int("gemm_extrema" in plan.impl_stages), "gemm_store": int("gemm_store" in plan.impl_stages),
                     "pool_sh": plan.pool_window[1][1], "pool_sw": plan.pool_window[1][2],
                     "spectral": int(seed == "batchnorm"),  # the one seed whose output is its norm's statistics alone
                     "family": plan.family or "none", "sm": 90, "forward_form": int(seed == "batchnorm"),  # stride 1: the other convT has 2
                     "spatial_dims": spec.producer.spatial_dims,
                     "cluster": int("gemm_cluster" in plan.impl_stages),
                     "foldable": False,  # no seed is an eval batch norm's or affine chain (cudnn_fused)
                     "cluster_boxes": cluster_boxes(spec.producer.geometry()) if "gemm_cluster" in plan.impl_stages else {},
                     **WIDE_FACTS.get(seed, {"wide": 0, "wide_main": 0, "wide_depth": {}})}
    assert facts["cluster"] == (seed in ("groupnorm", "instancenorm"))  # instance and group norm on the tensor cores
    assert facts["direct"] == (seed != "batchnorm")  # its 64 -> 128 k=5 weights do not fit constant memory
    assert facts["gemm"] == (seed in ("groupnorm", "instancenorm"))  # not (yet) for transposed convolutions


def test_producer_starts_cover_every_cudnn_choice_once():
    """The transposed batch-norm seed: its starts are cuDNN's defaults in each layout and form, each
    once, the declared default first, and one default per other world (the K-tiled tensor-core kernel
    and the statistics from spectra, feasible; the kernels it cannot take, refused by their constraints)."""
    space = plan_space(make_plan(load_config(SEEDS["batchnorm"])))
    starts = space.producer_starts()
    assert starts[0] == space.canonical(space.default())
    cudnn = [s for s in starts if s["producer.impl"] == "cudnn"]
    assert sorted((s["producer.layout"], s["producer.form"]) for s in cudnn) == sorted(
        (layout, form) for layout in ("contiguous", "channels_last") for form in ("native", "forward"))
    assert all(s == space.canonical({**space.default(), "producer.layout": s["producer.layout"],
                                     "producer.form": s["producer.form"]}) for s in cudnn)
    others = {s["producer.impl"]: s for s in starts if s["producer.impl"] != "cudnn"}
    assert sorted(others) == ["cudnn_fused", "direct", "eager", "gemm", "gemm_cluster", "gemm_extrema", "gemm_store",
                              "gemm_wide", "gemm_wide_recompute", "inductor", "inductor_default", "spectral"]
    spec = load_config(SEEDS["batchnorm"])
    facts = shape_facts(spec, make_plan(spec), spec.shapes[0], "9.0")
    assert [impl for impl, s in others.items() if not space.violations(s, facts)] == [
        "spectral", *REFERENCE_WORLDS]
    # gemm_wide's default stages a plane of taps, whose weights do not fit at 5 x 5 taps: the search
    # starts that world from the nearest feasible candidate, the same variant a row of taps a stage
    feasible = [c for c in space.all() if not space.violations(c, facts)]
    nearest = _nearest(others["gemm_wide"], feasible)
    assert nearest == {**others["gemm_wide"], "wide_stats.staging": "row"}
    assert len({s["producer.impl"] for s in starts[:12]}) == 12  # one per world before cuDNN's other choices


def test_tensor_core_kernels_are_not_offered_before_sm80(cache):
    """mma.sync in TF32 and cp.async need compute capability 8.0: on an older GPU no gemm candidate
    is built or run (its feasibility says why), and the other worlds are searched as usual."""
    spec = load_config(SEEDS["groupnorm"])
    shape = spec.shapes[0]
    plan = make_plan(spec)
    space = plan_space(plan)
    gemm = space.canonical({**space.default(), "producer.impl": "gemm"})
    assert not space.violations(gemm, shape_facts(spec, plan, shape, "8.0"))
    assert any("8.0 or newer" in v for v in space.violations(gemm, shape_facts(spec, plan, shape, "7.5")))
    bench = FakeBench()
    result = tune_shape(spec, shape, cache, Machine("OldGPU", "7.5", "12.4", "2.13"), bench.factory, trials=12,
                        echo=quiet)
    outcomes = cache.load(result.key).outcomes.values()
    ran = {o["candidate"]["producer.impl"] for o in outcomes if o["status"] != "infeasible"}
    assert ran == {"cudnn", "direct", *REFERENCE_WORLDS} and len(bench.search_evaluations()) == 12


def test_renamed_config_shares_module_and_key(tmp_path):
    """The config's name changes neither the generated sources nor the cache key."""
    import dataclasses

    from fusetune.codegen import render
    from fusetune.search import key_fields

    spec = load_config(SEEDS["groupnorm"])
    renamed = dataclasses.replace(spec, name="another_name")
    a, b = render(make_plan(spec)), render(make_plan(renamed))
    assert a.name == b.name and a.source_hash == b.source_hash
    assert make_key(key_fields(spec, spec.shapes[0], MACHINE, a.source_hash)) == \
        make_key(key_fields(renamed, renamed.shapes[0], MACHINE, b.source_hash))


def test_check_memory_counts_the_largest_workspace():
    """The memory check counts, beside the chain's tensors, the largest workspace a world allocates: the
    spectral world's spectra at the batch-norm seed (its weights' spectrum alone is 0.9 GB), the K-tiled
    kernels' padded input and packed weights where they run. A shape refused names the config."""
    from fusetune.errors import FusetuneError
    from fusetune.search import check_memory, workspace_words

    spec = load_config(SEEDS["batchnorm"])
    shape = spec.shapes[0]
    bins = 20 * 36 * (36 // 2 + 1)  # output 20 x 36 x 36: its half spectrum
    assert workspace_words(make_plan(spec), shape) == 2 * 16 * 64 * bins + 2 * 64 * 128 * bins + 16 * 128 * 33
    tensors = (math.prod(shape) + sum(math.prod(s) for s in spec.shapes_through(shape))) * 3
    need = (tensors + workspace_words(make_plan(spec), shape)) * 4 * 2
    check_memory(spec, shape, need)
    with pytest.raises(FusetuneError, match=f"{spec.path}.*GiB"):
        check_memory(spec, shape, need - 1)
    # the K-tiled world (a relu before the norm: no spectra) holds the input zero-padded to whole
    # 16-channel stages and every tap's reach, and the weights of every tap
    relu = load_config(Path(__file__).resolve().parent.parent / "benchmarks" / "configs" / "convt3d_relu_batchnorm_gap.yaml")
    plan = make_plan(relu)
    assert bool(plan_facts(plan)["wide"]) and "spectral" not in plan.impl_stages
    n, cin, d, h, w = relu.shapes[0]
    assert workspace_words(plan, relu.shapes[0]) > n * cin * (d + 8) * (h + 8) * (w + 8) + cin * 128 * 125


def test_where_nothing_beats_pytorch_the_winner_is_eager(cache):
    """eager, the reference as PyTorch runs it, is a world of every plan, tried among the first: where
    every kernel candidate is slower (a chain whose fused region is small beside its PyTorch tail),
    the search hands back eager rather than something slower than what the user started from."""
    spec = load_config(LARGE[0])
    bench = FakeBench(times=lambda c: 0.5 if c["producer.impl"] == "eager" else fake_time(c))
    result = tune_shape(spec, LARGE[1], cache, MACHINE, bench.factory, trials=6, echo=quiet)
    assert result.candidate["producer.impl"] == "eager"
    assert result.time_ms == 0.5


def test_a_search_cut_short_before_pytorchs_forward_still_never_hands_back_slower_kernels(cache):
    """A budget of one trial times the default world's kernels alone; eager, slower to reach in such a
    search (optimize gives a chain seconds), is timed when the winner is named, and wins where it is faster."""
    spec = load_config(LARGE[0])
    bench = FakeBench(times=lambda c: 0.5 if c["producer.impl"] == "eager" else 1.0 + fake_time(c))
    result = tune_shape(spec, LARGE[1], cache, MACHINE, bench.factory, trials=1, echo=quiet)
    assert [k for phase, kind, k in bench.calls if phase == "search" and "producer.impl=eager" in k] == []
    assert result.candidate["producer.impl"] == "eager" and result.time_ms == 0.5


def test_an_unlucky_first_timing_of_pytorchs_forward_is_timed_again(cache):
    """eager's first timing (a busy host) puts it outside the best few re-timed; it is re-timed anyway."""
    spec = load_config(LARGE[0])
    seen: list[str] = []

    def times(c):
        if c["producer.impl"] != "eager":
            return 1.0 + fake_time(c)
        seen.append("eager")
        return 100.0 if len(seen) == 1 else 0.5
    lines: list[str] = []
    result = tune_shape(spec, LARGE[1], cache, MACHINE, FakeBench(times=times).factory, trials=8, echo=lines.append)
    assert len(seen) >= 2 and result.candidate["producer.impl"] == "eager"
    said = [line for line in lines if "re-timed the best" in line]  # the user sees both of eager's timings
    assert len(said) == 1 and "eager 100.0000 then 0.5000 ms" in said[0], said


def test_the_best_are_re_timed_in_rounds_and_a_busy_moment_of_the_host_is_not_the_winners_time(cache):
    """The best few are re-timed in interleaved rounds, each keeping its fastest: a first round slowed 3x for
    every candidate (a fleet's neighbours building) gives the winner neither its name nor its time."""
    spec = load_config(LARGE[0])
    seen: collections.Counter[str] = collections.Counter()

    def times(c):
        if bench.phase != "final":
            return 1.0 + fake_time(c)
        seen[candidate_key(c)] += 1
        return (3.0 if seen[candidate_key(c)] == 1 else 1.0) * (1.0 + fake_time(c))
    bench = FakeBench(times=times)
    lines: list[str] = []
    result = tune_shape(spec, LARGE[1], cache, MACHINE, bench.factory, trials=8, echo=lines.append)
    assert seen and set(seen.values()) == {RETIME_ROUNDS}  # every one of the best, once a round
    assert result.time_ms == pytest.approx(1.0 + fake_time(result.candidate))  # its quiet round
    said = [line for line in lines if "re-timed the best" in line]
    assert len(said) == 1 and f"then {result.time_ms:.4f} ms" in said[0]


def test_a_candidate_failing_a_re_timing_round_is_not_named(cache):
    """A failure in any round of the re-timing keeps the candidate from the winner, however fast its other round."""
    spec = load_config(LARGE[0])
    first: dict[str, float] = {}  # the first round's times

    class Flaky(FakeBench):
        def evaluate(self, candidate):
            key = candidate_key(candidate)
            if self.phase == "final" and key in first and key == min(first, key=first.__getitem__):
                self.calls.append((self.phase, "evaluate", key))
                return {"status": "wrong_result", "log": "fake: wrong in the second round"}
            outcome = super().evaluate(candidate)
            if self.phase == "final":
                first.setdefault(key, outcome["time_ms"])
            return outcome
    result = tune_shape(spec, LARGE[1], cache, MACHINE, Flaky().factory, trials=8, echo=quiet)
    assert result.status == "tuned" and len(first) >= 2
    assert candidate_key(result.candidate) != min(first, key=first.__getitem__)


# -- a damaged cache is a miss, never a failure ---------------------------------------------------

DAMAGES = {
    "truncated": lambda path: path.write_text(path.read_text()[: len(path.read_text()) // 2]),
    "garbage": lambda path: path.write_bytes(b"\xff\x00 not json"),
    "deleted": lambda path: path.unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_entry_after_a_finished_search_re_verifies_the_study_best(cache, damage):
    """The study says its trials are done but the entry (and its winner) is gone: the study's best few
    are verified and timed again and a winner is named; the search is not run again, nothing fails."""
    spec, feasible, _, _ = _small()
    first = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=5, echo=quiet)
    assert first.status == "tuned"
    DAMAGES[damage](cache.entry_path(first.key))
    bench = FakeBench()
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=5, echo=lines.append)
    assert result.status == "tuned", result.message
    assert result.candidate == first.candidate and result.time_ms == pytest.approx(first.time_ms)
    assert len(bench.search_evaluations()) == 3  # the study's best 3 again, no new search
    assert any("re-verifying the study's best 3 candidates" in line for line in lines)
    entry = cache.load(result.key)
    assert entry.winner["candidate"] == first.candidate
    assert tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=5, echo=quiet).status == "cached"


def test_damaged_entry_whose_study_best_now_fail_is_searched_again(cache):
    """Nothing good is recovered from the study: what the entry lost is searched again (the re-verified
    candidates count against the budget), and the search still names a winner."""
    spec, _, _, _ = _small()
    bench = FakeBench()
    first = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=5, echo=quiet)
    tried = sorted(set(bench.search_evaluations()), key=lambda k: cache.load(first.key).outcomes[k]["time_ms"])
    assert len(tried) == 5
    cache.entry_path(first.key).write_text("{")
    broken = {k: "crash" for k in tried[:3]}  # the study's best 3 now crash
    bench = FakeBench(failures=broken)
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        result = tune_shape(spec, SMALL[1], cache, MACHINE, bench.factory, trials=5, echo=lines.append)
    assert result.status == "tuned", result.message
    assert candidate_key(result.candidate) not in broken
    assert any("searching again" in line for line in lines)
    evaluated = set(bench.search_evaluations())
    assert set(tried[:3]) <= evaluated and len(evaluated) == 5  # 3 re-verified + 2 searched: the budget
    assert result.counts["crash"] == 3 and result.counts["ok"] == 2


@pytest.mark.parametrize("damage", ["truncated_mid_line", "garbage"])
def test_damaged_study_journal_is_not_fatal(cache, damage):
    spec, _, _, _ = _small()
    first = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=5, echo=quiet)
    journal = cache.study_path(first.key)
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) // 2] if damage == "truncated_mid_line" else b"\xff\x00garbage{\n")
    cache.entry_path(first.key).write_text("")  # and the entry: the study is needed
    with pytest.warns(CacheWarning) as record:
        result = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=5, echo=quiet)
    assert result.status == "tuned", result.message
    assert result.candidate == first.candidate  # the fastest of the same starts again
    assert any("study journal" in str(w.message) for w in record)
    again = tune_shape(spec, SMALL[1], cache, MACHINE, FakeBench().factory, trials=5, echo=quiet)
    assert again.status == "cached"


def test_the_sampler_s_candidates_built_ahead_are_the_competitive_worlds_untried_ones():
    """search._sampler_worlds (what a search in batches builds ahead of its sampler, lazy.Batches.expect): every
    untried feasible candidate of each world within COMPETITIVE of the fastest so far, the fastest world's first;
    a world beaten by more than that, and the tried candidates, never."""
    from fusetune.search import COMPETITIVE, _sampler_worlds

    spec = load_config(SEEDS["groupnorm"])
    plan = make_plan(spec)
    space = plan_space(plan)
    facts = shape_facts(spec, plan, spec.shapes[0], MACHINE.capability)
    feasible = [c for c in space.all() if not space.violations(c, facts)]
    by_world: dict[str, list] = {}
    for candidate in feasible:
        by_world.setdefault(candidate["producer.impl"], []).append(candidate)
    fast, near, far = (w for w in ("gemm", "direct", "gemm_store") if w in by_world)
    times = {fast: 1.0, near: 1.0 * COMPETITIVE * 0.9, far: 1.0 * COMPETITIVE * 1.1}
    outcomes = {candidate_key(by_world[w][0]): {"status": "ok", "time_ms": t, "candidate": by_world[w][0]}
                for w, t in times.items()}
    tried = set(outcomes) | {candidate_key(by_world[fast][1])}
    chosen = _sampler_worlds(outcomes, feasible, tried)
    worlds = [c["producer.impl"] for c in chosen]
    assert set(worlds) == {fast, near} and worlds == sorted(worlds, key=[fast, near].index)
    assert {candidate_key(c) for c in chosen} == {candidate_key(c) for w in (fast, near) for c in by_world[w]} - tried
    assert _sampler_worlds({}, feasible, set()) == []
