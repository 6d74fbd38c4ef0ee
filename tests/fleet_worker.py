"""Child-process entry points for tests/test_fleet.py: a fleet worker with a fake GPU and a FakeBench.

Each child is one "host": its own cache folder, a GPU type given by name (no CUDA), and the
database URL. What it did goes to ``out`` as JSON when it ends (a killed child writes nothing).
"""
from __future__ import annotations

import json
from pathlib import Path

from fake_handlers import MACHINE_FIELDS, FakeBench

#: The lease and trial heartbeat in the tests: a beat a second, dead after two without one.
HEARTBEAT = (1, 2)


def run_worker(url: str, cache_root: str, gpu: str, trials: int, delay: float, out: str,
               heartbeat: tuple[int, int] = HEARTBEAT) -> None:
    from fusetune.cache import Cache
    from fusetune.fleet import work
    from fusetune.search import Machine
    from fusetune.storage import Heartbeat, Storage

    log = Path(out).with_suffix(".log")
    storage = Storage(url, Heartbeat(*heartbeat))
    machine = Machine(gpu, *MACHINE_FIELDS[1:])
    bench = FakeBench(delay=delay)

    def echo(line: str) -> None:
        with open(log, "a") as handle:
            handle.write(line + "\n")
    summary = work(storage, machine, Cache(cache_root), bench.factory, trials=trials, echo=echo)
    Path(out).write_text(json.dumps({"done": summary.done, "failed": summary.failed, "lost": summary.lost,
                                     "db_errors": summary.db_errors, "gpu": gpu}))


def hang_in_evaluator(pid_file: str) -> None:
    """A tuning process whose evaluation process hangs in a job (a kernel that never ends): writes that
    process's pid to ``pid_file``, then waits for the answer that never comes."""
    import threading
    import time

    from fusetune.worker import Worker

    worker = Worker(target="tests.fake_handlers:handle")

    def report() -> None:
        while worker._proc is None:
            time.sleep(0.01)
        Path(pid_file).write_text(str(worker._proc.pid))
    threading.Thread(target=report, daemon=True).start()
    worker.run({"kind": "hang"}, timeout=600)
