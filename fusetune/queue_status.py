"""What a fleet's database holds, for ``fusetune queue``: its jobs by state and its winners.

Read-only: what is in ``fusetune_jobs`` and ``fusetune_winners`` (``fusetune/fleet.py``,
``fusetune/storage.py``), ages computed by the database's clock, not this host's, so that a host
whose clock drifts still sees which leases ran out. A running job whose lease has run out belongs to
a worker that died or stopped renewing: the next worker of its GPU type claims it again.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from fusetune.storage import JOBS, WINNERS, Storage

#: A job's states, in the order they are listed (``fusetune/fleet.py`` moves a job through them).
JOB_STATES = ("queued", "running", "done", "failed")

#: One row per job; the lease and the times as seconds by the database's clock.
JOBS_SQL = (
    "SELECT id, config_name, shape, gpu, state, worker, attempts, key, message, "
    "extract(epoch FROM lease_until - now())::float8 AS lease_left_s, "
    "extract(epoch FROM now() - submitted_at)::float8 AS submitted_s_ago, "
    "extract(epoch FROM now() - finished_at)::float8 AS finished_s_ago "
    f"FROM {JOBS.name} ORDER BY id")
WINNERS_SQL = f"SELECT gpu, count(*) FROM {WINNERS.name} GROUP BY gpu ORDER BY gpu"


@dataclasses.dataclass(frozen=True)
class JobRow:
    id: int
    config_name: str
    shape: list[int]
    gpu: str
    state: str
    worker: str | None  # "host:pid:tag" (fleet.worker_name) of the worker that holds or last held it
    attempts: int
    key: str | None
    message: str
    lease_left_s: float | None  # running: seconds until the lease runs out, negative once it has
    submitted_s_ago: float
    finished_s_ago: float | None

    @property
    def host(self) -> str | None:
        """The worker's host (its name up to the pid)."""
        return self.worker.rsplit(":", 2)[0] if self.worker else None


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    jobs: list[JobRow]
    winners: dict[str, int]  # GPU type -> winners stored

    def by_state(self) -> dict[str, list[JobRow]]:
        """Jobs per state, every state of ``JOB_STATES`` present (an unknown one after them)."""
        grouped: dict[str, list[JobRow]] = {state: [] for state in JOB_STATES}
        for job in self.jobs:
            grouped.setdefault(job.state, []).append(job)
        return grouped


def queue_status(storage: Storage) -> QueueStatus:
    """The fleet's jobs and winners, read on one connection."""
    with storage.engine.connect() as conn:
        rows = conn.exec_driver_sql(JOBS_SQL).mappings().all()
        winners = {gpu: int(n) for gpu, n in conn.exec_driver_sql(WINNERS_SQL).all()}
    return QueueStatus(jobs=[JobRow(**_plain(dict(r))) for r in rows], winners=winners)


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row["shape"], str):  # a driver that hands jsonb back as text
        row["shape"] = json.loads(row["shape"])
    row["shape"] = [int(n) for n in row["shape"]]
    return row


def status_document(status: QueueStatus, storage: str) -> dict[str, Any]:
    """``fusetune queue --json``: the counts, the winners per GPU type, and every job under its state."""
    grouped = status.by_state()
    return {"storage": storage, "counts": {state: len(jobs) for state, jobs in grouped.items()},
            "winners": sum(status.winners.values()), "winners_by_gpu": status.winners,
            "jobs": {state: [{**dataclasses.asdict(job), "host": job.host} for job in jobs]
                     for state, jobs in grouped.items()}}


def _age(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def job_line(job: JobRow) -> str:
    """One job as ``fusetune queue`` lists it: what it is, then what its state says about it."""
    head = f"  #{job.id:<5d} {job.config_name:32s} {'x'.join(map(str, job.shape)):16s} {job.gpu}"
    if job.state == "queued":
        tail = f"waiting {_age(job.submitted_s_ago)}" + (f", {job.attempts} attempts so far" if job.attempts else "")
    elif job.state == "running":
        left = job.lease_left_s
        lease = ("no lease" if left is None else f"lease ends in {_age(left)}" if left >= 0
                 else f"lease ran out {_age(left)} ago: its worker died or stopped, the next claim takes it")
        tail = f"worker {job.worker} on {job.host}, attempt {job.attempts}, {lease}"
    elif job.state == "done":
        tail = f"key {job.key or '-'}" + (f", {_age(job.finished_s_ago)} ago" if job.finished_s_ago is not None else "")
    else:
        lines = job.message.strip().splitlines()
        tail = f"after {job.attempts} attempts: {lines[-1][:200] if lines else '(no message)'}"
    return f"{head}  {tail}"


def status_lines(status: QueueStatus, storage: str) -> list[str]:
    """The text form: a summary line, then each state's jobs (empty states left out)."""
    grouped = status.by_state()
    counts = ", ".join(f"{len(jobs)} {state}" for state, jobs in grouped.items())
    per_gpu = ", ".join(f"{n} for {gpu}" for gpu, n in status.winners.items())
    lines = [f"queue at {storage}: {counts}; {sum(status.winners.values())} winners stored"
             + (f" ({per_gpu})" if per_gpu else "")]
    for state, jobs in grouped.items():
        if jobs:
            lines.append(f"{state}:")
            lines.extend(job_line(job) for job in jobs)
    return lines
