"""A fleet of tuning workers sharing one PostgreSQL database: ``fusetune submit`` and ``fusetune worker``.

``submit`` queues one job per (config content, shape, GPU type). A worker claims the oldest job of
its GPU type with ``SELECT ... FOR UPDATE SKIP LOCKED`` (two workers never claim the same row), holds
it under a lease that a heartbeat thread renews, and tunes it with the shared study and winners of
``fusetune.storage`` (a key that already has a winner costs no search). A worker killed mid-job stops
renewing: once the lease runs out the job is claimed again, and its study resumes where the dead
worker's trials left it (a trial that was running is failed by optuna's heartbeat and retried). A job
is marked done only by the worker that holds its lease, so nothing is counted twice.

Database errors (a restart, a failover) do not end a worker: it backs off, reconnects and goes on.
``--gpus`` runs one worker process per GPU, each seeing only its card (``CUDA_VISIBLE_DEVICES``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from fusetune import documents
from fusetune.cache import Cache
from fusetune.config import ProblemSpec, load_config
from fusetune.errors import FusetuneError, NoGpuError
from fusetune.lifeline import child_env
from fusetune.ops import Shape
from fusetune.pipeline import expand
from fusetune.search import BenchmarkerFactory, Machine, ShapeResult, tune_shape
from fusetune.storage import JOBS, Storage, first_line, transient_errors

#: Seconds between polls of an empty queue while jobs of this GPU type are still running elsewhere
#: (one of them may be abandoned and become claimable when its lease runs out).
POLL_S = 1.0
#: Back-off after a database error: first, growth factor, most; a worker gives up after GIVE_UP_S
#: without a successful statement.
BACKOFF_S, BACKOFF_GROWTH, BACKOFF_MAX_S, GIVE_UP_S = 0.5, 2.0, 10.0, 600.0
#: Claims of one job whose lease ran out (its worker died: out of memory, a crash) before the job is
#: failed instead of claimed again: a job that kills every worker that takes it must not do so for ever.
MAX_ATTEMPTS = 3


class GpusError(FusetuneError):
    """``--gpus`` names GPUs that are not here (exit status 2, like a bad option)."""

    exit_code = 2


#: How a child process (a worker per GPU, a search per shape) runs fusetune: this Python (tests put a
#: stand-in here).
FUSETUNE_PROGRAM = (sys.executable, "-m", "fusetune")
#: The variable ``--storage`` falls back to: how a child gets the database URL, which on its command
#: line would show its password to every user of the host (ps, /proc/PID/cmdline).
STORAGE_ENV = "FUSETUNE_STORAGE"


def storage_env(url: str | None) -> dict[str, str]:
    """The environment a child needs to use ``url`` as its ``--storage`` (nothing without one)."""
    return {STORAGE_ENV: url} if url else {}


@dataclasses.dataclass(frozen=True)
class Job:
    id: int
    config_name: str
    config_path: str
    config_text: str
    shape: Shape
    gpu: str
    attempts: int


@dataclasses.dataclass
class WorkSummary:
    """What one worker process did."""

    done: list[int] = dataclasses.field(default_factory=list)  # job ids it marked done
    failed: list[int] = dataclasses.field(default_factory=list)
    lost: list[int] = dataclasses.field(default_factory=list)  # leases that ran out under it: another finished them
    db_errors: int = 0


def config_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Queue:
    """The jobs table (storage.JOBS) of a ``Storage``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        # A lease outlives a trial's grace by a beat: when a dead worker's job is claimed again, the trial
        # it was running is already stale, so the new worker's first trial fails it and queues it again.
        self.grace_s = storage.heartbeat.grace_s + storage.heartbeat.interval_s

    def submit(self, spec: ProblemSpec, text: str, shapes: Sequence[Shape], gpus: Sequence[str]) -> tuple[int, int]:
        """Queue (config, shape, gpu) jobs; a job already queued or running is not queued twice, and a
        finished one is queued again (its worker skips it if the winner is still stored). Returns
        (queued, already queued or running)."""
        added = already = 0
        with self.storage.engine.begin() as conn:
            for gpu in gpus:
                for shape in shapes:
                    row = conn.exec_driver_sql(
                        f"INSERT INTO {JOBS.name} (config_name, config_path, config_text, config_sha, shape, gpu) "
                        "VALUES (%(name)s, %(path)s, %(text)s, %(sha)s, %(shape)s, %(gpu)s) "
                        "ON CONFLICT (config_sha, shape, gpu) DO UPDATE SET state = 'queued', worker = NULL, "
                        "lease_until = NULL, message = '', finished_at = NULL, attempts = 0, "
                        "config_path = EXCLUDED.config_path "
                        f"WHERE {JOBS.name}.state IN ('done', 'failed') RETURNING id",
                        {"name": spec.name, "path": spec.path, "text": text, "sha": config_sha(text),
                         "shape": json.dumps(list(shape)), "gpu": gpu}).first()
                    if row is None:
                        already += 1
                    else:
                        added += 1
        return added, already

    def claim(self, gpu: str, worker: str) -> Job | None:
        """The oldest job of ``gpu`` that is queued or whose lease ran out, now leased to ``worker``, those
        of a config that no live job is tuning first. A job whose lease ran out ``MAX_ATTEMPTS`` times is
        failed instead, with the reason as its message.

        Why a config not in hand first: a config's shapes build the same modules, and on one host (one
        cache) a second worker on the same config waits on the first's build locks where another config's
        builds would run beside them; once the config's first job is done, its other shapes find their
        modules built. Measured on four GPUs, the seeds' 8 jobs in id order put two workers on one config."""
        with self.storage.engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE {JOBS.name} SET state = 'failed', lease_until = NULL, finished_at = now(), "
                "message = 'abandoned after ' || attempts || ' attempts: each worker that took it died or "
                "stopped renewing its lease (out of memory? see the logs of the workers, the last ' || "
                "coalesce(worker, '?') || ')' WHERE id IN ("
                f"  SELECT id FROM {JOBS.name} WHERE gpu = %(gpu)s AND state = 'running' AND lease_until < now() "
                "  AND attempts >= %(most)s FOR UPDATE SKIP LOCKED)",
                {"gpu": gpu, "most": MAX_ATTEMPTS})
            row = conn.exec_driver_sql(
                f"UPDATE {JOBS.name} SET state = 'running', worker = %(worker)s, attempts = attempts + 1, "
                "lease_until = now() + make_interval(secs => %(grace)s) WHERE id = ("
                f"  SELECT id FROM {JOBS.name} j WHERE gpu = %(gpu)s AND (state = 'queued' OR "
                "  (state = 'running' AND lease_until < now())) ORDER BY EXISTS ("
                f"    SELECT 1 FROM {JOBS.name} r WHERE r.config_sha = j.config_sha AND r.state = 'running' "
                "    AND r.lease_until >= now()), id LIMIT 1 FOR UPDATE OF j SKIP LOCKED) "
                "RETURNING id, config_name, config_path, config_text, shape, gpu, attempts",
                {"worker": worker, "grace": self.grace_s, "gpu": gpu}).first()
        if row is None:
            return None
        shape = row[4] if isinstance(row[4], list) else json.loads(row[4])
        return Job(id=row[0], config_name=row[1], config_path=row[2], config_text=row[3], shape=tuple(shape),
                   gpu=row[5], attempts=row[6])

    def renew(self, job: Job, worker: str) -> bool:
        """Extend the lease; False if ``worker`` no longer holds it."""
        with self.storage.engine.begin() as conn:
            return conn.exec_driver_sql(
                f"UPDATE {JOBS.name} SET lease_until = now() + make_interval(secs => %(grace)s) "
                "WHERE id = %(id)s AND worker = %(worker)s AND state = 'running'",
                {"grace": self.grace_s, "id": job.id, "worker": worker}).rowcount == 1

    def finish(self, job: Job, worker: str, state: str, key: str | None, message: str = "") -> bool:
        """Mark the job ``done`` or ``failed``, only if ``worker`` still holds it; True if it did."""
        with self.storage.engine.begin() as conn:
            return conn.exec_driver_sql(
                f"UPDATE {JOBS.name} SET state = %(state)s, key = %(key)s, message = %(message)s, "
                "finished_at = now(), lease_until = NULL WHERE id = %(id)s AND worker = %(worker)s "
                "AND state = 'running'",
                {"state": state, "key": key, "message": message[:2000], "id": job.id, "worker": worker}).rowcount == 1

    def release(self, job: Job, worker: str) -> None:
        """Hand a job back unfinished (the worker is stopping, or the database failed under it): the next
        worker claims it at once, and this claim does not count towards ``MAX_ATTEMPTS``."""
        with self.storage.engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {JOBS.name} SET state = 'queued', worker = NULL, lease_until = NULL, "
                                 "attempts = greatest(attempts - 1, 0) "
                                 "WHERE id = %(id)s AND worker = %(worker)s AND state = 'running'",
                                 {"id": job.id, "worker": worker})

    def pending(self, gpu: str) -> int:
        """Jobs of ``gpu`` not finished (queued, or running somewhere)."""
        with self.storage.engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT count(*) FROM {JOBS.name} WHERE gpu = %(gpu)s AND state IN "
                                            "('queued', 'running')", {"gpu": gpu}).scalar())

    def jobs(self) -> list[dict[str, Any]]:
        with self.storage.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT id, config_name, shape, gpu, state, worker, attempts, key, message "
                                        f"FROM {JOBS.name} ORDER BY id").mappings().all()
        return [dict(r) for r in rows]


@contextlib.contextmanager
def _lease(queue: Queue, job: Job, worker: str, interval_s: float,
           echo: Callable[[str], None] = print) -> Iterator[threading.Event]:
    """Renew the job's lease every ``interval_s`` until the block ends; the event is set if it was lost.
    A renewal that fails on a database error is tried again at the next beat; any other error ends the
    renewals, so it is said and counts as the lease lost (else the job would be taken over unannounced)."""
    stop, lost = threading.Event(), threading.Event()
    transient = transient_errors()

    def beat() -> None:
        while not stop.wait(interval_s):
            try:
                if not queue.renew(job, worker):
                    lost.set()
                    return
            except transient:
                continue
            except Exception as exc:  # noqa: BLE001 - a thread's error is otherwise lost without a word
                lost.set()
                echo(f"worker {worker}: job {job.id}: the lease can no longer be renewed ({type(exc).__name__}: "
                     f"{exc}); another worker may take the job over")
                return
    thread = threading.Thread(target=beat, name=f"lease-{job.id}", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join()


def _spec_of(job: Job, folder: Path) -> ProblemSpec:
    """The job's config, from its stored text (the submitting host's file need not exist here), under
    the path it was submitted from: that path is what the cache records and messages name, not the
    temporary file, which is gone once the worker ends."""
    path = folder / f"{job.config_name}.{config_sha(job.config_text)[:12]}.yaml"
    if not path.exists():
        path.write_text(job.config_text, encoding="utf-8")
    return dataclasses.replace(load_config(path), path=job.config_path)


def work(storage: Storage, machine: Machine, cache: Cache, make_bench: BenchmarkerFactory, *,
         trials: int | None = None, timeout: float | None = None, wait: bool = False,
         echo: Callable[[str], None] = print, name: str | None = None) -> WorkSummary:
    """Claim and tune jobs of ``machine.gpu`` until none is left (or for ever, with ``wait``)."""
    queue, worker = Queue(storage), name or worker_name()
    transient = transient_errors()
    summary = WorkSummary()
    backoff, last_ok = BACKOFF_S, time.monotonic()
    unfinished: Job | None = None  # a job a database error cut short: handed back once the database answers
    with tempfile.TemporaryDirectory(prefix="fusetune-jobs-") as folder:
        while True:
            job = None
            try:
                if unfinished is not None:
                    queue.release(unfinished, worker)
                    unfinished = None
                job = queue.claim(machine.gpu, worker)
                backoff, last_ok = BACKOFF_S, time.monotonic()  # the database answered: a later error starts afresh
                if job is None:
                    if not wait and queue.pending(machine.gpu) == 0:
                        return summary
                    last_ok = time.monotonic()
                    time.sleep(POLL_S)
                    continue
                _run_job(queue, job, worker, storage, machine, cache, make_bench, Path(folder), summary,
                         trials, timeout, echo)
                backoff, last_ok = BACKOFF_S, time.monotonic()
            except transient as exc:  # the database went away: back off and go on
                summary.db_errors += 1
                unfinished = job or unfinished
                if time.monotonic() - last_ok > GIVE_UP_S:
                    raise FusetuneError(f"worker {worker}: the database has failed for {GIVE_UP_S:.0f} s: "
                                        f"{first_line(exc)}") from None
                echo(f"worker {worker}: database error ({first_line(exc)}); retrying in {backoff:.1f} s")
                time.sleep(backoff)
                backoff = min(backoff * BACKOFF_GROWTH, BACKOFF_MAX_S)
            except BaseException:  # Ctrl-C, SIGTERM: hand the job back so that no lease has to run out
                for held in {id(j): j for j in (job, unfinished) if j is not None}.values():
                    with contextlib.suppress(Exception):
                        queue.release(held, worker)
                raise


def _run_job(queue: Queue, job: Job, worker: str, storage: Storage, machine: Machine, cache: Cache,
             make_bench: BenchmarkerFactory, folder: Path, summary: WorkSummary, trials: int | None,
             timeout: float | None, echo: Callable[[str], None]) -> None:
    label = f"job {job.id} {job.config_name} {list(job.shape)} on {job.gpu}"
    again = f" (attempt {job.attempts})" if job.attempts > 1 else ""
    echo(f"worker {worker}: {label}{again}")
    with _lease(queue, job, worker, storage.heartbeat.interval_s, echo) as lost:
        key, state, message = None, "done", ""
        try:
            spec = _spec_of(job, folder)
            if job.shape not in spec.shapes:
                raise FusetuneError(f"{job.config_path}: shape {list(job.shape)} is not among the config's shapes")
            result = tune_shape(spec, job.shape, cache, machine, make_bench, trials=trials, timeout=timeout,
                                echo=echo, storage=storage)
            for region, shapes in expand(spec, [job.shape])[1:]:  # the later regions, in the same job
                later = tune_shape(region, shapes[0], cache, machine, make_bench, trials=trials, timeout=timeout,
                                   echo=echo, storage=storage)
                echo(f"worker {worker}: {label}: {region.name} {list(shapes[0])}: {later.status}")
            key = result.key
            if result.status == "failed":
                state, message = "failed", result.message
            else:
                message = f"{result.status}: {result.time_ms:.4f} ms" if result.time_ms else result.status
        except FusetuneError as exc:  # this job's config or shape: the job fails, the worker goes on
            state, message = "failed", str(exc)
        except transient_errors():
            raise  # the database's trouble, not the job's: the worker retries it
        except Exception as exc:  # a bug met by this job alone must not stop the fleet's other jobs
            state, message = "failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
    if queue.finish(job, worker, state, key, message):
        (summary.done if state == "done" else summary.failed).append(job.id)
        echo(f"worker {worker}: {label}: {state} ({message.splitlines()[0] if message else ''})")
    else:
        summary.lost.append(job.id)
        echo(f"worker {worker}: {label}: lease lost{' (heartbeat missed)' if lost.is_set() else ''}; "
             "another worker finishes it")


# -- one process per GPU -------------------------------------------------------------------------

def parse_gpus(text: str, count: int) -> list[int]:
    """``all``, a count ``N`` (the first N), or a list ``0,2,3`` of device indices below ``count``."""
    text = text.strip().lower()
    if count < 1:
        raise FusetuneError("--gpus: no CUDA GPU is visible here")
    if text == "all":
        return list(range(count))
    try:
        if "," not in text:
            n = int(text)
            if not 1 <= n <= count:
                raise GpusError(f"--gpus {text}: expected 1 to {count} (the GPUs visible here), or all, or a list")
            return list(range(n))
        devices = [int(part) for part in text.split(",")]
    except ValueError:
        raise GpusError(f"--gpus {text}: expected all, a count like 4, or device indices like 0,1") from None
    bad = [d for d in devices if not 0 <= d < count]
    if bad or len(set(devices)) != len(devices):
        raise GpusError(f"--gpus {text}: expected distinct device indices from 0 to {count - 1}")
    return devices


def visible_device(device: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child that is to see only this process's device ``device``: its
    entry in this process's own ``CUDA_VISIBLE_DEVICES`` where that is set (``--gpus 0`` under
    ``CUDA_VISIBLE_DEVICES=2,3`` is card 2)."""
    mine = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mine is None or not mine.strip():
        return str(device)
    return [part.strip() for part in mine.split(",")][device]


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM, as Ctrl-C: the children are stopped and their jobs handed back."""
    raise KeyboardInterrupt


def run_per_gpu(devices: list[int], child_args: list[str], echo: Callable[[str], None] = print,
                env: Mapping[str, str] | None = None) -> int:
    """Run ``python -m fusetune <child_args>`` once per device, each seeing only its card, with ``env``
    added to its environment; the worst exit status. Ctrl-C or SIGTERM stops every child."""
    procs = []
    for device in devices:
        environment = child_env({**(env or {}), "CUDA_VISIBLE_DEVICES": visible_device(device)})
        procs.append(subprocess.Popen([*FUSETUNE_PROGRAM, *child_args], env=environment))
        echo(f"fusetune: worker on GPU {device}: pid {procs[-1].pid}")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        codes = [p.wait() for p in procs]
        return next((code for code in codes if code > 0), 1 if any(codes) else 0)
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- fusetune search --gpus: one host's cards, no database ---------------------------------------

@dataclasses.dataclass
class GpuSearch:
    """What ``search_on_gpus`` did: one ``search --json`` result per item, and each child's exit status."""

    results: list[dict[str, Any]]
    codes: list[int]

    def exit_status(self) -> int:
        """0 if every search succeeded; 3 (no GPU) where every child said so, as a search in this
        process would; else 1 if any failed."""
        if self.codes and all(code == NoGpuError.exit_code for code in self.codes):
            return NoGpuError.exit_code
        return 1 if any(self.codes) or any(r["status"] == "failed" for r in self.results) else 0


def search_on_gpus(items: Sequence[tuple[str, str, Shape]], devices: Sequence[int], global_args: Sequence[str],
                   search_args: Sequence[str], echo: Callable[[str], None] = print,
                   program: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> GpuSearch:
    """Search each (config path, problem name, shape) in a child ``fusetune search CONFIG --shape S --json``
    on the next GPU that is free, one child at a time per GPU, so that a slow shape does not hold the
    others back; the children share the cache (its locks make a module build once). Returns one
    ``search --json`` result per item, in the order given (a child that died gives a "failed" result
    with its last words), and the children's exit statuses. Each child's progress goes through ``echo``,
    prefixed with its GPU; ``env`` is added to each child's environment."""
    import queue as queue_module

    program = program or FUSETUNE_PROGRAM
    todo: queue_module.SimpleQueue = queue_module.SimpleQueue()
    for index, item in enumerate(items):
        todo.put((index, item))
    results: list[tuple[dict[str, Any], int] | None] = [None] * len(items)
    lock = threading.Lock()

    def lane(device: int) -> None:
        while True:
            try:
                index, (config, name, shape) = todo.get_nowait()
            except queue_module.Empty:
                return
            results[index] = _search_child(program, device, config, name, shape, global_args, search_args,
                                           lambda line: _locked(lock, echo, f"[gpu {device}] {line}"), env or {})

    lanes = [threading.Thread(target=lane, args=(device,), name=f"gpu-{device}") for device in devices]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    done = [r for r in results if r is not None]
    return GpuSearch(results=[result for result, _ in done], codes=[code for _, code in done])


def _locked(lock: threading.Lock, echo: Callable[[str], None], line: str) -> None:
    with lock:
        echo(line)


def _search_child(program: Sequence[str], device: int, config: str, name: str, shape: Shape,
                  global_args: Sequence[str], search_args: Sequence[str],
                  echo: Callable[[str], None], env: Mapping[str, str]) -> tuple[dict[str, Any], int]:
    """One child search on ``device``; its result (from its JSON document on stdout) and exit status."""
    command = [*program, *global_args, "search", config, "--shape", ",".join(map(str, shape)), "--json",
               *search_args]
    env = child_env({**env, "CUDA_VISIBLE_DEVICES": visible_device(device)})
    last = ""
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: nothing blocks while stderr is read
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip("\n")
            if line.strip():
                last = line
                echo(line)
        code = proc.wait()
        out.seek(0)
        text = out.read()
    try:
        [result] = json.loads(text)["results"]
        return result, code
    except (ValueError, KeyError, TypeError):
        message = f"the search on GPU {device} exited with status {code}: {last or 'no output'}"
        return documents.search_result(config, name, ShapeResult(shape=tuple(shape), key=None, status="failed",
                                                                 message=message)), code
