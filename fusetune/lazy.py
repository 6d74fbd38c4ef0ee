"""Searching in batches: build only the candidates about to be timed, cheapest first (``fusetune search``
through runner.SearchFactory, and ``fusetune.optimize`` under its budget: one code path).

Why: the search's benchmarker (runner.GpuBenchmarker) builds one module of every variant of a plan
before its first trial: tens of translation units, a minute or more of nvcc per chain. Under
``fusetune.optimize``'s budget that left no time to time anything (0 of resnet18's 20 chains tuned in
its 120 s). Here the candidates a search is about to try are split into batches, each with a module
of just their compile-time variants (``module_only``), and tried batch by batch:

* batch 0 is the default world's default candidate (cuDNN, then the stages' defaults) with every
  candidate that fits its module: PyTorch's own forward (the eager world, nothing of its own to
  build) and cuDNN's other layouts and forms (run-time choices);
* then the other worlds' candidates, world by world, ``BATCH`` to a module;
* a world whose first run compiles (``World.warmup_s``: torch.compile) last, and only with enough
  time left (``WARMUP_SHARE``).

Builds run in a ``BuildPool`` shared by all the chains of one run (threads, each build a child
process): ``optimize`` submits every chain's batch 0 before timing the first, so nvcc works for
later chains while earlier ones are timed, and a chain's later batches build while its earlier
ones are timed. A candidate whose module is not ready by the chain's deadline is deferred
(``search.Deferred``): nothing is recorded, and a later run with more budget tries it. Batch 0 is
never deferred: every chain gets at least its cheapest candidates.

The cache key does not change: ``tune_shape`` still keys a search by the full module's source hash
(``render(plan)`` renders, nothing builds it), so ``fusetune search``, ``optimize`` and ``load`` find
the same entries, whichever benchmarker filled them.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from fusetune.build import BuildResult
from fusetune.codegen import PER_VARIANT_UNITS, RenderedModule, plan_space, render
from fusetune.config import ProblemSpec
from fusetune.ops import Shape
from fusetune.plan import Plan
from fusetune.space import Candidate, FamilySpace, PlanSpace, candidate_key
from fusetune.worlds import DEFAULT, WORLDS

#: Candidates per module after batch 0 (their units compile in parallel under ninja).
BATCH = 4
#: Seconds a chain's search gets at least, counted from its batch 0 built (the benchmarker's prepare waits for
#: it): enough to time PyTorch's forward and cuDNN's defaults at a ResNet's shapes, however small the
#: chain's share of the budget left (that share is the budget left over the distinct chains still to go).
MIN_SEARCH_S = 10.0
#: A world whose first run compiles (World.warmup_s, its worst case) is tried only with at least this
#: share of that worst case left before the chain's deadline.
WARMUP_SHARE = 0.1

Builder = Callable[[RenderedModule], BuildResult]
Only = dict[str, list[dict[str, Any]]]  # codegen.render's ``only``: stage -> compile-time values


# --------------------------------------------------------------------------------------------------
# What a candidate needs built


def _compiled(plan: Plan, space: PlanSpace) -> list[FamilySpace]:
    """The plan's stages with compile-time variants: what a module of some variants restricts."""
    return [f for f in space.families if f.family in plan.stages and f.compile_params]


def _needs(family: FamilySpace, candidate: Mapping[str, Any]) -> dict[str, Any]:
    return {p.name: candidate.get(f"{family.family}.{p.name}", p.default) for p in family.compile_params}


def _fits(only: Only, plan: Plan, space: PlanSpace, candidate: Mapping[str, Any]) -> bool:
    """Whether a module of ``only`` runs ``candidate``: the generated model resolves every stage whose
    list is not empty (so the candidate's values must be there, active or not), and a stage the
    candidate runs must have its variant compiled."""
    active = {f.family for f in space.active(candidate)}
    for family in _compiled(plan, space):
        values = only.get(family.family, [])
        if (values or family.family in active) and _needs(family, candidate) not in values:
            return False
    return True


def module_only(plan: Plan, candidates: Iterable[Mapping[str, Any]]) -> Only:
    """``render``'s ``only`` for a module that runs every one of ``candidates`` and no more: per stage,
    the variants the candidates run; a stage compiled one unit per variant (codegen.PER_VARIANT_UNITS:
    the slow ones) that none of them runs gets none. Where a stage has variants, every candidate's
    value there is added too (the generated model resolves every such stage, run or not)."""
    space = plan_space(plan)
    candidates = list(candidates)
    active = [{f.family for f in space.active(c)} for c in candidates]
    only: Only = {}
    for family in _compiled(plan, space):
        wanted: list[dict[str, Any]] = []
        for candidate, runs in zip(candidates, active):
            if family.family in runs or family.family not in PER_VARIANT_UNITS:
                if _needs(family, candidate) not in wanted:
                    wanted.append(_needs(family, candidate))
        if wanted:
            for candidate in candidates:
                if _needs(family, candidate) not in wanted:
                    wanted.append(_needs(family, candidate))
        only[family.family] = wanted
    return only


def batch_module(plan: Plan, candidates: Iterable[Mapping[str, Any]]) -> RenderedModule:
    return render(plan, module_only(plan, candidates))


def winner_module(plan: Plan, variant: Mapping[str, Mapping[str, Any]]) -> RenderedModule:
    """The module of one winner (stage -> values): the one ``optimize`` builds and loads; for a winner of
    cuDNN's defaults the same module as its chain's batch 0, so nothing more is compiled."""
    flat = {f"{stage}.{name}": value for stage, values in variant.items() for name, value in values.items()}
    return batch_module(plan, [plan_space(plan).canonical({**plan_space(plan).default(), **flat})])


def starts(spec: ProblemSpec, plan: Plan, shape: Shape, capability: str) -> list[Candidate]:
    """The search's starts at this shape (search.tune_shape's queue for a space larger than its trials):
    each world's defaults, or the nearest feasible candidate of that producer choice, the default world's
    first. ``optimize`` schedules them for every chain before timing the first, so that the builds of
    later chains' batches go on while earlier chains are timed."""
    from fusetune.search import _left_out, _nearest, shape_facts

    space = plan_space(plan)
    facts = shape_facts(spec, plan, shape, capability)
    excluded = spec.search.exclude_worlds
    memo: dict = {}
    feasible = [c for c in space.all() if not space.violations(c, facts, memo) and not _left_out(c, excluded)]
    found: dict[str, Candidate] = {}
    for start in space.producer_starts():
        nearest = _nearest(start, feasible)
        if nearest is not None:
            found.setdefault(candidate_key(nearest), nearest)
    return list(found.values())


def cheapest(spec: ProblemSpec, plan: Plan, shape: Shape, capability: str) -> Candidate | None:
    """Batch 0's candidate: the default world's defaults (the search's first start), or the nearest
    feasible candidate of that world at this shape (of the next world where none is feasible)."""
    first = starts(spec, plan, shape, capability)
    return first[0] if first else None


def _rank(candidate: Mapping[str, Any]) -> int:
    """0: PyTorch's forward (nothing of its own to build or compile); 1: the default world; 2: the other
    worlds of kernels; 3: a world whose first run compiles (torch.compile)."""
    world = WORLDS.get(candidate.get("producer.impl", DEFAULT))
    if world is None:
        return 2
    if world.warmup_s > 0:
        return 3
    if world.runs_reference:
        return 0
    return 1 if world.name == DEFAULT else 2


# --------------------------------------------------------------------------------------------------
# Building


class BuildPool:
    """Builds modules in threads (each build is a child process running ninja), once per module name,
    shared by every chain of a run. ``jobs``: builds at once (default: a quarter of the cores, as
    build.build_many, at least 2 so that a later batch builds while an earlier one is timed)."""

    def __init__(self, builder: Builder, jobs: int | None = None) -> None:
        self.builder = builder
        jobs = jobs or max(2, (os.cpu_count() or 2) // 4)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fusetune-build")
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    def submit(self, module: RenderedModule) -> concurrent.futures.Future:
        """The module's build: the one submitted before (running, done or queued), else a new one (also
        where the one before was cancelled: another chain of the same problem dropped it)."""
        with self._lock:
            future = self._futures.get(module.name)
            if future is None or future.cancelled():
                future = self._futures[module.name] = self._pool.submit(self._build, module)
            return future

    def _build(self, module: RenderedModule) -> BuildResult:
        """The builder's result; an exception of the builder's own (not the compiler's) is a failed build
        too: a build never takes the search down."""
        try:
            return self.builder(module)
        except Exception as exc:
            where = Path(module.name)
            return BuildResult(module.name, False, 0.0, f"the build raised {type(exc).__name__}: {exc}", where, where)

    def current(self, name: str) -> concurrent.futures.Future | None:
        with self._lock:
            return self._futures.get(name)

    def cancel(self, names: Iterable[str] | None = None) -> None:
        """Drop the builds of these modules not yet started (of a chain that finished without them; all
        of them by default)."""
        with self._lock:
            futures = list(self._futures.values()) if names is None else [
                self._futures[name] for name in names if name in self._futures]
        for future in futures:
            future.cancel()

    def close(self) -> None:
        """Cancel what has not started and return: a build running now finishes in the background
        (into the cache, for the next run; killed halfway it would be lost)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------------------------------------------
# One chain's batches


class Batches:
    """The modules of one plan's search under a deadline: which candidate runs in which module, and
    their builds in the shared pool. ``clock``: the deadline's clock (time.monotonic)."""

    def __init__(self, plan: Plan, pool: BuildPool, deadline: float, first: Candidate | None = None,
                 clock: Callable[[], float] = time.monotonic, ahead: bool = False) -> None:
        self.plan, self.pool, self.deadline, self.clock = plan, pool, deadline, clock
        # Whether ``expect`` builds ahead: a search with time for its sampler (``fusetune search``), not a chain's
        # share of optimize's budget (where a world's whole module would hold a build slot other chains need).
        self.ahead = ahead
        self.space = plan_space(plan)
        self.modules: list[tuple[Only, RenderedModule]] = []  # their builds: pool.submit (once per name)
        self.where: dict[str, int] = {}  # candidate key -> index in modules
        self.members: list[set[str]] = []  # per module, the candidates ever assigned to it
        if first is not None:
            self._add([first])

    def _add(self, candidates: list[Candidate]) -> int:
        only = module_only(self.plan, candidates)
        module = render(self.plan, only)
        self.pool.submit(module)
        self.modules.append((only, module))
        self.members.append(set())
        index = len(self.modules) - 1
        for candidate in candidates:
            self.where[candidate_key(candidate)] = index
            self.members[index].add(candidate_key(candidate))
        return index

    def _assign(self, candidate: Candidate) -> int | None:
        """The first module (batch 0 first) that already runs the candidate, if any."""
        key = candidate_key(candidate)
        if key not in self.where:
            for index, (only, _) in enumerate(self.modules):
                if _fits(only, self.plan, self.space, candidate):
                    self.where[key] = index
                    self.members[index].add(key)
                    break
        return self.where.get(key)

    def schedule(self, queued: list[Candidate]) -> list[Candidate]:
        """The candidates in the order to try them (batch by batch, cheapest first), their modules
        submitted to the pool now: a later batch builds while an earlier one is timed. Batches made
        without a first candidate (``fusetune search``'s) take the queue's first of the default world as
        batch 0: the search's first start, as ``cheapest`` picks it."""
        if not self.modules:
            first = next((c for c in queued if _rank(c) == 1), None)
            if first is not None:
                self._add([first])
        pending = [c for c in sorted(queued, key=_rank) if self._assign(c) is None]
        by_world: dict[str, list[Candidate]] = {}
        for candidate in pending:  # one world's candidates share their stages: fewest units per module
            by_world.setdefault(candidate.get("producer.impl", DEFAULT), []).append(candidate)
        for group in by_world.values():
            for at in range(0, len(group), BATCH):
                self._add(group[at:at + BATCH])
        return sorted(queued, key=lambda c: (_rank(c) == 3, self.where[candidate_key(c)], _rank(c)))

    def expect(self, candidates: Iterable[Candidate]) -> int:
        """Submit, per world, one module of every one of ``candidates`` that no module runs yet: what the
        search's sampler may suggest next (the competitive worlds' rest, search._sampler_worlds). One module
        a world rather than ``BATCH`` a module: the sampler's suggestions come one at a time, and one build
        of all of a world's variants (its units in parallel under ninja, one link) costs less than
        a build per suggestion. The candidates are assigned to it when asked for (``module_for``): an earlier
        module that runs one still runs it. Returns how many modules were submitted."""
        if not self.ahead or self.clock() >= self.deadline:
            return 0  # not building ahead, or no time left to run them: nothing is built for them
        compiled = _compiled(self.plan, self.space)
        distinct: dict[str, Candidate] = {}  # one candidate per world and compiled variants: what a module depends on
        for candidate in candidates:
            active = {f.family for f in self.space.active(candidate)}
            signature = repr((candidate.get("producer.impl", DEFAULT),
                              [(f.family in active, sorted(_needs(f, candidate).items())) for f in compiled]))
            distinct.setdefault(signature, candidate)
        by_world: dict[str, list[Candidate]] = {}
        for candidate in distinct.values():
            if candidate_key(candidate) not in self.where and not any(
                    _fits(only, self.plan, self.space, candidate) for only, _ in self.modules):
                by_world.setdefault(candidate.get("producer.impl", DEFAULT), []).append(candidate)
        for group in by_world.values():
            only = module_only(self.plan, group)
            module = render(self.plan, only)
            if all(module.name != known.name for _, known in self.modules):
                self.pool.submit(module)
                self.modules.append((only, module))
                self.members.append(set())
        return len(by_world)

    def module_for(self, candidate: Candidate, *, final: bool = False) -> BuildResult:
        """The built module that runs ``candidate`` (a module of its own if no batch has it, or if its
        batch failed to build: one variant that does not compile costs itself alone). Before the deadline,
        for batch 0, and in the final phase (``final``: naming the winner) it waits for the build; else a
        build not ready in time defers the candidate (search.Deferred)."""
        from fusetune.search import Deferred

        world = WORLDS.get(candidate.get("producer.impl", DEFAULT))
        left = self.deadline - self.clock()
        if not final and world is not None and world.warmup_s and left < world.warmup_s * WARMUP_SHARE:
            raise Deferred(f"the {world.name} world's first run may take {world.warmup_s:.0f} s; "
                           f"{max(left, 0):.0f} s are left")
        index = self._assign(candidate)
        if index is None and not final and self.modules and left <= 0:
            raise Deferred("no module runs it and the deadline has passed")  # nothing built past the deadline
        if index is None:
            index = self._add([candidate])
        result = self._wait(index, final)
        if not result.ok and render(self.plan, module_only(self.plan, [candidate])).name != result.name:
            result = self._wait(self._add([candidate]), final)  # its batch (or a world's, expect) held more
        return result

    def _wait(self, index: int, final: bool) -> BuildResult:
        from fusetune.search import Deferred

        future = self.pool.submit(self.modules[index][1])
        if final or index == 0 or future.done():
            return future.result()
        try:
            return future.result(timeout=max(0.0, self.deadline - self.clock()))
        except concurrent.futures.TimeoutError:
            raise Deferred(f"its module {self.modules[index][1].name} is still building at the deadline") from None

    def first_built(self) -> BuildResult | None:
        """Batch 0's module, waited for (a benchmarker's prepare: the search's clock starts once its cheapest
        candidates can run); else another that built, for what needs any module of the plan (eager's time)."""
        for index, (_, module) in enumerate(self.modules):
            future = self.pool.submit(module) if index == 0 else self.pool.current(module.name)
            if future is not None and (index == 0 or (future.done() and not future.cancelled())):
                result = future.result()
                if result.ok:
                    return result
        return None

    def cancel_pending(self) -> None:
        self.pool.cancel(module.name for _, module in self.modules[1:])

