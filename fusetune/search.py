"""Tune every shape of a config: one optuna study per (problem, shape, machine).

The benchmarker is passed in (as in Triton's autotuner), so the whole search, cache and
resume logic runs in tests with a fake one and no GPU. A trial that fails for any reason
(build, launch, crash, hang, wrong answer, infeasible) is recorded with its outcome and
reported to optuna as pruned: samplers then move on instead of treating it as unseen.
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import math
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from fusetune import __version__
from fusetune.cache import Cache, CacheWarning, Entry, make_key, repair_journal
from fusetune.codegen import CUDA_FLAGS, RenderedModule, plan_facts, plan_space, render
from fusetune.config import ProblemSpec
from fusetune.errors import FusetuneError, NoGpuError
from fusetune.evaluate import VERIFICATION
from fusetune.ops import Shape
from fusetune.plan import Plan, make_plan
from fusetune.progress import PlainReporter, Reporter
from fusetune.space import Candidate, PlanSpace, candidate_key
from fusetune.storage import Storage, pull_winner, push_winner
from fusetune.tiles import wide_axes, wide_cin_padded, wide_row_words, wide_workspace_words
from fusetune.worlds import DEFAULT as DEFAULT_WORLD
from fusetune.worlds import WORLDS

if TYPE_CHECKING:  # optuna is imported where a study is opened: a lookup of stored winners (deploy) needs none
    import optuna

#: How many of the best candidates are timed again, head to head, before a winner is named, and in how
#: many interleaved rounds: each keeps its best round. A busy moment of the host (a fleet's other workers
#: building beside a forward of microseconds) slows every candidate timed during it; interleaved, it falls on
#: one round of each, which its other rounds outvote.
RETIME_TOP = 3
RETIME_ROUNDS = 2
#: After the starts, every world (``producer.impl``) whose best time is within COMPETITIVE times the
#: best of all gets NEIGHBOURS_PER_WORLD neighbours of its best (one choice changed) before the sampler
#: takes over, in at most a third of the budget left. TPE models the whole space at once: a world whose
#: default came second was seen to get 1 trial of 24 (gemm_wide, whose neighbour then won by 10%).
COMPETITIVE = 2.0
NEIGHBOURS_PER_WORLD = 2
#: The last POLISH_SHARE of a large space's budget climbs from the best candidate so far: its untried
#: neighbours (one choice changed) in the seed's random order, re-centred on each that beats it. A forward's
#: stages are kernels whose times add, so the sampler's best is often one choice away from a faster candidate
#: (one stage's vector width or block), which TPE, modelling the whole space at once, may never suggest.
POLISH_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class Machine:
    """What a tuned result depends on, besides the problem: part of every cache key."""

    gpu: str
    capability: str
    cuda: str
    torch: str

    @classmethod
    def detect(cls) -> "Machine":
        """This process's GPU (torch's current device) and the torch and CUDA it runs with.

        Where torch is not imported yet, the CUDA driver is asked (``driver_machine``): the name and
        capability torch's device properties hold, without importing torch (seconds, with its CUDA
        libraries) or making a CUDA context (up to a second): a deploy whose winners are all stored
        needs neither. Where torch is imported already (its current device may be another, a test may
        stand in for it) or the driver cannot answer, torch is asked; it also says why there is no GPU."""
        if "torch" not in sys.modules:
            found = driver_machine()
            if found is not None:
                return found
        return cls.from_torch()

    @classmethod
    def from_torch(cls) -> "Machine":
        """``detect`` through torch: imports it and makes a CUDA context."""
        import torch

        if not torch.cuda.is_available():
            raise NoGpuError(no_gpu_reason(torch))
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return cls(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   cuda=str(torch.version.cuda), torch=torch.__version__.split("+")[0])


#: The CUDA driver's library (never bundled with torch: the one torch's CUDA runtime loads too).
CUDA_DRIVER = "libcuda.so.1"
#: cuda.h's CUdevice_attribute numbers of the compute capability, read by ``driver_machine``.
DRIVER_ATTRIBUTES = {"major": 75, "minor": 76}  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR
#: How long a device name may be (cudaDeviceProp.name's size, which the runtime fills from the driver's).
DEVICE_NAME_BYTES = 256


def torch_build() -> tuple[str, str | None] | None:
    """torch's ``__version__`` and ``version.cuda`` (None: a CPU-only or ROCm build), read from the file
    ``torch.version`` is (torch/version.py: constants only) without importing torch; None where unreadable."""
    found = importlib.util.find_spec("torch")
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / "version.py"
    spec = importlib.util.spec_from_file_location("fusetune_torch_version", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        version, cuda = str(module.__version__), module.cuda
    except Exception:  # a file of another shape: torch is asked instead, whatever it holds
        return None
    return version, (None if cuda is None else str(cuda))


def driver_machine() -> Machine | None:
    """``Machine.detect``'s answer for CUDA device 0 (torch's current device in a process that has not chosen
    one), from the CUDA driver API: cuDeviceGetName and the capability attributes are what the runtime copies
    into the device properties torch reads, so the cache key is the same. ``cuInit`` starts the driver but
    makes no context. None where torch would be asked instead: no driver, no device visible, a torch
    without CUDA, a driver of an older CUDA major version than torch's (torch would see no GPU)."""
    build = torch_build()
    if build is None or build[1] is None:
        return None
    version, cuda = build
    try:
        driver, cuda_major = ctypes.CDLL(CUDA_DRIVER), int(cuda.split(".")[0])
    except (OSError, ValueError):
        return None
    number, device, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if (driver.cuInit(0) != 0 or driver.cuDriverGetVersion(ctypes.byref(number)) != 0
            or number.value // 1000 < cuda_major
            or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1
            or driver.cuDeviceGet(ctypes.byref(device), 0) != 0):
        return None
    name = ctypes.create_string_buffer(DEVICE_NAME_BYTES)
    values = {what: ctypes.c_int() for what in DRIVER_ATTRIBUTES}
    if driver.cuDeviceGetName(name, DEVICE_NAME_BYTES, device) != 0 or any(
            driver.cuDeviceGetAttribute(ctypes.byref(values[what]), attribute, device) != 0
            for what, attribute in DRIVER_ATTRIBUTES.items()):
        return None
    return Machine(gpu=name.value.decode(), capability=f"{values['major'].value}.{values['minor'].value}",
                   cuda=cuda, torch=version.split("+")[0])


def no_gpu_reason(torch: Any) -> str:
    """Why no GPU can be used, from what this torch is rather than a guess."""
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build: tuning and running the kernels need a CUDA "
                "build of torch (see https://pytorch.org/get-started/locally/) and an NVIDIA GPU")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = f"CUDA_VISIBLE_DEVICES is {visible!r} (does it name a device?); " if visible is not None else ""
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU: {hint}check that the "
            "NVIDIA driver is loaded (nvidia-smi) and new enough for that CUDA version")


class Benchmarker(Protocol):
    """Verifies and times candidates of one plan at one shape."""

    def prepare(self) -> None: ...
    def evaluate(self, candidate: Candidate) -> dict[str, Any]: ...
    def confirm(self, candidate: Candidate) -> dict[str, Any]: ...
    def eager_ms(self) -> float | None: ...


BenchmarkerFactory = Callable[[Plan, Shape], Benchmarker]


class Deferred(Exception):
    """Raised by a benchmarker's ``evaluate`` that cannot run a candidate in the search's time (its
    module is still building at the deadline: fusetune.lazy). The trial is pruned with no outcome
    recorded, so a later search (with more time) tries the candidate."""


@dataclasses.dataclass
class ShapeResult:
    shape: Shape
    key: str
    status: str  # "tuned" | "cached" | "failed"
    candidate: Candidate | None = None
    time_ms: float | None = None
    eager_ms: float | None = None
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    message: str = ""
    shown: dict[str, Any] | None = None  # the winner's choices that matter (see PlanSpace.relevant)

    @property
    def speedup(self) -> float | None:
        if self.time_ms and self.eager_ms:
            return self.eager_ms / self.time_ms
        return None


def shape_facts(spec: ProblemSpec, plan: Plan, shape: Shape, capability: str) -> dict[str, int]:
    """Names the template constraints may use: producer output and pooled sizes, what the plan
    offers, and the GPU's compute capability as ``sm`` (90 for "9.0")."""
    out = spec.producer.out_shape(shape)
    spatial = (1,) * (5 - len(out)) + tuple(out[2:])
    facts = {"N": out[0], "C": out[1], "D": spatial[0], "H": spatial[1], "W": spatial[2]}
    facts["S"] = facts["D"] * facts["H"] * facts["W"]
    facts["F"] = facts["D"] * facts["H"] * (facts["W"] // 2 + 1)  # bins of the output's real spectrum
    pooled = spatial
    if plan.pool is not None:
        pooled = plan.pool.out_shape(out)[2:]
        pooled = (1,) * (3 - len(pooled)) + tuple(pooled)
    facts.update(OD=pooled[0], OH=pooled[1], OW=pooled[2])
    facts["P"] = pooled[0] * pooled[1] * pooled[2]
    major, minor = capability.split(".")
    facts["sm"] = 10 * int(major) + int(minor)
    return {**facts, **plan_facts(plan)}  # and what the plan offers (direct kernels, main family)


def key_fields(spec: ProblemSpec, shape: Shape, machine: Machine, source_hash: str) -> dict[str, Any]:
    """Everything that can change the answer. Not the config's name, nor its search settings but the
    worlds it leaves out and a timing other than ``launch`` (only where so: the keys of other searches stay
    as they were)."""
    fields = {"problem": spec.canonical(), "shape": list(shape), "dtype": spec.dtype, "input_layout": "contiguous",
              "gpu": machine.gpu, "capability": machine.capability, "cuda": machine.cuda,
              "torch": machine.torch, "fusetune": __version__, "verification": VERIFICATION,
              "cuda_flags": list(CUDA_FLAGS), "sources": source_hash}
    if spec.search.exclude_worlds:
        fields["exclude_worlds"] = list(spec.search.exclude_worlds)
    if spec.search.timing != "launch":
        fields["timing"] = spec.search.timing
    return fields


def shape_key(spec: ProblemSpec, shape: Shape, machine: Machine, source_hash: str) -> tuple[str, dict[str, Any]]:
    """The cache key of ``shape`` (``key_fields``' hash) and the fields its entry keeps: the key's, with the
    config's name and file to show (not part of the key)."""
    fields = key_fields(spec, shape, machine, source_hash)
    return make_key(fields), {**fields, "problem_name": spec.name, "config": spec.path}


def _study(cache: Cache, key: str, trials: int, seed: int, storage: Storage | None = None) -> optuna.Study:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own line per trial says more
    if storage is not None:  # --storage: one study per key for every process of every host
        study = optuna.create_study(study_name=key, storage=storage.optuna_storage(), direction="minimize",
                                    load_if_exists=True)
        study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials), n_startup_trials=min(8, trials))
        return study
    path = cache.study_path(key)
    repair_journal(path)  # a damaged journal is cut back to what is readable, never fatal
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        study = optuna.create_study(study_name=key, storage=storage, direction="minimize", load_if_exists=True)
    except Exception as exc:  # readable lines that optuna still cannot replay: start the study afresh
        warnings.warn(f"fusetune: ignoring unreadable study journal {path} ({type(exc).__name__}: {exc}); "
                      "the shape is searched again", CacheWarning, stacklevel=2)
        path.unlink(missing_ok=True)
        storage = JournalStorage(JournalFileBackend(str(path)))
        study = optuna.create_study(study_name=key, storage=storage, direction="minimize", load_if_exists=True)
    # A resumed study gets a different seed, so its sampler does not replay the first run's suggestions.
    study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials), n_startup_trials=min(8, trials))
    return study


def _evaluated(study: optuna.Study, space: PlanSpace) -> set[str]:
    """Distinct candidates trials ran to an outcome: infeasible ones cost nothing and do not count. A
    trial with an outcome counts even if it was never finished: its process lost the database or
    died between recording the outcome and telling the study (a shared study fails it later)."""
    return {candidate_key(space.canonical(t.params)) for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("status") not in (None, "infeasible")}


def _tried(study: optuna.Study, space: PlanSpace) -> set[str]:
    """Candidates with an outcome. A trial cut off by Ctrl-C has none, so it is queued again."""
    return {candidate_key(space.canonical(t.params)) for t in study.get_trials(deepcopy=False)
            if "status" in t.user_attrs}


class _Objective:
    """One optuna trial: suggest, reject the infeasible, reuse known outcomes, else run."""

    def __init__(self, space: PlanSpace, facts: dict[str, int], bench: Benchmarker, cache: Cache,
                 key: str, fields: dict[str, Any], force: bool, reporter: Reporter, total: int,
                 label: str = "", excluded: tuple[str, ...] = ()) -> None:
        self.space, self.facts, self.bench, self.cache = space, facts, bench, cache
        self.excluded = excluded  # the config's search.exclude_worlds
        self.key, self.fields, self.force, self.reporter, self.total = key, fields, force, reporter, total
        self.label = label  # the reporter's name for this search
        self.best_ms: float | None = None  # the fastest ok outcome seen in this process
        self.rerun: set[str] = set()  # candidates already re-run under --force in this search
        self.timings = {"evaluate_s": 0.0, "verify_s": 0.0, "time_s": 0.0}  # evaluate: verify, time, the rest
        self.evaluated = 0  # feasible trials run or reused in this process
        self.stop_at = total  # the sampler's turn ends here (the polish's trials after it)
        self.seen: set[str] = set()  # candidates already counted in this process

    def stop_when_done(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self.evaluated >= self.stop_at:
            study.stop()

    def __call__(self, trial: optuna.Trial) -> float:
        import optuna

        suggested = {name: trial.suggest_categorical(name, list(choices))
                     for name, choices in self.space.choices().items()}
        candidate = self.space.canonical(suggested)  # choices that do not matter here are not new candidates
        ckey = candidate_key(candidate)
        entry = self.cache.load(self.key)
        known = entry.outcomes.get(ckey) if entry else None
        if known is not None and not (self.force and ckey not in self.rerun):
            outcome, source = known, "known"
        else:
            try:
                outcome, source = self._run(candidate), "new"
            except Deferred as exc:  # no outcome: nothing recorded, so a later search tries it
                raise optuna.TrialPruned(f"deferred: {exc}") from None
            self.rerun.add(ckey)
            self.cache.record(self.key, self.fields, ckey, {**outcome, "candidate": candidate})
        trial.set_user_attr("status", outcome["status"])
        if outcome["status"] == "infeasible":
            raise optuna.TrialPruned("infeasible")  # rejected before building or running: not counted
        if ckey in self.seen:  # the sampler asked again: answer it, but it costs no budget
            if outcome["status"] != "ok":
                raise optuna.TrialPruned(outcome["status"])
            return float(outcome["time_ms"])
        self.seen.add(ckey)
        self.evaluated += 1
        self._report(self.evaluated, candidate, outcome, source)
        if outcome["status"] != "ok":
            raise optuna.TrialPruned(outcome["status"])
        return float(outcome["time_ms"])

    def _run(self, candidate: Candidate) -> dict[str, Any]:
        broken = self.space.violations(candidate, self.facts) + _left_out(candidate, self.excluded)
        if broken:
            return {"status": "infeasible", "log": "; ".join(broken)}
        start = time.perf_counter()
        outcome = self.bench.evaluate(candidate)
        self.timings["evaluate_s"] += time.perf_counter() - start
        for part in ("verify_s", "time_s"):  # measured in the worker (absent from a fake benchmarker)
            self.timings[part] += float(outcome.get(part, 0.0))
        return outcome

    def _report(self, number: int, candidate: Candidate, outcome: dict[str, Any], source: str) -> None:
        """Progress (n of N, best so far) for everyone; the candidate and its outcome with ``-v``."""
        params = " ".join(f"{k}={v}" for k, v in self.space.relevant(candidate).items())
        status = outcome["status"]
        if status == "ok" and (self.best_ms is None or outcome["time_ms"] < self.best_ms):
            self.best_ms = float(outcome["time_ms"])
        result = f"{outcome['time_ms']:.4f} ms" if status == "ok" else status
        note = " (known)" if source == "known" else ""
        self.reporter.trial_done(self.label, number, self.total, result + note, self.best_ms)
        log = (outcome.get("log") or "").strip().splitlines() if status != "ok" else []
        self.reporter.debug(f"  trial {number:>3}/{self.total}  {params}  -> {result}{note}"
                            + (f"\n      {log[-1][:300]}" if log else ""))


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What the search or lookup of any shape of one plan needs of it, the same for every shape: the plan,
    its rendered module (whose source hash is part of each key) and its space."""

    plan: Plan
    rendered: RenderedModule
    space: PlanSpace


def prepare(spec: ProblemSpec, plan: Plan | None = None) -> Prepared:
    """``spec``'s plan (or ``plan``), rendered, and its space: made once for a caller of several shapes."""
    plan = plan or make_plan(spec)
    return Prepared(plan, render(plan), plan_space(plan))


def tune_shape(spec: ProblemSpec, shape: Shape, cache: Cache, machine: Machine, make_bench: BenchmarkerFactory,
               *, trials: int | None = None, timeout: float | None = None, force: bool = False,
               echo: Callable[[str], None] = print, plan: Plan | None = None,
               reporter: Reporter | None = None, storage: Storage | None = None,
               budget_s: float | None = None, prepared: Prepared | None = None) -> ShapeResult:
    """Tune one shape, or return the cached winner. Resumes an interrupted study.

    ``budget_s``: seconds for the whole shape from this call on, builds included (``timeout`` counts from
    the first candidate ready). At the budget the search stops and names the best so far; a candidate
    whose module is not built by then is deferred (Deferred: a later search tries it). A benchmarker that
    builds per batch (fusetune.lazy) learns the deadline through its optional ``until``; its ``schedule``
    gets the starts before ``prepare``, so that every start's module builds while batch 0 is waited for,
    and its ``expect`` gets the competitive worlds' candidates before the sampler's turn.

    ``storage`` (``--storage``): the study lives in that database, a winner stored there is used
    instead of a search, and the winner named here is stored there (the first writer's is kept).

    ``plan`` overrides the planner's choice (tests use it to search a fault-injection family).
    ``prepared`` (``prepare(spec, plan)``): the plan, rendered, made once by a caller of several shapes
    (deploy): rendering is most of the time a stored winner takes to find. ``make_bench`` is called
    only where a shape is searched.
    ``reporter`` shows progress (default: plain lines through ``echo``).
    """
    reporter = reporter or PlainReporter(echo)
    echo = reporter.line
    start = time.perf_counter()
    prepared = prepared or prepare(spec, plan)
    plan, rendered, space = prepared.plan, prepared.rendered, prepared.space
    key, fields = shape_key(spec, shape, machine, rendered.source_hash)
    entry = cache.load(key)
    if storage is not None and not force:
        entry = pull_winner(storage, cache, key, fields, entry)
    if entry is not None and entry.winner is not None and not force:
        return ShapeResult(shape=shape, key=key, status="cached", candidate=entry.winner["candidate"],
                           time_ms=entry.winner["time_ms"], eager_ms=entry.winner.get("eager_ms"),
                           counts=_counts(entry), seconds=time.perf_counter() - start,
                           shown=space.relevant(entry.winner["candidate"]))
    trials = trials or spec.search.trials
    timeout = timeout or spec.search.timeout
    budget_end = time.monotonic() + budget_s if budget_s is not None else math.inf
    facts = shape_facts(spec, plan, shape, machine.capability)
    excluded = spec.search.exclude_worlds
    memo: dict = {}  # space.violations' per family verdicts at these facts
    feasible = [c for c in space.all() if not space.violations(c, facts, memo) and not _left_out(c, excluded)]
    study = _study(cache, key, trials, spec.search.seed, storage)
    bench = make_bench(plan, shape)
    until = getattr(bench, "until", None)  # a benchmarker that builds per batch (lazy.py): the deadline
    schedule = getattr(bench, "schedule", None)  # ... and the order of its batches
    if until is not None and budget_s is not None:
        until(budget_end)
    if schedule is not None and feasible:  # every start's module builds from now on, batch 0 first
        done = set() if force else _tried(study, space)
        schedule([c for c in _starts(space, feasible) if candidate_key(c) not in done] or feasible[:1])
        expect = getattr(bench, "expect", None)
        if expect is not None and len(feasible) <= trials:  # a small space is tried whole: a module a world
            expect([c for c in feasible if candidate_key(c) not in done])
    prepare_start = time.perf_counter()
    bench.prepare()
    timings = {"prepare_s": time.perf_counter() - prepare_start}
    evaluated = set() if force else _evaluated(study, space)
    known = set() if force else _recover_lost(study, space, cache, key, fields, bench, echo, timings)
    if known is not None:  # outcomes lost and no good one recovered: what the entry lost is searched again
        evaluated &= known
    remaining = trials - len(evaluated)
    if force:  # a forced search names its own winner, even a slower one than a stale entry's
        cache.update(key, fields, lambda e: setattr(e, "winner", None))
    label = f"{spec.name} {list(shape)}"
    objective = _Objective(space, facts, bench, cache, key, fields, force, reporter, max(remaining, 0), label,
                           excluded)
    objective.seen |= evaluated  # a resumed search does not spend budget on what ran before
    tried = set() if force else _tried(study, space)
    if known is not None:
        tried &= known
    if len(feasible) <= remaining:
        queue = [c for c in feasible if candidate_key(c) not in tried]  # small space: try all of it
    else:
        queue = [c for c in _starts(space, feasible) if candidate_key(c) not in tried]
    search_start = time.perf_counter()
    deadline = min(time.monotonic() + timeout, budget_end)
    if until is not None:
        until(deadline)

    def run(queued: list[Candidate], budget: int) -> None:
        """Trials up to ``budget`` (the queued first) while budget and time are left."""
        for candidate in (schedule(queued) if schedule is not None and queued else queued):
            study.enqueue_trial(candidate)
        left = deadline - time.monotonic()
        if left <= 0 and objective.evaluated == 0 and queued and objective.total > 0:
            # Past the budget before the first trial (batch 0 built late): its first candidate, the best so far.
            study.optimize(objective, n_trials=1, catch=(), gc_after_trial=False)
            return
        if budget > 0 and left > 0 and objective.evaluated < objective.stop_at:
            study.optimize(objective, n_trials=budget, timeout=left, catch=(), gc_after_trial=False,
                           callbacks=[objective.stop_when_done])

    if remaining > 0 and feasible:
        reporter.search_started(label, objective.total, timeout)
        run(queue, len(queue))  # all of a small space; else the starts
        if len(feasible) > remaining:
            entry = cache.load(key)
            outcomes, done = (entry.outcomes if entry else {}), _tried(study, space)
            neighbours = _world_neighbours(outcomes, feasible, done, random.Random(spec.search.seed),
                                           (objective.total - objective.evaluated) // 3)
            expect = getattr(bench, "expect", None)  # a benchmarker that builds per batch (lazy.py): what may come
            if schedule is not None and expect is not None and objective.evaluated < objective.total:
                if neighbours:
                    schedule(neighbours)  # their small modules first; then the competitive worlds' rest,
                expect(_sampler_worlds(outcomes, feasible, done))  # building while the neighbours are timed
            run(neighbours, len(neighbours))
            objective.stop_at = objective.total - int(POLISH_SHARE * objective.total)
            run([], remaining * 20)  # the sampler's; infeasible suggestions are free
            objective.stop_at = objective.total
            rng = random.Random(spec.search.seed)
            while objective.evaluated < objective.total and time.monotonic() < deadline:
                centre = _fastest(cache, key)
                near = _polish(centre, feasible, _tried(study, space), rng, objective.total - objective.evaluated)
                if not near:
                    break
                if schedule is not None:
                    schedule(near)  # their modules first, in this order
                for candidate in near:  # one at a time: re-centred as soon as one beats the centre
                    run([candidate], 1)
                    if _fastest(cache, key) != centre:
                        break
            run([], remaining * 20)  # a local optimum before the budget's end: the rest is the sampler's again
        reporter.search_finished(label)
    timings["search_s"] = time.perf_counter() - search_start
    timings.update(objective.timings)
    eager = bench.eager_ms()
    final_start = time.perf_counter()
    floor = next((c for c in _starts(space, feasible) if _world_of(c).launch == "eager"), None)
    result = _name_winner(cache, key, fields, bench, eager, rendered.name, space, echo, floor)
    if storage is not None and result.status == "tuned":
        shared = push_winner(storage, cache, key, fields, replace=force)
        result.candidate, result.time_ms = shared.winner["candidate"], shared.winner["time_ms"]
    timings["final_s"] = time.perf_counter() - final_start
    result.shape, result.timings, result.seconds = shape, timings, time.perf_counter() - start
    result.shown = space.relevant(result.candidate) if result.candidate else None
    return result


def _world_of(candidate: Candidate) -> Any:
    """The world (fusetune.worlds) that runs ``candidate``."""
    return WORLDS[candidate.get("producer.impl", DEFAULT_WORLD)]


def _left_out(candidate: Candidate, excluded: tuple[str, ...]) -> list[str]:
    """Why the config's search.exclude_worlds leaves the candidate out (one reason, or none)."""
    impl = candidate.get("producer.impl", DEFAULT_WORLD)
    return [f"search.exclude_worlds leaves the {impl} world out"] if impl in excluded else []


def _recover_lost(study: optuna.Study, space: PlanSpace, cache: Cache, key: str, fields: dict[str, Any],
                  bench: Benchmarker, echo: Callable[[str], None], timings: dict[str, float]) -> set[str] | None:
    """Where the study holds finished trials whose outcomes the cache entry lacks (the entry was
    unreadable, deleted or rewritten), re-verify and re-time the study's best few candidates so that a
    winner can still be named. Returns None if nothing was lost or a good outcome is known again; else
    the candidate keys the entry knows, so that the rest is searched again instead of counted as done.
    """
    entry = cache.load(key)
    outcomes = dict(entry.outcomes) if entry else {}
    lost = _evaluated(study, space) - set(outcomes)
    if not lost:
        return None
    import optuna

    start = time.perf_counter()
    best: dict[str, Candidate] = {}
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    for trial in sorted((t for t in complete if t.value is not None), key=lambda t: t.value):
        candidate = space.canonical(trial.params)
        best.setdefault(candidate_key(candidate), candidate)
    redo = [(ckey, c) for ckey, c in best.items() if ckey in lost][:RETIME_TOP]
    echo(f"  the cache entry lacks {len(lost)} outcomes its study holds"
         + (f": re-verifying the study's best {len(redo)} candidates" if redo else ""))
    for ckey, candidate in redo:
        outcome = bench.evaluate(candidate)
        cache.record(key, fields, ckey, {**outcome, "candidate": candidate})
        outcomes[ckey] = outcome
    timings["recover_s"] = time.perf_counter() - start
    if any(o.get("status") == "ok" for o in outcomes.values()):
        return None
    echo("  no good outcome is known: searching again")
    return set(outcomes)


def _world_neighbours(outcomes: dict[str, dict[str, Any]], feasible: list[Candidate], tried: set[str],
                      rng: random.Random, cap: int) -> list[Candidate]:
    """Untried feasible neighbours (one choice changed) of each competitive world's best candidate so
    far, the fastest world's first, at most ``cap`` in all: see COMPETITIVE."""
    best = _best_by_world(outcomes)
    if not best or cap <= 0:
        return []
    fastest = min(time_ms for time_ms, _ in best.values())
    chosen: list[Candidate] = []
    for impl, (time_ms, centre) in sorted(best.items(), key=lambda item: item[1][0]):
        if time_ms > COMPETITIVE * fastest:
            continue
        near = [c for c in _untried_neighbours(centre, feasible, tried) if c.get("producer.impl", DEFAULT_WORLD) == impl]
        rng.shuffle(near)
        chosen += near[:NEIGHBOURS_PER_WORLD]
    return chosen[:cap]


def _fastest(cache: Cache, key: str) -> Candidate | None:
    """The fastest ok candidate of ``key``'s outcomes so far (None before the first)."""
    entry = cache.load(key)
    best = _best_by_world(entry.outcomes if entry else {})
    return min(best.values(), key=lambda item: item[0])[1] if best else None


def _polish(centre: Candidate | None, feasible: list[Candidate], tried: set[str], rng: random.Random,
            cap: int) -> list[Candidate]:
    """Untried feasible neighbours (one choice changed) of ``centre``, the fastest candidate so far, in
    ``rng``'s order, at most ``cap``: see POLISH_SHARE."""
    if centre is None or cap <= 0:
        return []
    near = _untried_neighbours(centre, feasible, tried)
    rng.shuffle(near)
    return near[:cap]


def _untried_neighbours(centre: Candidate, feasible: list[Candidate], tried: set[str]) -> list[Candidate]:
    """The feasible candidates not yet tried that differ from ``centre`` in one choice, in ``feasible``'s order."""
    return [c for c in feasible if candidate_key(c) not in tried and sum(c.get(k) != v for k, v in centre.items()) == 1]


def _starts(space: PlanSpace, feasible: list[Candidate]) -> list[Candidate]:
    """A known-good start for every template and producer choice: the declared defaults of each world
    the plan offers (cuDNN in each layout and form, the convolution inside the kernels), where feasible
    here, the default world's first. The producer's choices dominate the time and cost no build."""
    nearest = {candidate_key(c): c for c in (_nearest(s, feasible) for s in space.producer_starts()) if c is not None}
    return list(nearest.values())


def _best_by_world(outcomes: dict[str, dict[str, Any]]) -> dict[str, tuple[float, Candidate]]:
    """Each world's fastest ok outcome so far: (ms, candidate)."""
    best: dict[str, tuple[float, Candidate]] = {}
    for outcome in outcomes.values():
        if outcome["status"] == "ok":
            impl = outcome["candidate"].get("producer.impl", DEFAULT_WORLD)
            if impl not in best or outcome["time_ms"] < best[impl][0]:
                best[impl] = (outcome["time_ms"], outcome["candidate"])
    return best


def _sampler_worlds(outcomes: dict[str, dict[str, Any]], feasible: list[Candidate],
                    tried: set[str]) -> list[Candidate]:
    """The untried feasible candidates of every competitive world (within COMPETITIVE of the fastest so
    far), the fastest world's first: where the sampler's suggestions will mostly fall, built ahead of them
    (lazy.Batches.expect). A world already beaten by more than that never has its rest built ahead."""
    best = _best_by_world(outcomes)
    if not best:
        return []
    fastest = min(time_ms for time_ms, _ in best.values())
    order = [impl for impl, (time_ms, _) in sorted(best.items(), key=lambda item: item[1][0])
             if time_ms <= COMPETITIVE * fastest]
    rank = {impl: n for n, impl in enumerate(order)}
    chosen = [c for c in feasible if c.get("producer.impl", DEFAULT_WORLD) in rank and candidate_key(c) not in tried]
    return sorted(chosen, key=lambda c: rank[c.get("producer.impl", DEFAULT_WORLD)])


def _nearest(start: Candidate, feasible: list[Candidate]) -> Candidate | None:
    """``start`` if feasible, else the feasible candidate of the same producer choice that differs
    from it in the fewest choices (a default's split may be too large for a small shape)."""
    producer = {k: v for k, v in start.items() if k.startswith("producer.")}
    same = [c for c in feasible if all(c.get(k) == v for k, v in producer.items())]
    if not same:
        return None
    return min(same, key=lambda c: sum(c[k] != v for k, v in start.items()))


def _name_winner(cache: Cache, key: str, fields: dict[str, Any], bench: Benchmarker, eager: float | None,
                 module: str, space: PlanSpace, echo: Callable[[str], None],
                 floor: Candidate | None = None) -> ShapeResult:
    """Re-time the best few head to head, confirm the fastest on fresh inputs, cache it.

    ``floor`` (the eager world's candidate, where the search may pick it) is always among those re-timed,
    evaluated now if the search never reached it: a search cut short by its budget, or whose first timing of
    PyTorch's forward was unlucky, must not hand back kernels slower than the model's own ops."""
    entry = cache.load(key) or Entry(key=key, fields=fields)
    oks = sorted((o for o in entry.outcomes.values() if o["status"] == "ok"), key=lambda o: o["time_ms"])
    top = oks[:RETIME_TOP]
    if floor is not None and all(o["candidate"] != floor for o in top):
        known = entry.outcomes.get(candidate_key(floor))
        if known is None:
            try:
                known = {**bench.evaluate(floor), "candidate": floor}
            except Deferred:  # a benchmarker with nothing built to run it: what was timed decides
                known = None
            if known is not None:
                cache.record(key, fields, candidate_key(floor), known)
        if known is not None and known["status"] == "ok":
            top.append(known)
    rounds: list[list[dict[str, Any]]] = [[] for _ in top]
    for _ in range(RETIME_ROUNDS):  # interleaved: a slow moment of the host falls on one round, not one candidate
        for times, outcome in zip(rounds, top):
            if all(t["status"] == "ok" for t in times):
                times.append(bench.evaluate(outcome["candidate"]))
    retimed: list[tuple[float, Candidate]] = []
    said: list[str] = []
    for times, outcome in zip(rounds, top):
        again = _best_round(times)
        if again["status"] == "ok":  # ranked by the new time alone: a lucky first timing does not carry over
            retimed.append((again["time_ms"], outcome["candidate"]))
        said.append(_retime_text(outcome, again))
    if said:  # where a world's two timings disagree, the user sees why the search's best is not the winner
        echo(f"  re-timed the best {len(said)}: " + ", ".join(said))
    for time_ms, candidate in sorted(retimed, key=lambda item: item[0]):
        check = bench.confirm(candidate)
        if check["status"] != "ok":
            echo(f"  candidate {candidate_key(candidate)} failed on fresh inputs: {check.get('log', '')}")
            cache.record(key, fields, candidate_key(candidate), {**check, "candidate": candidate})
            continue
        winner = {"candidate": candidate, "variant": space.stage_values(candidate), "time_ms": time_ms,
                  "eager_ms": eager, "module": module, "error_rel": check.get("error_rel"),
                  "eager_error_rel": check.get("eager_error_rel")}

        def keep_best(e: Entry) -> None:
            # Another search of the same key may have finished first: keep the faster winner.
            if e.winner is None or e.winner["time_ms"] > time_ms:
                e.winner = winner
        entry = cache.update(key, fields, keep_best)
        best = entry.winner or winner
        return ShapeResult(shape=(), key=key, status="tuned", candidate=best["candidate"], time_ms=best["time_ms"],
                           eager_ms=eager, counts=_counts(entry))
    return ShapeResult(shape=(), key=key, status="failed", eager_ms=eager, counts=_counts(entry),
                       message="no candidate passed verification")


def _best_round(times: list[dict[str, Any]]) -> dict[str, Any]:
    """A candidate's re-timing: its first failed round where one failed (a failure is never outvoted), else its
    fastest."""
    failed = [t for t in times if t["status"] != "ok"]
    return failed[0] if failed else min(times, key=lambda t: t["time_ms"])


def _retime_text(first: dict[str, Any], again: dict[str, Any]) -> str:
    """``cudnn_fused 0.0980 then 0.0954 ms``: a candidate's world, its search time and its time again."""
    world = first["candidate"].get("producer.impl", DEFAULT_WORLD)
    now = f"{again['time_ms']:.4f} ms" if again["status"] == "ok" else again["status"]
    return f"{world} {first['time_ms']:.4f} then {now}"


def _counts(entry: Entry) -> dict[str, int]:
    counts: dict[str, int] = {}
    for outcome in entry.outcomes.values():
        counts[outcome["status"]] = counts.get(outcome["status"], 0) + 1
    return counts


def workspace_words(plan: Plan, shape: Shape) -> int:
    """Words of the largest workspace a world of the plan allocates beside the chain's tensors: the
    K-tiled kernels' packed weights, pivots and zero-padded input (wide.cuh.j2's FtWideWorkspace, with
    a spatial reduction's partials at 32 blocks a plane), and the spectral world's input spectrum
    (complex, through cuFFT) and its weights' spectrum (model.py)."""
    spec, conv = plan.spec, plan.spec.producer.geometry()
    out = spec.producer.out_shape(shape)
    N, C = out[0], out[1]
    spatial = (1,) * (5 - len(out)) + tuple(out[2:])
    words = 0
    if "gemm_wide" in plan.impl_stages:  # wide_stats or wide_main
        d, h, _ = (axis.extent(size) for axis, size in zip(wide_axes(conv), spatial))
        padded = N * wide_cin_padded(conv["cin"]) * d * h * wide_row_words(conv, spatial[2])
        words = wide_workspace_words(conv) + N * C + padded + N * C * 32
    if "spectral" in plan.impl_stages:
        bins = spatial[0] * spatial[1] * (spatial[2] // 2 + 1)
        words = max(words, 2 * N * conv["cin"] * bins + 2 * conv["cin"] * C * bins + N * C * 33)
    return words


def check_memory(spec: ProblemSpec, shape: Shape, free_bytes: int) -> None:
    """Refuse, before allocating, a shape whose verification cannot fit in GPU memory.

    Verification holds the chain in float64 and float32 at once: about 3x the float32 bytes of
    every intermediate tensor, and beside them the largest workspace of a world the plan offers;
    twice over for safety.
    """
    elements = math.prod(shape) + sum(math.prod(s) for s in spec.shapes_through(shape))
    need = (elements * 3 + workspace_words(make_plan(spec), shape)) * 4 * 2
    if need > free_bytes:
        raise FusetuneError(f"{spec.path}: shape {list(shape)} needs about {need / 2**30:.1f} GiB of GPU memory to "
                            f"verify and time, but only {free_bytes / 2**30:.1f} GiB are free")

