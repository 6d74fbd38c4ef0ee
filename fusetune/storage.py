"""Shared storage on PostgreSQL (``--storage URL``): the optuna studies, the winners, the fleet's jobs.

Without ``--storage`` nothing here is used: studies stay in the local cache's journal files. With it,
every process of every host that names the same database shares one study per cache key (optuna's
RDBStorage, whose heartbeats let a trial of a killed process be failed and retried) and one winner
per key: the first writer wins, so a fleet agrees on one winner per (problem, shape, machine) key and
the local cache is filled from the database instead of tuned again.

Every statement runs through a pooled engine that pings connections before use, so a database that
restarted is reconnected to on the next statement; a statement cut off by the restart raises one of
``transient_errors()``, which callers that loop (the fleet's workers) catch and retry.
"""
from __future__ import annotations

import dataclasses
import json
import re
import warnings
from typing import TYPE_CHECKING, Any, Mapping

from fusetune.errors import FusetuneError, MissingDependencyError

if TYPE_CHECKING:
    import optuna

    from fusetune.cache import Cache, Entry

#: URL schemes accepted, and the SQLAlchemy dialect+driver each one is run with (psycopg 3).
SCHEMES = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg",
           "postgresql+psycopg": "postgresql+psycopg", "postgresql+psycopg2": "postgresql+psycopg2"}
#: Where the driver comes from, for the error that says what to install.
DRIVER_HINT = "pip install 'fusetune[fleet]' (psycopg)"
#: One advisory-lock number for creating the tables, so that processes starting together do not race.
SCHEMA_LOCK = 0x66757365  # "fuse"

SCHEMA = """
CREATE TABLE IF NOT EXISTS fusetune_winners (
    key        text PRIMARY KEY,
    gpu        text NOT NULL,
    fields     jsonb NOT NULL,
    winner     jsonb NOT NULL,
    written_by text NOT NULL DEFAULT '',
    written_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS fusetune_jobs (
    id          bigserial PRIMARY KEY,
    config_name text NOT NULL,
    config_path text NOT NULL,
    config_text text NOT NULL,
    config_sha  text NOT NULL,
    shape       jsonb NOT NULL,
    gpu         text NOT NULL,
    state       text NOT NULL DEFAULT 'queued',
    worker      text,
    lease_until timestamptz,
    attempts    integer NOT NULL DEFAULT 0,
    key         text,
    message     text NOT NULL DEFAULT '',
    submitted_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    UNIQUE (config_sha, shape, gpu)
);
CREATE INDEX IF NOT EXISTS fusetune_jobs_claim ON fusetune_jobs (gpu, state, id);
"""


class StorageError(FusetuneError):
    """The ``--storage`` URL is not one fusetune can use (exit status 2, like a bad option)."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """How often a running trial or job says it is alive, and how long after its last word it is
    taken for dead: a killed process's trial is then failed and retried, its job claimed again.
    Integers of seconds, as optuna's RDBStorage takes them."""

    interval_s: int = 10
    grace_s: int = 60


def engine_url(url: str) -> str:
    """The SQLAlchemy URL for ``url``: a PostgreSQL URL, run with psycopg 3 unless it names psycopg2."""
    match = re.match(r"^([A-Za-z0-9+]+)://", url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in SCHEMES:
        raise StorageError(f"--storage {redact(url)}: expected a PostgreSQL URL like "
                           "postgresql://user:password@host:5432/database")
    if url.split("?", 1)[0].count("@") > 1:  # SQLAlchemy would split at the first: a wrong host, part of the password
        raise StorageError(f"--storage {redact(url)}: the user or password holds an '@': write it as %40 "
                           "(characters like @ : / in a URL's password are percent-encoded)")
    return SCHEMES[scheme] + url[len(scheme):]


def redact(url: str) -> str:
    """``url`` without its password, for messages: everything from the user's ':' to the last '@'.

    Not SQLAlchemy's ``make_url(url).render_as_string(hide_password=True)``: it splits at the first
    '@', so a password holding an unencoded '@' ("p@ss") would show its tail as part of the host, and
    a URL it cannot parse would raise instead of being shown. Hiding up to the last '@' may hide more
    than the password (an '@' after the host), never less."""
    return re.sub(r"://([^:/@]*):.*@", r"://\1:***@", url)


class Storage:
    """One PostgreSQL database shared by every process that names it."""

    def __init__(self, url: str, heartbeat: Heartbeat = Heartbeat()) -> None:
        import sqlalchemy

        self.url = engine_url(url)
        self.heartbeat = heartbeat
        try:
            self.engine = sqlalchemy.create_engine(self.url, pool_pre_ping=True, pool_size=2, max_overflow=4)
        except ImportError as exc:
            raise MissingDependencyError(f"--storage needs a PostgreSQL driver ({exc}): {DRIVER_HINT}") from None
        self._optuna: Any = None
        try:
            self._create_tables()
        except sqlalchemy.exc.DBAPIError as exc:
            raise FusetuneError(f"cannot use the database {redact(url)}: {first_line(exc)}") from None

    def __repr__(self) -> str:
        return f"Storage({redact(self.url)})"

    def _create_tables(self) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
            for statement in filter(str.strip, SCHEMA.split(";")):
                conn.exec_driver_sql(statement)

    def optuna_storage(self) -> "optuna.storages.RDBStorage":
        """optuna's storage in this database, with heartbeats; a trial whose process died is failed and
        queued again (as a waiting trial with the same choices) by the next process that asks the study
        for a trial. Made once, under the advisory lock: optuna creates its tables on first use."""
        if self._optuna is None:
            import optuna.exceptions
            import optuna.storages as storages

            with warnings.catch_warnings():  # heartbeats are "experimental" in optuna: not a warning per run
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                retry = getattr(storages, "RetryHeartbeatStaleTrialCallback", None)  # optuna >= 4.9
                callback = {"heartbeat_stale_trial_callback": retry()} if retry is not None else \
                    {"failed_trial_callback": storages.RetryFailedTrialCallback()}
                with self.engine.connect() as conn:
                    conn.exec_driver_sql(f"SELECT pg_advisory_lock({SCHEMA_LOCK})")
                    try:
                        self._optuna = storages.RDBStorage(
                            self.url, engine_kwargs={"pool_pre_ping": True},
                            heartbeat_interval=self.heartbeat.interval_s, grace_period=self.heartbeat.grace_s,
                            **callback)
                    finally:
                        conn.exec_driver_sql(f"SELECT pg_advisory_unlock({SCHEMA_LOCK})")
                        conn.commit()
        return self._optuna

    # -- winners ---------------------------------------------------------------------------
    def winner(self, key: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.exec_driver_sql("SELECT winner FROM fusetune_winners WHERE key = %(key)s",
                                       {"key": key}).first()
        return _json(row[0]) if row else None

    def publish(self, key: str, fields: Mapping[str, Any], winner: Mapping[str, Any], *, by: str = "",
                replace: bool = False) -> dict[str, Any]:
        """Store ``winner`` for ``key`` unless one is stored already (or, with ``replace``, over it: a
        forced search); returns the winner the database holds afterwards."""
        conflict = ("DO UPDATE SET winner = EXCLUDED.winner, fields = EXCLUDED.fields, "
                    "written_by = EXCLUDED.written_by, written_at = now()") if replace else "DO NOTHING"
        params = {"key": key, "gpu": str(fields.get("gpu", "")), "fields": json.dumps(fields, default=list),
                  "winner": json.dumps(winner, default=list), "by": by}
        with self.engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO fusetune_winners (key, gpu, fields, winner, written_by) "
                                 "VALUES (%(key)s, %(gpu)s, %(fields)s, %(winner)s, %(by)s) "
                                 f"ON CONFLICT (key) {conflict}", params)
            row = conn.exec_driver_sql("SELECT winner FROM fusetune_winners WHERE key = %(key)s", {"key": key}).first()
        return _json(row[0])

    def winners(self) -> list[dict[str, Any]]:
        """Every stored winner: key, gpu, fields, winner, written_by."""
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT key, gpu, fields, winner, written_by FROM fusetune_winners "
                                        "ORDER BY written_at").all()
        return [{"key": r[0], "gpu": r[1], "fields": _json(r[2]), "winner": _json(r[3]), "written_by": r[4]}
                for r in rows]

    def close(self) -> None:
        self.engine.dispose()
        if self._optuna is not None:
            self._optuna.engine.dispose()


def pull_winner(storage: Storage, cache: "Cache", key: str, fields: Mapping[str, Any],
                entry: "Entry | None") -> "Entry | None":
    """``entry`` (the local cache's, read first) agreed with the database before a search: a local
    winner is published (a host that tuned before it joined, or lost the database as it published,
    shares it now) and the stored one kept where they differ; without a local winner, the database's
    is written into the local cache. None where neither has one."""
    if entry is not None and entry.winner is not None:
        return push_winner(storage, cache, key, fields, replace=False)
    shared = storage.winner(key)
    if shared is None:
        return entry
    return cache.update(key, fields, lambda e: setattr(e, "winner", shared))


def push_winner(storage: Storage, cache: "Cache", key: str, fields: Mapping[str, Any], *, replace: bool,
                by: str = "") -> "Entry | None":
    """Publish the local entry's winner; where another process published first, its winner replaces
    ours locally too (the first writer wins, so every host of the fleet runs the same kernel)."""
    entry = cache.load(key)
    if entry is None or entry.winner is None:
        return entry
    stored = storage.publish(key, entry.fields, entry.winner, by=by, replace=replace)
    if stored != json.loads(json.dumps(entry.winner, default=list)):
        entry = cache.update(key, fields, lambda e: setattr(e, "winner", stored))
    return entry


def transient_errors() -> tuple[type[BaseException], ...]:
    """What a lost or restarted database raises, directly or through optuna (which wraps SQLAlchemy's
    errors, and refuses to finish a trial that another process failed as stale meanwhile)."""
    import optuna.exceptions
    import sqlalchemy.exc

    return (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError,
            optuna.exceptions.UpdateFinishedTrialError)


def database_trouble(exc: BaseException) -> str | None:
    """What to tell the user about ``exc`` if the shared database caused it (it went away, restarted);
    None otherwise. Only asked when a command fails, so it loads nothing that is not loaded already."""
    import sys

    if "sqlalchemy" not in sys.modules or not isinstance(exc, transient_errors()):
        return None
    return (f"the database of --storage failed: {first_line(exc)}; finished trials are stored there: run the "
            "same command to resume")


def first_line(exc: BaseException) -> str:
    """The first line of a database error's message (the driver's, not SQLAlchemy's wrapping)."""
    cause = getattr(exc, "orig", None) or exc.__cause__ or exc
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _json(value: Any) -> Any:
    """A jsonb column's value: psycopg decodes it already; other drivers may hand text."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value
