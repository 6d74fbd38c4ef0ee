"""Fakes for optimize's budget (fusetune.lazy) without nvcc or a GPU: a builder whose build costs simulated
seconds per CUDA unit (real sleeps, so budgets and threads behave as on a real machine), benchmarkers that
build per batch (as LazyGpuBenchmarker), and a candidate's fake time."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from fusetune.build import BuildResult
from fusetune.codegen import RenderedModule
from fusetune.space import Candidate, candidate_key
from fusetune.worlds import WORLDS

from fake_handlers import fake_time

#: The fake time of a candidate of a world that runs the reference (eager, inductor): slower than every
#: kernel's (fake_handlers.fake_time: [1, 2) ms), faster than eager_ms, so that kernels win.
REFERENCE_MS = 3.0


def kernel_first_time(candidate: Mapping[str, Any]) -> float:
    world = WORLDS[candidate.get("producer.impl", "cudnn")]
    return REFERENCE_MS if world.runs_reference else fake_time(candidate)


class FakeBuilder:
    """Builds a module by sleeping ``unit_s`` per CUDA unit; records what it built and the most builds at once."""

    def __init__(self, unit_s: float) -> None:
        self.unit_s = unit_s
        self.built: list[tuple[str, int]] = []  # (module name, units), in the order builds finished
        self.finished_at: list[float] = []  # time.monotonic() at each build's end, in that order
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, module: RenderedModule) -> BuildResult:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        seconds = self.unit_s * len(module.cuda_sources)
        time.sleep(seconds)
        with self._lock:
            self.running -= 1
            self.built.append((module.name, len(module.cuda_sources)))
            self.finished_at.append(time.monotonic())
        where = Path("/nonexistent") / module.name
        return BuildResult(module.name, True, seconds, "", where, where)


class FailingBuilder(FakeBuilder):
    """A FakeBuilder whose build fails (as a compiler error) for the modules ``fails`` picks."""

    def __init__(self, fails: Callable[[RenderedModule], bool], unit_s: float = 0.0) -> None:
        super().__init__(unit_s)
        self.fails = fails

    def __call__(self, module: RenderedModule) -> BuildResult:
        result = super().__call__(module)
        if self.fails(module):
            return BuildResult(module.name, False, result.seconds, "fake: error: does not compile",
                               result.module_dir, result.build_dir)
        return result


class _Bench:
    """The parts both fake benchmarkers share: fake times, what was evaluated, eager's time."""

    def __init__(self, owner: "FakeLazyFactory", plan: Any) -> None:
        self.owner, self.plan, self.final = owner, plan, False

    def _time(self, candidate: Candidate) -> dict[str, Any]:
        time.sleep(self.owner.eval_s)
        self.owner.evaluated.setdefault(self.plan.spec.name, []).append(candidate_key(candidate))
        return {"status": "ok", "time_ms": kernel_first_time(candidate), "error_rel": 1e-7}

    def confirm(self, candidate: Candidate) -> dict[str, Any]:
        return {"status": "ok", "error_rel": 1e-7, "eager_error_rel": 2e-7}

    def eager_ms(self) -> float:
        self.final = True
        return 4.0


class _LazyBench(_Bench):
    def __init__(self, owner: "FakeLazyFactory", plan: Any, batches: Any) -> None:
        super().__init__(owner, plan)
        self.batches = batches

    def prepare(self) -> None:
        self.batches.first_built()  # as LazyGpuBenchmarker: the search's time starts once batch 0 is built

    def schedule(self, queued: list[Candidate]) -> list[Candidate]:
        return self.batches.schedule(queued)

    def evaluate(self, candidate: Candidate) -> dict[str, Any]:
        self.batches.module_for(candidate, final=self.final)  # search.Deferred where it is not built in time
        return self._time(candidate)


class FakeLazyFactory:
    """optimize's ``benchmarker``: a budgeted factory (optimizer.BudgetedFactory) whose builds are ``builder``'s."""

    budgeted = True

    def __init__(self, builder: FakeBuilder, eval_s: float = 0.005) -> None:
        self.builder, self.eval_s = builder, eval_s
        self.evaluated: dict[str, list[str]] = {}  # config name -> candidate keys evaluated, in order

    def __call__(self, plan: Any, shape: Any, *, batches: Any) -> _LazyBench:
        return _LazyBench(self, plan, batches)



class FakeWorker:
    """fusetune.worker.Worker's ``run`` without a GPU: opens any module, times a variant by its hash (a
    reference world's slower, eager slowest), verifies everything; ``jobs`` keeps (kind, module folder name,
    variant) of each job."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, str, Any]] = []
        self.at: list[float] = []  # time.monotonic() at each job's start

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        variant = job.get("variant")
        self.jobs.append((job["kind"], Path(job["module_dir"]).name, variant))
        self.at.append(time.monotonic())
        if job["kind"] == "eager":
            return {"status": "ok", "time_ms": 4.0}
        if job["kind"] == "open":
            return {"status": "ok"}
        flat = {f"{stage}.{k}": v for stage, values in variant.items() for k, v in values.items()}
        return {"status": "ok", "time_ms": kernel_first_time(flat), "error_rel": 1e-7, "eager_error_rel": 2e-7}

    def close(self) -> None:
        pass


def fake_build(builder: FakeBuilder) -> Callable[..., BuildResult]:
    """fusetune.build.build's stand-in (monkeypatched into fusetune.runner): the module's files written where
    build writes them (the worker reads its folder's name), then ``builder``'s simulated build."""

    def build(module: RenderedModule, cache: Any, **_: Any) -> BuildResult:
        module.write(cache.module_dir(module.name))
        return builder(module)
    return build
