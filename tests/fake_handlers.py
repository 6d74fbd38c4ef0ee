"""Fakes importable by spawned child processes: worker job handlers and a fake benchmarker.

Kept free of torch so a child process starts fast. Imported by the tests as ``fake_handlers``
(``tests/`` is on ``sys.path`` under pytest) and by ``Worker`` children as ``tests.fake_handlers``.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from fusetune.space import Candidate, candidate_key

# -- worker job handlers ---------------------------------------------------------------------


def handle(job: dict[str, Any]) -> dict[str, Any]:
    """``fusetune.worker.Worker(target="tests.fake_handlers:handle")``; the job's ``kind`` picks a behaviour."""
    kind = job["kind"]
    if kind == "ok":
        return {"status": "ok", "pid": os.getpid(), "value": job.get("value")}
    if kind == "warm":  # fusetune.worker.Worker.warm's job; a value in the environment makes it fail
        if os.environ.get("FUSETUNE_FAKE_WARM_FAILS"):
            return {"status": "launch_error", "log": "fake: no GPU", "restart": True}
        return {"status": "ok", "pid": os.getpid()}
    if kind == "crash":
        os._exit(3)  # like a segfault: no answer, no cleanup
    if kind == "hang":
        while True:  # like a kernel that never finishes
            time.sleep(60)
    if kind == "raise":
        raise RuntimeError("fake handler failure: boom")
    if kind == "sticky":
        return {"status": "crash", "restart": True, "pid": os.getpid(), "log": "fake sticky CUDA error"}
    raise AssertionError(f"unknown fake job kind {kind!r}")


# -- a fake benchmarker ----------------------------------------------------------------------


def fake_time(candidate: Mapping[str, Any]) -> float:
    """A deterministic, practically unique time in [1, 2) ms for each candidate of kernels, in [2, 3) for
    PyTorch's own forward (eager, torch.compile's), which a search always times before naming its winner:
    as on the chains tests model, the kernels win (a test of the opposite passes its own times)."""
    from fusetune.worlds import DEFAULT, WORLDS

    digest = hashlib.sha256(candidate_key(candidate).encode()).digest()
    floor = 2.0 if WORLDS[candidate.get("producer.impl", DEFAULT)].runs_reference else 1.0
    return floor + int.from_bytes(digest[:6], "big") / 2**48


class FakeBench:
    """Implements ``fusetune.search.Benchmarker`` without a GPU.

    * ``times``: candidate -> ms (default ``fake_time``);
    * ``failures``: candidate key -> status returned by ``evaluate`` instead of a time;
    * ``confirm_failures``: candidate keys whose ``confirm`` fails (wrong_result);
    * ``interrupt_after``: raise KeyboardInterrupt from the n-th ``evaluate`` of a search;
    * ``delay``: seconds each ``evaluate`` takes;
    * ``on_confirm``: called with each candidate ``confirm`` gets (to act as a concurrent search).

    ``calls`` logs ``(phase, kind, candidate key)``; the phase is "search" from ``prepare`` until
    ``eager_ms`` (which ``tune_shape`` calls once, right before naming a winner), then "final".
    """

    def __init__(self, *, times: Callable[[Mapping[str, Any]], float] = fake_time,
                 failures: Mapping[str, str] | None = None, confirm_failures: set[str] | frozenset[str] = frozenset(),
                 interrupt_after: int | None = None, delay: float = 0.0, eager: float = 4.0,
                 on_confirm: Callable[[Candidate], None] | None = None) -> None:
        self.times = times
        self.failures = dict(failures or {})
        self.confirm_failures = set(confirm_failures)
        self.interrupt_after = interrupt_after
        self.delay = delay
        self.eager = eager
        self.on_confirm = on_confirm
        self.phase = "idle"
        self.calls: list[tuple[str, str, str]] = []
        self.prepared = 0
        self.made = 0  # how many times the factory handed this bench out

    # the factory tune_shape takes: (plan, shape) -> benchmarker
    def factory(self, plan: Any, shape: Any) -> "FakeBench":
        self.made += 1
        self.plan, self.shape = plan, shape
        return self

    def prepare(self) -> None:
        self.prepared += 1
        self.phase = "search"

    def evaluate(self, candidate: Candidate) -> dict[str, Any]:
        key = candidate_key(candidate)
        if self.phase == "search" and self.interrupt_after is not None \
                and len(self.search_evaluations()) + 1 >= self.interrupt_after:
            self.interrupt_after = None
            self.calls.append((self.phase, "interrupted", key))
            raise KeyboardInterrupt
        self.calls.append((self.phase, "evaluate", key))
        if self.delay:
            time.sleep(self.delay)
        status = self.failures.get(key)
        if status is not None:
            return {"status": status, "log": f"fake {status} of {key}"}
        return {"status": "ok", "time_ms": self.times(candidate), "error_rel": 1e-7}

    def confirm(self, candidate: Candidate) -> dict[str, Any]:
        key = candidate_key(candidate)
        self.calls.append((self.phase, "confirm", key))
        if self.on_confirm is not None:
            self.on_confirm(candidate)
        if key in self.confirm_failures:
            return {"status": "wrong_result", "log": f"fake: {key} is wrong on fresh inputs", "error_rel": 0.5}
        return {"status": "ok", "error_rel": 1e-7, "eager_error_rel": 2e-7}

    def eager_ms(self) -> float | None:
        self.phase = "final"
        return self.eager

    # -- what happened ---------------------------------------------------------------------
    def search_evaluations(self) -> list[str]:
        """Candidate keys that ``evaluate`` ran (and returned) during searches, in order."""
        return [k for phase, kind, k in self.calls if phase == "search" and kind == "evaluate"]

    def interrupted(self) -> list[str]:
        return [k for _, kind, k in self.calls if kind == "interrupted"]


# -- run a search in a spawned process ------------------------------------------------------

MACHINE_FIELDS = ("FakeGPU", "9.0", "13.0", "2.13")


class SlowEvaluator:
    """Stands in for the evaluation process (fusetune.worker.Worker): the first job of each kind takes the
    seconds given for it (as the float64 reference is set up once per module and shape), the others
    none; each job is timed as it runs, and each answers ok in 1 ms."""

    def __init__(self, seconds: Mapping[str, float]) -> None:
        self.seconds, self.ran = dict(seconds), []  # ran: (kind, start, end)

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        start = time.monotonic()
        time.sleep(self.seconds.pop(job["kind"], 0.0))
        self.ran.append((job["kind"], start, time.monotonic()))
        return {"status": "ok", "time_ms": 1.0}

    def __enter__(self) -> "SlowEvaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

def tune_in_process(cache_root: str, config: str, shape: list[int], trials: int, out: str,
                    barrier: Any = None, delay: float = 0.002) -> None:
    """Child-process entry point: tune one shape with a FakeBench and write what happened to ``out``."""
    from fusetune.cache import Cache
    from fusetune.config import load_config
    from fusetune.search import Machine, tune_shape

    spec = load_config(config)
    cache = Cache(cache_root)
    bench = FakeBench(delay=delay)
    if barrier is not None:
        barrier.wait(timeout=60)  # start both searches together
    result = tune_shape(spec, tuple(shape), cache, Machine(*MACHINE_FIELDS), bench.factory, trials=trials,
                        echo=lambda line: None)
    Path(out).write_text(json.dumps({"status": result.status, "key": result.key, "candidate": result.candidate,
                                     "time_ms": result.time_ms, "evaluated": bench.search_evaluations()}))
