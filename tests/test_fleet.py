"""A fleet on a real PostgreSQL server (tests/pg.py): shared studies and winners, the job queue, workers
killed mid-job, the database restarted mid-run, two hosts of different GPU types. CPU only: each worker
is a process with its own cache folder (a host), a GPU type by name and a FakeBench."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL driver is not installed (pip install -e .[test])")

import optuna  # noqa: E402

from click.testing import CliRunner  # noqa: E402

from fusetune.cache import Cache  # noqa: E402
from fusetune.codegen import plan_space  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.space import candidate_key  # noqa: E402
from fusetune.cli import main  # noqa: E402
from fusetune.config import load_config  # noqa: E402
from fusetune.deploy import ensure_tuned  # noqa: E402
from fusetune import fleet  # noqa: E402
from fusetune.fleet import GpusError, Job, Queue, parse_gpus, search_on_gpus, visible_device  # noqa: E402
from fusetune.lifeline import PARENT_PID_ENV, child_env  # noqa: E402
from fusetune.search import Machine, tune_shape  # noqa: E402
from fusetune.storage import (WINNERS, Heartbeat, Storage, StorageError, engine_url, push_winner,  # noqa: E402
                              redact, usable_winner)

import pg  # noqa: E402
from conftest import SEEDS  # noqa: E402
from fake_handlers import MACHINE_FIELDS, FakeBench, SlowEvaluator  # noqa: E402
from fleet_worker import HEARTBEAT, hang_in_evaluator, run_worker  # noqa: E402

TRIALS = 5
#: The jobs: one per shape of this config (small shapes, quick to search with a FakeBench).
JOBS = Path(__file__).parent / "fleet" / "convt3d_small_shapes.yaml"
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def server():
    bin_dir, why = pg.find_bin_dir()
    if bin_dir is None:
        pytest.skip(why)
    srv = pg.PgServer(bin_dir)
    yield srv
    srv.close()


@pytest.fixture
def url(server) -> str:
    return server.fresh_database(f"t_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def storage(url):
    store = Storage(url, Heartbeat(*HEARTBEAT))
    yield store
    store.close()


def quiet(line: str) -> None:
    pass


def submit(storage: Storage, gpu: str, shapes: int = 4) -> list[int]:
    """Queue the first ``shapes`` shapes of JOBS for ``gpu``; the job ids."""
    queue = Queue(storage)
    spec = load_config(JOBS)
    assert queue.submit(spec, JOBS.read_text(), spec.shapes[:shapes], [gpu]) == (shapes, 0)
    return [j["id"] for j in queue.jobs() if j["gpu"] == gpu]


def start_workers(url: str, tmp_path: Path, gpus: list[str], delay: float, first: int = 0) -> list[tuple]:
    """One process per entry of ``gpus`` (its GPU type), each a host with its own cache; (process, out)."""
    out = []
    for i, gpu in enumerate(gpus, first):
        result = tmp_path / f"worker{i}.json"
        proc = SPAWN.Process(target=run_worker, args=(url, str(tmp_path / f"host{i}"), gpu, TRIALS, delay,
                                                      str(result)))
        proc.start()
        out.append((proc, result))
    return out


def wait_all(workers: list[tuple], timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    for proc, _ in workers:
        proc.join(timeout=max(1.0, deadline - time.monotonic()))
    for proc, _ in workers:
        if proc.is_alive():
            proc.kill()
    assert all(p.exitcode == 0 for p, _ in workers), [(p.exitcode, r.with_suffix(".log").read_text()
                                                       if r.with_suffix(".log").exists() else "") for p, r in workers]
    return [json.loads(r.read_text()) for _, r in workers]


def assert_each_done_once(storage: Storage, summaries: list[dict], ids: list[int], *, stale_failed: bool) -> None:
    """Every job done, marked so by exactly one worker, with a stored winner; and each job's study ran
    exactly its budget of distinct candidates: none lost to a dead worker, none counted twice. With
    ``stale_failed``, no trial is left running: a dead worker's was failed by the one that took its job
    (a trial cut off by a database restart may stay running, outcome counted, until a later search)."""
    jobs = {j["id"]: j for j in Queue(storage).jobs()}
    assert {i: jobs[i]["state"] for i in ids} == {i: "done" for i in ids}, [jobs[i]["message"] for i in ids]
    marked = [i for s in summaries for i in s["done"]]
    assert sorted(marked) == sorted(ids)
    winners = {w["key"]: w for w in storage.winners()}
    optuna_storage = storage.optuna_storage()
    space = plan_space(make_plan(load_config(JOBS)))
    for i in ids:
        key = jobs[i]["key"]
        assert key in winners and winners[key]["gpu"] == jobs[i]["gpu"]
        study = optuna.load_study(study_name=key, storage=optuna_storage)
        trials = study.get_trials()
        history = [f"{t.number} {t.state.name} {t.user_attrs.get('status')} {sorted(t.params.values(), key=str)} "
                   f"{'fixed' if 'fixed_params' in t.system_attrs else ''}" for t in trials]
        if stale_failed:
            assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING], history
        ran = {candidate_key(space.canonical(t.params)) for t in trials  # as the search counts them
               if t.user_attrs.get("status") not in (None, "infeasible")}
        assert len(ran) == TRIALS, "\n".join([str(i)] + history)


# -- the queue, workers and hosts ----------------------------------------------------------------

def test_two_hosts_drain_the_queue_each_taking_only_its_gpu_type(storage, url, tmp_path):
    ids_a = submit(storage, "FakeGPU-A")
    ids_b = submit(storage, "FakeGPU-B", shapes=2)
    assert len(ids_a) == 4 and len(ids_b) == 2
    # a second submit of the same config queues nothing new
    assert Queue(storage).submit(load_config(JOBS), JOBS.read_text(), load_config(JOBS).shapes[:2],
                                 ["FakeGPU-B"]) == (0, 2)
    summaries = wait_all(start_workers(url, tmp_path, ["FakeGPU-A", "FakeGPU-A", "FakeGPU-B"], delay=0.005))
    assert_each_done_once(storage, summaries, ids_a + ids_b, stale_failed=True)
    assert sorted(i for s in summaries if s["gpu"] == "FakeGPU-B" for i in s["done"]) == sorted(ids_b)
    assert sorted(i for s in summaries if s["gpu"] == "FakeGPU-A" for i in s["done"]) == sorted(ids_a)
    assert sum(bool(s["done"]) for s in summaries if s["gpu"] == "FakeGPU-A") == 2  # both A workers worked


def test_a_worker_killed_mid_job_leaves_it_to_another(storage, url, tmp_path):
    ids = submit(storage, "FakeGPU", shapes=2)
    [victim] = start_workers(url, tmp_path, ["FakeGPU"], delay=0.15)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not running_trials_with_a_heartbeat(storage):
        time.sleep(0.01)  # the victim is mid-trial, and optuna knows it is alive
    assert running_trials_with_a_heartbeat(storage)
    victim[0].kill()
    victim[0].join()
    summaries = wait_all(start_workers(url, tmp_path, ["FakeGPU"], delay=0.15, first=1))
    jobs = {j["id"]: j for j in Queue(storage).jobs()}
    assert max(jobs[i]["attempts"] for i in ids) == 2  # the victim's job was claimed again
    assert_each_done_once(storage, summaries, ids, stale_failed=True)
    retried = [t for i in ids for t in optuna.load_study(study_name=jobs[i]["key"], storage=storage.optuna_storage())
               .get_trials() if t.state == optuna.trial.TrialState.FAIL and "status" not in t.user_attrs]
    assert retried  # the victim's trial, failed by its heartbeat


def running_trials_with_a_heartbeat(storage: Storage) -> int:
    """Trials running in any study whose process has recorded a heartbeat (optuna's tables)."""
    storage.optuna_storage()  # the tables exist
    with storage.engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM trials t JOIN trial_heartbeats h ON h.trial_id = "
                                        "t.trial_id WHERE t.state = 'RUNNING'").scalar())


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody reaped yet is dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def assert_dies_with_parent(pid_file: Path, kill_parent: Callable[[], object], child_is: str) -> None:
    """Wait for a child to write its pid to ``pid_file`` and a second more (it is up, and has asked to
    die with its parent), run ``kill_parent`` (kill and reap), and give the child 10 s to follow;
    one that outlives its parent is killed here and fails the test."""
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    time.sleep(1.0)
    assert _running(child)
    kill_parent()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"{child_is} outlived its parent, killed with SIGKILL")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_tuning_process_killed_takes_its_evaluation_process_with_it(tmp_path):
    pid_file = tmp_path / "evaluator.pid"
    parent = SPAWN.Process(target=hang_in_evaluator, args=(str(pid_file),))
    parent.start()
    assert_dies_with_parent(pid_file, lambda: (parent.kill(), parent.join()), "the evaluation process")


def server_started(storage: Storage):
    with storage.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_postmaster_start_time()").scalar()


def test_workers_reconnect_after_the_database_restarts(storage, url, server, tmp_path):
    ids = submit(storage, "FakeGPU")
    workers = start_workers(url, tmp_path, ["FakeGPU", "FakeGPU"], delay=0.05)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(j["state"] == "done" for j in Queue(storage).jobs()):
        time.sleep(0.1)
    started = server_started(storage)
    assert [j for j in Queue(storage).jobs() if j["state"] != "done"]  # mid-run
    server.restart()
    summaries = wait_all(workers, timeout=90)
    assert server_started(storage) > started  # it did restart
    assert_each_done_once(storage, summaries, ids, stale_failed=False)


# -- winners ---------------------------------------------------------------------------------

def test_the_first_writer_wins(storage, tmp_path):
    key, fields = "k" * 24, {"gpu": "FakeGPU"}
    results: list[dict] = []
    barrier = threading.Barrier(4)

    def publish(n: int) -> None:
        barrier.wait()
        results.append(storage.publish(key, fields, {"time_ms": float(n), "candidate": {"n": n}, "variant": {}}))
    threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({json.dumps(r) for r in results}) == 1  # all four were told the same winner
    first = results[0]
    assert storage.winner(key) == first
    # a host whose own search named another winner adopts the stored one
    cache = Cache(tmp_path / "cache")
    cache.update(key, fields, lambda e: setattr(e, "winner", {"time_ms": 0.5, "candidate": {"n": 9}, "variant": {}}))
    assert push_winner(storage, cache, key, fields, replace=False).winner == first
    assert cache.load(key).winner == first
    # a forced search replaces it
    forced = {"time_ms": 7.0, "candidate": {"n": 7}, "variant": {}}
    assert storage.publish(key, fields, forced, replace=True) == forced


def test_deploy_with_the_winners_in_the_database_searches_nothing(storage, tmp_path):
    machine = Machine(*MACHINE_FIELDS)
    spec = load_config(SEEDS["maxpool_gap"])
    for shape in spec.shapes:  # host 1 tunes
        assert tune_shape(spec, shape, Cache(tmp_path / "host1"), machine, FakeBench().factory, trials=TRIALS,
                          echo=quiet, storage=storage).status == "tuned"
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(SEEDS["maxpool_gap"], configs)
    bench = FakeBench()
    start = time.perf_counter()
    report = ensure_tuned(configs, Cache(tmp_path / "host2"), 60.0, lambda *a: bench.factory, machine,
                          echo=quiet, storage=storage)
    seconds = time.perf_counter() - start
    assert bench.made == 0 and not report.tuned and not report.fallback
    assert len(report.cached) == len(spec.shapes)
    assert seconds < 2.0
    winners = {w["key"]: w["winner"] for w in storage.winners()}
    for entry in Cache(tmp_path / "host2").entries():  # the local cache was filled from the database
        assert entry.winner == winners[entry.key]


def test_a_deploy_command_of_stored_winners_opens_no_study_and_starts_no_evaluation_process(storage, url, tmp_path):
    """``fusetune deploy --storage`` in a process of its own, from an empty cache: every winner comes from the
    database, read through psycopg alone in one statement: no SQLAlchemy, no optuna (no study is opened), no
    evaluation process or build pool; --timings names the database's phase."""
    import deploy_child

    spec = load_config(SEEDS["maxpool_gap"])
    for shape in spec.shapes:  # host 1 tunes
        assert tune_shape(spec, shape, Cache(tmp_path / "host1"), Machine(*MACHINE_FIELDS), FakeBench().factory,
                          trials=TRIALS, echo=quiet, storage=storage).status == "tuned"
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(SEEDS["maxpool_gap"], configs)
    done, loaded = deploy_child.run(["--cache-dir", str(tmp_path / "host2"), "deploy", str(configs), "--storage", url,
                                     "--strict", "--timings"], MACHINE_FIELDS, tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert f"{len(spec.shapes)} cached, 0 tuned" in done.stdout
    assert "psycopg" in loaded and not [m for m in ("sqlalchemy", *deploy_child.NOT_LOADED) if m in loaded], \
        done.stderr
    assert re.search(r"^  storage +\d+\.\d+ s ", done.stderr, re.MULTILINE), done.stderr
    assert len(Cache(tmp_path / "host2").entries()) == len(spec.shapes)  # filled from the database


def test_a_lazy_deploy_reads_stored_winners_in_one_statement_and_searches_a_missing_or_damaged_one(
        storage, url, tmp_path):
    """A deploy's lazy Storage: with every winner stored it never makes the SQLAlchemy engine (one statement
    through psycopg; a local winner of another candidate gives way to the stored one). Of five shapes' rows, one
    deleted and three damaged (a winner that lost its fields, JSON null, a JSON string) are searched again: the
    first published, the others replaced; the fifth shape's stays as it was."""
    machine = Machine(*MACHINE_FIELDS)
    configs = tmp_path / "configs"
    configs.mkdir()
    config = configs / SEEDS["maxpool_gap"].name  # the seed with three more shapes: a row left alone beside the damage
    config.write_text(SEEDS["maxpool_gap"].read_text().replace("  - [3, 3, 7, 11, 13]\n",
                                                             "  - [3, 3, 7, 11, 13]\n  - [2, 3, 5, 9, 10]\n"
                                                             "  - [1, 3, 6, 8, 9]\n  - [2, 3, 4, 7, 7]\n"))
    spec = load_config(config)
    assert len(spec.shapes) == 5
    keys = [tune_shape(spec, shape, Cache(tmp_path / "host1"), machine, FakeBench().factory, trials=TRIALS,
                       echo=quiet, storage=storage).key for shape in spec.shapes]
    stored = {w["key"]: w["winner"] for w in storage.winners()}
    host2 = Cache(tmp_path / "host2")
    other = {**stored[keys[0]], "time_ms": stored[keys[0]]["time_ms"] / 2, "candidate": {"other": 1}}
    host2.update(keys[0], {}, lambda e: setattr(e, "winner", other))  # tuned here before the database had it

    lazy = Storage(url, lazy=True)
    bench = FakeBench()
    report = ensure_tuned(configs, host2, 60.0, lambda *a: bench.factory, machine, echo=quiet, storage=lazy)
    assert lazy._engine is None and bench.made == 0, "every winner stored: no engine, no search"
    assert len(report.cached) == len(spec.shapes) and not report.tuned and not report.fallback
    assert {k: host2.load(k).winner for k in keys} == {k: stored[k] for k in keys}  # the first writer's
    lazy.close()

    with storage.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {WINNERS.name} WHERE key = %(key)s", {"key": keys[0]})
        for key, damaged in zip(keys[1:4], ('{"candidate": {}}', "null", '"cut short"')):
            conn.exec_driver_sql(f"UPDATE {WINNERS.name} SET winner = %(w)s::jsonb WHERE key = %(key)s",
                                 {"key": key, "w": damaged})
    assert storage.lookup(keys) == {k: stored[k] for k in keys[4:]}  # the damaged ones are not handed out
    host3 = Cache(tmp_path / "host3")
    lazy = Storage(url, lazy=True)
    bench = FakeBench()
    report = ensure_tuned(configs, host3, 300.0, lambda *a: bench.factory, machine, echo=quiet, storage=lazy)
    lazy.close()
    assert bench.made == 4 and len(report.tuned) == 4 and len(report.cached) == len(spec.shapes) - 4, report
    assert not report.fallback
    now = {w["key"]: w["winner"] for w in storage.winners()}
    assert all(usable_winner(now[k]) and host3.load(k).winner == now[k] for k in keys)
    assert {k: now[k] for k in keys[4:]} == {k: stored[k] for k in keys[4:]} and keys[4:]


# -- the command line ------------------------------------------------------------------------

def test_submit_queues_jobs_and_a_bad_url_is_a_usage_error(url, storage, tmp_path):
    runner = CliRunner()
    args = ["submit", str(SEEDS["maxpool_gap"]), "--storage", url, "--gpu", "FakeGPU"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "queued 2 jobs" in result.output
    again = runner.invoke(main, args)
    assert "0 jobs" in again.output and "2 already" in again.output
    bad = runner.invoke(main, ["submit", str(SEEDS["maxpool_gap"]), "--storage", "mysql://x/y", "--gpu", "G"])
    assert bad.exit_code == 2 and "expected a PostgreSQL URL" in bad.output
    assert len(Queue(storage).jobs()) == 2


def test_queue_lists_jobs_by_state_with_workers_leases_and_winners(url, storage):
    """One job in each state, a running one whose lease ran out (its worker died), one winner stored."""
    done, running, expired, failed = submit(storage, "FakeGPU")
    [queued] = submit(storage, "OtherGPU", shapes=1)
    queue = Queue(storage)
    for worker in ("hostA:11:aaaaaa", "hostB:22:bbbbbb", "hostC:33:cccccc", "hostD:44:dddddd"):
        queue.claim("FakeGPU", worker)  # in id order: done, running, expired, failed
    with storage.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE fusetune_jobs SET lease_until = now() - interval '90 seconds' "
                             "WHERE id = %(id)s", {"id": expired})
    with storage.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE fusetune_jobs SET state = 'done', key = 'k0', finished_at = now(), "
                             "lease_until = NULL WHERE id = %(id)s", {"id": done})
        conn.exec_driver_sql("UPDATE fusetune_jobs SET state = 'failed', message = 'Traceback\nout of memory', "
                             "finished_at = now(), lease_until = NULL WHERE id = %(id)s", {"id": failed})
    storage.publish("k0", {"gpu": "FakeGPU"}, {"time_ms": 1.0, "candidate": {}})
    runner = CliRunner()

    result = runner.invoke(main, ["queue", "--storage", url, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["counts"] == {"queued": 1, "running": 2, "done": 1, "failed": 1}
    assert document["winners"] == 1 and document["winners_by_gpu"] == {"FakeGPU": 1}
    jobs = {job["id"]: job for state in document["jobs"].values() for job in state}
    assert [j["id"] for j in document["jobs"]["running"]] == [running, expired]
    assert jobs[running]["host"] == "hostB" and jobs[running]["worker"] == "hostB:22:bbbbbb"
    assert 0 < jobs[running]["lease_left_s"] <= queue.grace_s
    assert jobs[expired]["lease_left_s"] < -80
    assert jobs[queued]["gpu"] == "OtherGPU" and jobs[queued]["lease_left_s"] is None
    assert jobs[done]["key"] == "k0" and jobs[failed]["message"].endswith("out of memory")
    assert jobs[done]["shape"] == [3, 3, 7, 11, 13]

    text = runner.invoke(main, ["queue", "--storage", url])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert "1 queued, 2 running, 1 done, 1 failed; 1 winners stored (1 for FakeGPU)" in lines[0]
    assert [line for line in lines if not line.startswith(" ")][1:] == ["queued:", "running:", "done:", "failed:"]
    by_id = {int(line.split()[0][1:]): line for line in lines if line.startswith("  #")}
    assert "worker hostB:22:bbbbbb on hostB" in by_id[running] and "lease ends in" in by_id[running]
    assert "lease ran out" in by_id[expired] and "hostC" in by_id[expired]
    assert "key k0" in by_id[done] and by_id[failed].endswith("out of memory")

    bad = runner.invoke(main, ["queue", "--storage", "mysql://x/y"])
    assert bad.exit_code == 2 and "expected a PostgreSQL URL" in bad.output


@pytest.fixture
def fake_gpu(monkeypatch):
    """The command line sees a GPU of type FakeGPU; a FakeBench times its candidates."""
    import torch

    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine(*MACHINE_FIELDS)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 << 30, 80 << 30))
    monkeypatch.setattr("fusetune.runner.GpuBenchmarker", lambda plan, shape, *a, **k: FakeBench().factory(plan, shape))
    monkeypatch.setattr("fusetune.runner.LazyGpuBenchmarker",  # runner.SearchFactory's, in batches
                        lambda plan, shape, *a, **k: FakeBench().factory(plan, shape))


def test_submit_then_a_worker_then_search_and_deploy_on_another_host(url, storage, fake_gpu, tmp_path):
    runner = CliRunner()
    host = ["--cache-dir", str(tmp_path / "host1")]
    queued = runner.invoke(main, ["submit", str(JOBS), "--storage", url, "--shape", "3,3,7,11,13"])
    assert queued.exit_code == 0 and "queued 1 jobs" in queued.output and MACHINE_FIELDS[0] in queued.output
    worked = runner.invoke(main, host + ["worker", "--storage", url, "--one", "--trials", str(TRIALS)])
    assert worked.exit_code == 0, worked.output
    assert "1 jobs done" in worked.output
    [job] = Queue(storage).jobs()
    assert job["state"] == "done" and storage.winner(job["key"]) is not None
    [entry] = Cache(tmp_path / "host1").entries()  # the config submitted, not the worker's temporary copy
    assert Path(entry.fields["config"]).resolve() == JOBS.resolve()
    # another host: search and deploy take the stored winner, no trial runs
    other = ["--cache-dir", str(tmp_path / "host2")]
    found = runner.invoke(main, other + ["search", str(JOBS), "--shape", "3,3,7,11,13", "--storage", url])
    assert found.exit_code == 0 and "cached" in found.output and "trial" not in found.output, found.output
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / JOBS.name).write_text(JOBS.read_text().split("shapes:")[0] + "shapes:\n  - [3, 3, 7, 11, 13]\n"
                                     "search: {trials: 5, timeout: 300, seed: 0}\n")
    deployed = runner.invoke(main, ["--cache-dir", str(tmp_path / "host3"), "deploy", str(configs), "--storage", url,
                                    "--strict"])
    assert deployed.exit_code == 0 and "1 cached, 0 tuned" in deployed.output, deployed.output


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def test_worker_says_it_is_alive_during_its_build_and_a_slow_job(url, storage, monkeypatch, tmp_path):
    """Issue 27 for `fusetune worker`, scaled down (a heartbeat every 0.1 s): its module's build (nvcc, a slow
    stand-in here) and its evaluation process's first job (the float64 reference: a slow stand-in for the
    GPU process) each say what they are at least every interval, as `fusetune search` does."""
    import torch

    from fusetune import build as build_module, progress

    slow_s = 0.6

    def slow_child(cmd, env, timeout):
        time.sleep(slow_s)
        return True, False, ""
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine(*MACHINE_FIELDS)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 << 30, 80 << 30))
    monkeypatch.setattr(build_module, "_run_child", slow_child)
    monkeypatch.setattr("fusetune.worker.Worker", lambda: SlowEvaluator({"open": slow_s}))
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)
    submit(storage, MACHINE_FIELDS[0], shapes=1)
    result = CliRunner().invoke(main, ["--cache-dir", str(tmp_path / "host"), "worker", "--storage", url, "--one",
                                       "--trials", "2"])
    assert result.exit_code == 0 and "1 jobs done" in result.output, result.output
    lines = result.output.splitlines()
    built = [line for line in lines if re.fullmatch(r"  building \S+ \.\.\.", line)][0]  # the first batch's
    beats = [line for line in lines if line.startswith(built[:-4] + ": ")]
    assert len(beats) >= slow_s / 0.1 / 3, lines
    opened = [line for line in lines if re.fullmatch(r"  setting up the float64 reference and eager's error: \d+ s",
                                                     line)]
    assert len(opened) >= slow_s / 0.1 / 3, lines
    spec = load_config(JOBS)  # -q: another job, cold again on another host, without a heartbeat
    assert Queue(storage).submit(spec, JOBS.read_text(), spec.shapes[1:2], [MACHINE_FIELDS[0]]) == (1, 0)
    quiet_run = CliRunner().invoke(main, ["-q", "--cache-dir", str(tmp_path / "host2"), "worker", "--storage", url,
                                          "--one", "--trials", "2"])
    assert quiet_run.exit_code == 0 and "1 jobs done" in quiet_run.output, quiet_run.output
    assert not any(line.startswith(("  building", "  setting up")) for line in quiet_run.output.splitlines())


@pytest.mark.skipif(_cuda(), reason="a GPU is visible: the worker would start tuning")
def test_worker_without_a_gpu_exits_3(url):
    result = CliRunner().invoke(main, ["worker", "--storage", url])
    assert result.exit_code == 3, result.output
    assert "GPU" in result.output


def test_a_deploy_whose_database_is_down_tunes_without_it(fake_gpu, tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / JOBS.name).write_text(JOBS.read_text().split("shapes:")[0] + "shapes:\n  - [3, 3, 7, 11, 13]\n"
                                     "search: {trials: 3, timeout: 300, seed: 0}\n")
    down = f"postgresql://postgres@127.0.0.1:{pg.free_port()}/nowhere"
    args = ["--cache-dir", str(tmp_path / "cache"), "deploy", str(configs), "--storage", down]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "tuning without the shared database" in result.output, result.output
    assert "0 cached, 1 tuned" in result.output
    strict = CliRunner().invoke(main, args + ["--strict"])
    assert strict.exit_code == 1 and "cannot use the database" in strict.output


def test_a_search_whose_database_goes_away_says_so_in_one_line(url, fake_gpu, server, tmp_path):
    args = ["--cache-dir", str(tmp_path), "search", str(JOBS), "--shape", "3,3,7,11,13", "--trials", "3",
            "--storage", url]
    server.stop()
    try:
        result = CliRunner().invoke(main, args)
    finally:
        server.start()
    assert result.exit_code == 1, result.output
    assert "error: cannot use the database" in result.output and "Traceback" not in result.output
    # and one that went away mid-search: the database's error, with how to go on
    import fusetune.search as search_module

    original = search_module.push_winner

    def stop_first(*args, **kwargs):
        server.stop()
        return original(*args, **kwargs)
    try:
        search_module.push_winner = stop_first
        result = CliRunner().invoke(main, args)
    finally:
        search_module.push_winner = original
        server.start()
    assert result.exit_code == 1, result.output
    assert "error: the database of --storage failed" in result.output and "resume" in result.output


def test_search_on_gpus_gives_each_shape_to_the_next_free_gpu():
    import sys

    items = [("a", "a", (1, 2)), ("b", "b", (3, 4)), ("crash", "crash", (5, 6)), ("c", "c", (7, 8)),
             ("d", "d", (9, 10))]
    lines: list[str] = []
    program = (sys.executable, str(Path(__file__).parent / "fake_search_child.py"))
    searched = search_on_gpus(items, [0, 3], ["--cache-dir=/nowhere"], ["--trials=2"], echo=lines.append,
                              program=program)
    found = searched.results
    assert [(r["config"], r["name"], tuple(r["shape"])) for r in found] == items  # each once, in the order given
    crashed = found[2]
    assert crashed["status"] == "failed" and "status 3" in crashed["message"] and "illegal memory" in crashed["message"]
    assert sorted(crashed) == sorted(found[0])  # a dead child's result has every field of a search's
    assert searched.exit_status() == 1  # one child said no GPU, the others did not
    devices = [r["message"] for r in found if r["status"] == "tuned"]
    assert set(devices) == {"0", "3"}  # both cards worked, each child saw only its own
    assert sum(line.startswith("[gpu 0] searching") for line in lines) + \
        sum(line.startswith("[gpu 3] searching") for line in lines) == len(items)
    none = search_on_gpus([("crash", "crash", (1, 2)), ("crash", "crash", (3, 4))], [0, 1], [], [], echo=quiet,
                          program=program)
    assert none.codes == [3, 3] and none.exit_status() == 3  # every child said no GPU: so does the parent


def test_search_gpus_all_prints_one_summary_of_every_child(url, fake_gpu, monkeypatch, tmp_path):
    import sys

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("fusetune.fleet.FUSETUNE_PROGRAM",
                        (sys.executable, str(Path(__file__).parent / "fake_search_child.py")))
    result = CliRunner().invoke(main, ["--cache-dir", str(tmp_path), "search", str(JOBS), "--gpus", "all",
                                       "--storage", url])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith(str(JOBS)) or "tuned" in line]
    assert len(rows) == len(load_config(JOBS).shapes)
    given = [json.loads(p.read_text()) for p in tmp_path.glob("search-gpu*.json")]
    assert len(given) == len(load_config(JOBS).shapes)
    for child in given:  # the URL (and its password) in the environment, never on the command line
        assert child["storage"] == url and not [a for a in child["argv"] if "://" in a], child
        assert child["die_with"] == str(os.getpid())


def test_worker_gpus_starts_one_worker_per_gpu_each_seeing_its_own(url, fake_gpu, monkeypatch, tmp_path):
    import sys

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr("fusetune.fleet.FUSETUNE_PROGRAM",
                        (sys.executable, str(Path(__file__).parent / "fake_search_child.py")))
    result = CliRunner().invoke(main, ["--cache-dir", str(tmp_path), "worker", "--storage", url, "--gpus", "1,3",
                                       "--trials", "7"])
    assert result.exit_code == 0, result.output
    started = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("worker-gpu*.json")}
    assert sorted(started) == ["worker-gpu1.json", "worker-gpu3.json"]
    for given in started.values():
        args = given["argv"]
        assert "worker" in args and "--one" in args and "--trials=7" in args
        assert given["storage"] == url and not [a for a in args if "://" in a], given  # not shown by ps
        assert given["die_with"] == str(os.getpid())


def test_url_schemes_and_gpu_lists():
    assert engine_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert engine_url("postgres://h/db") == "postgresql+psycopg://h/db"
    with pytest.raises(StorageError, match=r"u:\*\*\*@"):
        engine_url("sqlite://u:secret@h/db")
    for url, shown in [("postgresql://u:p@ss@host/db", "postgresql://u:***@host/db"),
                       ("postgresql://u:p%40ss@host:5432/db", "postgresql://u:***@host:5432/db"),
                       ("postgresql://u:p/s:s@host/db?sslmode=require", "postgresql://u:***@host/db?sslmode=require"),
                       ("postgres://host:5432/db", "postgres://host:5432/db")]:
        assert redact(url) == shown
    with pytest.raises(StorageError, match="%40") as raised:  # SQLAlchemy would take "zz9@host" for the host
        engine_url("postgresql://u:p@zz9@host/db")
    assert "zz9" not in str(raised.value)
    assert parse_gpus("all", 4) == [0, 1, 2, 3]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
        assert [visible_device(d) for d in (0, 1)] == ["2", "3"]  # the cards this process sees
        patch.delenv("CUDA_VISIBLE_DEVICES")
        assert visible_device(1) == "1"
    assert parse_gpus("2", 4) == [0, 1]
    assert parse_gpus("1,3", 4) == [1, 3]
    for bad in ("5", "0,0", "0,4", "x"):
        with pytest.raises(GpusError, match="--gpus"):
            parse_gpus(bad, 4)


# -- a worker's loop, its lease and its children, without a database -------------------------

class FakeClock:
    """``time`` for ``fleet.work``: sleeping moves the clock on at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class IdleQueue:
    """A queue with nothing to claim while a job runs elsewhere for ``busy_s``, whose database fails once
    after that; then the job elsewhere is done."""

    def __init__(self, clock: FakeClock, busy_s: float) -> None:
        self.clock, self.busy_s, self.failed = clock, busy_s, False

    def claim(self, gpu: str, worker: str) -> None:
        if self.clock.now > self.busy_s and not self.failed:
            import sqlalchemy.exc

            self.failed = True
            raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("server closed the connection"))
        return None

    def pending(self, gpu: str) -> int:
        return 0 if self.failed else 1

    def release(self, job: Job, worker: str) -> None:
        raise AssertionError("no job was claimed")


def test_an_idle_worker_survives_a_database_error_after_a_long_wait(monkeypatch, tmp_path):
    clock = FakeClock()
    busy_s = 2 * fleet.GIVE_UP_S  # idle for longer than a worker waits for a database that does not answer
    monkeypatch.setattr(fleet, "time", clock)
    monkeypatch.setattr(fleet, "Queue", lambda storage: IdleQueue(clock, busy_s))
    lines: list[str] = []
    summary = fleet.work(None, Machine(*MACHINE_FIELDS), Cache(tmp_path), FakeBench().factory, echo=lines.append)
    assert clock.now > busy_s and summary.db_errors == 1 and not summary.done, lines
    assert any("database error" in line for line in lines)


def a_job(config_path: str = "/submitter/configs/a.yaml") -> Job:
    return Job(id=7, config_name="convt3d_small", config_path=config_path, config_text=JOBS.read_text(),
               shape=tuple(load_config(JOBS).shapes[0]), gpu="FakeGPU", attempts=1)


class BrokenQueue:
    """A queue whose lease renewal meets a bug, not a database error."""

    def renew(self, job: Job, worker: str) -> bool:
        raise RuntimeError("a bug in the renewal")


def test_a_lease_that_cannot_be_renewed_is_said_and_counts_as_lost():
    lines: list[str] = []
    with fleet._lease(BrokenQueue(), a_job(), "w1", 0.01, lines.append) as lost:
        assert lost.wait(10)
    assert len(lines) == 1 and "RuntimeError: a bug in the renewal" in lines[0] and "job 7" in lines[0]


def test_a_job_config_keeps_the_path_it_was_submitted_from(tmp_path):
    spec = fleet._spec_of(a_job(), tmp_path)
    assert spec.path == "/submitter/configs/a.yaml"  # what the cache records: not the temporary copy
    assert spec.shapes == load_config(JOBS).shapes


CHILD = "import os, sys, time\nfrom fusetune.lifeline import die_with_parent_from_env\ndie_with_parent_from_env()\n" \
        "print(os.environ.get('FUSETUNE_DIE_WITH_PARENT', 'gone'), flush=True)\ntime.sleep(float(sys.argv[1]))\n"


def test_a_child_whose_parent_is_gone_at_its_start_exits_at_once():
    import subprocess
    import sys

    alive = subprocess.run([sys.executable, "-c", CHILD, "0"], env=child_env({}), capture_output=True, text=True)
    assert alive.returncode == 0 and alive.stdout.strip() == "gone"  # its own children do not inherit the pid
    not_my_parent = str(os.getpid() + 1 if os.getpid() + 1 != os.getppid() else os.getpid() + 2)
    orphan = subprocess.run([sys.executable, "-c", CHILD, "0"], env={**child_env({}), PARENT_PID_ENV: not_my_parent},
                            capture_output=True, text=True)
    assert orphan.returncode == 1 and orphan.stdout == ""  # the parent it was to die with is not its parent


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_child_of_the_fleet_dies_with_its_parent_killed(tmp_path):
    import subprocess
    import sys

    pid_file = tmp_path / "child.pid"
    parent_code = ("import subprocess, sys\nfrom fusetune.lifeline import child_env\n"
                   f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}, '600'], env=child_env({{}}))\n"
                   f"open({str(pid_file)!r}, 'w').write(str(child.pid))\nchild.wait()\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    assert_dies_with_parent(pid_file, lambda: (parent.kill(), parent.wait()), "a child started with child_env")


def test_a_job_that_kills_its_workers_fails_after_max_attempts(storage):
    [job_id] = submit(storage, "FakeGPU", shapes=1)
    queue = Queue(storage)

    def expire() -> None:  # its worker died: the lease runs out
        with storage.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE fusetune_jobs SET lease_until = now() - interval '1 second'")
    job = queue.claim("FakeGPU", "w0")
    queue.release(job, "w0")  # handed back by a worker that stopped: not an attempt that died
    for attempt in range(1, fleet.MAX_ATTEMPTS + 1):
        job = queue.claim("FakeGPU", f"w{attempt}")
        assert job is not None and job.id == job_id and job.attempts == attempt
        expire()
    assert queue.claim("FakeGPU", "w9") is None
    [row] = queue.jobs()
    assert row["state"] == "failed" and f"after {fleet.MAX_ATTEMPTS} attempts" in row["message"], row
    assert queue.pending("FakeGPU") == 0  # the workers end
    submit(storage, "FakeGPU", shapes=1)  # submitted again: a fresh budget
    assert queue.claim("FakeGPU", "w10").attempts == 1


def test_a_worker_claims_a_config_no_live_job_is_tuning_before_the_oldest(storage):
    """A config's shapes share their builds: a second worker takes another config's job first, and a job whose
    lease ran out keeps no config in hand."""
    queue = Queue(storage)
    first = submit(storage, "FakeGPU", shapes=2)
    other = load_config(SEEDS["maxpool_gap"])
    assert queue.submit(other, SEEDS["maxpool_gap"].read_text(), other.shapes[:2], ["FakeGPU"]) == (2, 0)
    later = sorted(j["id"] for j in queue.jobs() if j["id"] not in first)
    assert queue.claim("FakeGPU", "w0").id == first[0]
    assert queue.claim("FakeGPU", "w1").id == later[0]
    assert queue.claim("FakeGPU", "w2").id == first[1]  # both configs in hand: the oldest
    with storage.engine.begin() as conn:  # w1 died: its config is no longer in hand
        conn.exec_driver_sql("UPDATE fusetune_jobs SET lease_until = now() - interval '1 second' WHERE id = %(id)s",
                             {"id": later[0]})
    assert queue.claim("FakeGPU", "w3").id == later[0]  # the oldest claimable, its lease run out
    assert queue.claim("FakeGPU", "w4").id == later[1]
