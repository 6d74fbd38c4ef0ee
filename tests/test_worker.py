"""The killable worker: a crash, a hang, an exception or a sticky error costs one job, never the next."""
from __future__ import annotations

import time

import pytest

from fusetune.worker import Worker

from conftest import ROOT

TARGET = "tests.fake_handlers:handle"


@pytest.fixture
def worker(monkeypatch):
    # The child is spawned with the parent's sys.path: make `tests.fake_handlers` importable there
    # however pytest was started.
    monkeypatch.syspath_prepend(str(ROOT))
    w = Worker(target=TARGET)
    yield w
    w.close()


def _ok(worker: Worker, value: int = 0) -> dict:
    result = worker.run({"kind": "ok", "value": value}, timeout=30)
    assert result["status"] == "ok", result
    assert result["value"] == value
    return result


def test_ok_jobs_share_one_process(worker):
    first = _ok(worker, 1)
    second = _ok(worker, 2)
    assert first["pid"] == second["pid"]
    assert worker.restarts == 0


def test_crash_is_typed_and_the_next_job_runs(worker):
    before = _ok(worker)["pid"]
    result = worker.run({"kind": "crash"}, timeout=30)
    assert result["status"] == "crash"
    assert "worker died" in result["log"]
    assert worker.restarts == 1
    after = _ok(worker)["pid"]
    assert after != before
    assert worker.restarts == 1  # the replacement is counted once


def test_hang_times_out_and_the_next_job_runs(worker):
    before = _ok(worker)["pid"]
    start = time.monotonic()
    result = worker.run({"kind": "hang"}, timeout=1)
    elapsed = time.monotonic() - start
    assert result["status"] == "timeout"
    assert "worker killed" in result["log"]
    assert 1.0 <= elapsed < 10
    assert worker.restarts == 1
    assert _ok(worker)["pid"] != before
    assert worker.restarts == 1


def test_exception_is_a_crash_with_its_traceback(worker):
    before = _ok(worker)["pid"]
    result = worker.run({"kind": "raise"}, timeout=30)
    assert result["status"] == "crash"
    assert "Traceback (most recent call last)" in result["log"]
    assert "RuntimeError: fake handler failure: boom" in result["log"]
    assert "fake_handlers.py" in result["log"]
    assert worker.restarts == 1
    assert _ok(worker)["pid"] != before


def test_sticky_error_replaces_the_worker(worker):
    before = _ok(worker)["pid"]
    result = worker.run({"kind": "sticky"}, timeout=30)
    assert result["status"] == "crash" and result["log"] == "fake sticky CUDA error"
    assert result["pid"] == before  # the answer came from the old process ...
    assert worker.restarts == 1
    assert _ok(worker)["pid"] != before  # ... which was replaced before the next job


def test_bad_job_first_then_ok(worker):
    # a worker whose very first job crashes still recovers
    assert worker.run({"kind": "crash"}, timeout=30)["status"] == "crash"
    _ok(worker)
    assert worker.restarts == 1


def test_every_kind_of_failure_in_a_row(worker):
    pids = {_ok(worker)["pid"]}
    for kind, timeout, status in [("crash", 30, "crash"), ("hang", 1, "timeout"), ("raise", 30, "crash"),
                                  ("sticky", 30, "crash")]:
        assert worker.run({"kind": kind}, timeout=timeout)["status"] == status, kind
        pids.add(_ok(worker)["pid"])
    assert len(pids) == 5
    assert worker.restarts == 4


def test_close_stops_the_process(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    with Worker(target=TARGET) as w:
        _ok(w)
        proc = w._proc
    assert not proc.is_alive()
    assert w._proc is None


def test_a_warm_up_runs_while_the_caller_works_and_its_process_serves_the_next_job(worker, monkeypatch):
    """Worker.warm returns at once; the next job reads its answer first and runs in the same process. A warm-up
    that fails (no usable GPU) costs nothing but that process: the next job runs in a fresh one."""
    start = time.monotonic()
    worker.warm()
    assert time.monotonic() - start < 1.0 and worker._warming
    first = _ok(worker, 1)
    assert not worker._warming and worker.restarts == 0 and _ok(worker, 2)["pid"] == first["pid"]
    worker.close()
    monkeypatch.setenv("FUSETUNE_FAKE_WARM_FAILS", "1")
    worker.warm()
    failed = worker._proc.pid
    assert _ok(worker, 3)["pid"] != failed
    worker.warm()  # still warming at close: stopped at once
    start = time.monotonic()
    worker.close()
    assert time.monotonic() - start < 4.0 and worker._proc is None
