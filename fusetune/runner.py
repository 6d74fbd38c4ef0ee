"""The real benchmarker: builds a plan's module and drives a GPU worker process.

All variants live in one module, built once per plan. If that build fails, each candidate
gets a module of its own variants only, so a variant that does not compile costs itself.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
from typing import Any

from fusetune.build import BuildResult, build, build_many
from fusetune.cache import Cache
from fusetune.codegen import plan_space, render
from fusetune.errors import FusetuneError
from fusetune.ops import Shape
from fusetune.plan import Plan
from fusetune.progress import Reporter
from fusetune.search import Machine
from fusetune.space import Candidate
from fusetune.worker import Worker
from fusetune.worlds import DEFAULT, WORLDS, World

#: Seconds for a worker to build the float64 reference of a shape (one per module and shape).
OPEN_TIMEOUT = 600.0
#: When the module of all variants fails to build, up to this many one-variant modules are
#: built at once, in parallel, rather than one by one as candidates ask for them.
PREBUILD_ISOLATED = 16


class GpuBenchmarker:
    def __init__(self, plan: Plan, shape: Shape, cache: Cache, machine: Machine, worker: Worker, *,
                 job_timeout: float = 60.0, build_timeout: float = 900.0, open_timeout: float = OPEN_TIMEOUT,
                 reps: int = 20, force: bool = False, echo=print, reporter: Reporter | None = None) -> None:
        self.plan, self.shape, self.cache, self.machine, self.worker = plan, shape, cache, machine, worker
        self.job_timeout, self.build_timeout, self.reps, self.echo = job_timeout, build_timeout, reps, echo
        self.force = force  # rebuild sources whose build failed before
        self.open_timeout = open_timeout
        self.reporter = reporter  # shows a running build's heartbeat
        self.space = plan_space(plan)
        # The worker keeps one reference and its inputs for every module of this problem (evaluate.Session.rebound).
        canonical = json.dumps(plan.spec.canonical(), sort_keys=True, default=str)
        self.problem = hashlib.sha256(canonical.encode()).hexdigest()
        self.main: BuildResult | None = None
        self.isolated: dict[str, BuildResult] = {}
        self.timings = {"build_s": 0.0}

    def _build(self, only: dict[str, list[dict[str, Any]]] | None = None) -> BuildResult:
        start = time.perf_counter()
        result = build(render(self.plan, only), self.cache, timeout=self.build_timeout, arch=self.machine.capability,
                       force=self.force, reporter=self.reporter)
        self.timings["build_s"] += time.perf_counter() - start
        return result

    def prepare(self) -> None:
        self.main = self._build()
        what = "reused" if self.main.cached else f"built in {self.main.seconds:.1f} s"
        if not self.main.ok and self.main.cached:
            what = "failed before (--force builds it again)"
        if self.main.ok:
            self.echo(f"  module {self.main.name}: {what}")
            return
        self.echo(f"  module {self.main.name} failed to build; building variants on their own\n"
                  f"{self.main.log[-1500:]}")
        combos = list(itertools.product(*(f.variants() for f in self._kernel_families())))
        if len(combos) <= PREBUILD_ISOLATED:
            onlys = [{f.family: [v] for f, v in zip(self._kernel_families(), combo)} for combo in combos]
            start = time.perf_counter()
            results = build_many([render(self.plan, only) for only in onlys], self.cache,
                                 timeout=self.build_timeout, arch=self.machine.capability, force=self.force,
                                 reporter=self.reporter)
            self.timings["build_s"] += time.perf_counter() - start
            for only, result in zip(onlys, results):
                self.isolated[_ident(only)] = result

    def _kernel_families(self) -> list:
        """The stages with compiled variants: what a one-variant module restricts."""
        return [f for f in self.space.families if f.family in self.plan.stages and f.compile_params]

    def _module_for(self, candidate: Candidate) -> BuildResult:
        if self.main is not None and self.main.ok:
            return self.main
        stages = self.space.stage_values(candidate)
        only = {f.family: [{p.name: stages[f.family][p.name] for p in f.compile_params}]
                for f in self._kernel_families()}
        if _ident(only) not in self.isolated:
            self.isolated[_ident(only)] = self._build(only)
        return self.isolated[_ident(only)]

    def _job(self, kind: str, candidate: Candidate | None, module: BuildResult) -> dict[str, Any]:
        job: dict[str, Any] = {"kind": kind, "module_dir": str(module.module_dir), "build_dir": str(module.build_dir),
                               "shape": list(self.shape), "reps": self.reps, "arch": self.machine.capability,
                               "problem": self.problem, "timing": self.plan.spec.search.timing,
                               "input_shapes": [list(s) for s in self.plan.spec.input_shapes(self.shape)]}
        if candidate is not None:
            job["variant"] = self.space.stage_values(candidate)
        return job

    def _run(self, kind: str, candidate: Candidate | None) -> dict[str, Any]:
        module = self._module_for(candidate) if candidate is not None else self.main
        if module is None or not module.ok:
            return {"status": "compile_error", "log": module.log[-4000:] if module else "not built"}
        with self.cache.lock(f"gpu-{self.machine.gpu.replace(' ', '_')}-{os.environ.get('CUDA_VISIBLE_DEVICES', '')}"):
            # One job on a GPU at a time, across processes: two timings at once measure neither.
            opened = self._wait(self._job("open", None, module), None, self.open_timeout)
            if opened["status"] != "ok":
                if module is self.main:  # the shape itself cannot be set up: not this candidate's fault
                    raise FusetuneError(f"{self.plan.spec.path}: cannot prepare shape {list(self.shape)} on the "
                                        f"GPU ({opened['status']}): {opened.get('log', '')[-1500:]}")
                return opened
            return self._wait(self._job(kind, candidate, module), candidate, self.job_timeout + _warmup_s(candidate))

    def _wait(self, job: dict[str, Any], candidate: Candidate | None, timeout: float) -> dict[str, Any]:
        """One job in the evaluation process; one that lasts (the float64 reference of a large shape,
        torch.compile's max-autotune) shows that it is alive, as a running build does."""
        if self.reporter is None:
            return self.worker.run(job, timeout)
        with self.reporter.waiting(_job_label(job["kind"], candidate)):
            return self.worker.run(job, timeout)

    def evaluate(self, candidate: Candidate) -> dict[str, Any]:
        return _machine_refusal(candidate) or _clean(self._run("evaluate", candidate))

    def verify(self, candidate: Candidate) -> dict[str, Any]:
        """Verification alone, on the session's inputs (no timing)."""
        return _machine_refusal(candidate) or _clean(self._run("verify", candidate))

    def confirm(self, candidate: Candidate) -> dict[str, Any]:
        return _machine_refusal(candidate) or _clean(self._run("confirm", candidate))

    def eager_ms(self) -> float | None:
        if self.main is None or not self.main.ok:
            return None
        result = self._run("eager", None)
        return result.get("time_ms") if result["status"] == "ok" else None


#: What the evaluation process does in each kind of job, as a heartbeat line says it.
JOB_WORDS = {"open": "setting up the float64 reference and eager's error", "eager": "timing eager PyTorch",
             "evaluate": "verifying and timing", "verify": "verifying", "confirm": "timing again"}


def _job_label(kind: str, candidate: Candidate | None) -> str:
    """``verifying and timing inductor (torch.compile max-autotune)``: the job, and the candidate's world."""
    words, world = JOB_WORDS.get(kind, kind), _world(candidate)
    if world is None:
        return words
    return f"{words} {world.name}" + (f" (torch.compile {world.compile_mode})" if world.compile_mode else "")


def _world(candidate: Candidate | None) -> World | None:
    return WORLDS.get(candidate.get("producer.impl", DEFAULT)) if candidate is not None else None


def _warmup_s(candidate: Candidate | None) -> float:
    """What the candidate's world adds to the job timeout (World.warmup_s: a compiler's run at its first
    forward in the worker, torch.compile's max-autotune for inductor)."""
    world = _world(candidate)
    return world.warmup_s if world is not None else 0.0


def _machine_refusal(candidate: Candidate) -> dict[str, Any] | None:
    """An infeasible outcome, without a job, where this machine cannot run the candidate's world at all
    (World.machine_refusal: inductor without triton); None where it can."""
    world = _world(candidate)
    why = world.machine_refusal() if world is not None else None
    return {"status": "infeasible", "log": f"the {world.name} world on this machine: {why}"} if why else None


def _ident(only: dict[str, list[dict[str, Any]]]) -> str:
    return repr(sorted((stage, sorted(values[0].items())) for stage, values in only.items()))


def _clean(result: dict[str, Any]) -> dict[str, Any]:
    """Keep what belongs in the cache: status, time, errors, log."""
    return {k: v for k, v in result.items() if k != "restart"}


class LazyGpuBenchmarker(GpuBenchmarker):
    """The GPU benchmarker of ``fusetune search`` and ``fusetune.optimize``: no module of every variant; each
    candidate runs in the module of its batch (fusetune.lazy.Batches: built in a pool shared by the
    run's chains, cheapest batch first). The search calls ``schedule`` with the candidates it is about
    to try; a candidate whose module is not built by the deadline is deferred (search.Deferred)."""

    def __init__(self, plan: Plan, shape: Shape, cache: Cache, machine: Machine, worker: Worker, batches: Any,
                 **kwargs: Any) -> None:
        super().__init__(plan, shape, cache, machine, worker, **kwargs)
        self.batches = batches  # fusetune.lazy.Batches
        self.final = False  # naming the winner (after eager_ms): wait for any build, defer nothing

    def prepare(self) -> None:
        """No module of every variant: wait for batch 0 (submitted when the batches were made), so the
        search's time starts when its cheapest candidates can run."""
        self.main = self.batches.first_built()

    def schedule(self, queued: list[Candidate]) -> list[Candidate]:
        return self.batches.schedule(queued)

    def expect(self, candidates: list[Candidate]) -> int:
        return self.batches.expect(candidates)

    def until(self, deadline: float) -> None:
        """The search's deadline (time.monotonic): a module not built by then defers its candidate. An
        earlier deadline already set (optimize's share of its budget) stays."""
        self.batches.deadline = min(self.batches.deadline, deadline)

    def _module_for(self, candidate: Candidate) -> BuildResult:
        module = self.batches.module_for(candidate, final=self.final)
        if self.main is None and module.ok:
            self.main = module  # the module a failure to open the shape is blamed on the shape for
        return module

    def eager_ms(self) -> float | None:
        self.final = True
        self.main = self.main or self.batches.first_built()
        return super().eager_ms()


class SearchFactory:
    """``fusetune search``'s benchmarker factory (search.BenchmarkerFactory): each first region's search runs
    its candidates batch by batch (LazyGpuBenchmarker, fusetune.lazy.Batches), as ``fusetune.optimize`` does,
    with one build pool for the whole command: trials start once the default world's defaults are built,
    the other starts' modules build meanwhile, and a world the starts left behind never has its variants
    built. A later region (no convolution: fusetune.later.prebuild builds its small module of every variant
    in the background) is searched in that module.

    ``lazy`` False: every search builds its module of every variant first (GpuBenchmarker), in one parallel
    nvcc run in which ninja keeps every core busy to the end: without a time budget, the full search's way.
    Batches serve a budget: they start trials early and leave what the budget cannot reach unbuilt."""

    def __init__(self, cache: Cache, machine: Machine, worker: Worker, *, force: bool = False,
                 job_timeout: float = 60.0, build_timeout: float = 900.0, open_timeout: float = OPEN_TIMEOUT,
                 echo=print, reporter: Reporter | None = None, jobs: int | None = None, lazy: bool = True) -> None:
        from fusetune.lazy import BuildPool

        self.cache, self.machine, self.worker, self.force, self.lazy = cache, machine, worker, force, lazy
        self.job_timeout, self.build_timeout, self.echo, self.reporter = job_timeout, build_timeout, echo, reporter
        self.open_timeout = open_timeout  # a deploy's lowers both timeouts to the time it has left
        self.pool = BuildPool(self.builder, jobs)
        self.batches: Any = None  # the last search's (fusetune.lazy.Batches)
        warm = getattr(worker, "warm", None)  # the evaluation process gets ready while the first module builds
        if warm is not None:
            warm()

    def builder(self, module: Any) -> BuildResult:
        """Build one batch's module (in a pool thread); with -v, a line of what it cost."""
        result = build(module, self.cache, timeout=self.build_timeout, arch=self.machine.capability, force=self.force,
                       reporter=self.reporter)
        if self.reporter is not None:
            what = "reused" if result.cached else f"built in {result.seconds:.1f} s" if result.ok else "failed to build"
            self.reporter.debug(f"  module {module.name} ({len(module.cuda_sources)} CUDA units): {what}")
        return result

    def __call__(self, plan: Plan, shape: Shape) -> GpuBenchmarker:
        from fusetune.lazy import Batches

        options = {"job_timeout": self.job_timeout, "build_timeout": self.build_timeout, "force": self.force,
                   "open_timeout": self.open_timeout, "echo": self.echo, "reporter": self.reporter}
        if self.batches is not None:  # the last search is over: its builds not started yet never start
            self.batches.cancel_pending()
            self.batches = None
        if not self.lazy or not getattr(plan.spec.producer, "convolves", True):
            return GpuBenchmarker(plan, shape, self.cache, self.machine, self.worker, **options)
        self.batches = Batches(plan, self.pool, math.inf, ahead=True)
        return LazyGpuBenchmarker(plan, shape, self.cache, self.machine, self.worker, self.batches, **options)

    def close(self) -> None:
        """Cancel the builds not started and stop those running (modules no search reached this time)."""
        from fusetune.build import stop_running

        self.pool.close()
        stop_running()

    def __enter__(self) -> "SearchFactory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
