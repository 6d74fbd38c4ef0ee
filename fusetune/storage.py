"""Shared storage on PostgreSQL (``--storage URL``): the optuna studies, the winners, the fleet's jobs.

Without ``--storage`` nothing here is used: studies stay in the local cache's journal files. With it,
every process of every host that names the same database shares one study per cache key (optuna's
RDBStorage, whose heartbeats let a trial of a killed process be failed and retried) and one winner
per key: the first writer wins, so a fleet agrees on one winner per (problem, shape, machine) key and
the local cache is filled from the database instead of tuned again.

Every statement runs through a pooled engine that pings connections before use, so a database that
restarted is reconnected to on the next statement; a statement cut off by the restart raises one of
``transient_errors()``, which callers that loop (the fleet's workers) catch and retry. A deploy's
``Storage(url, lazy=True)`` reads its winners through psycopg alone, in one statement for all its keys,
and makes the engine only where a key misses (``pull_winners``).
"""
from __future__ import annotations

import dataclasses
import json
import re
import warnings
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from fusetune.errors import FusetuneError, MissingDependencyError

if TYPE_CHECKING:
    import optuna
    import sqlalchemy

    from fusetune.cache import Cache, Entry

#: URL schemes accepted, and the SQLAlchemy dialect+driver each one is run with (psycopg 3).
SCHEMES = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg",
           "postgresql+psycopg": "postgresql+psycopg", "postgresql+psycopg2": "postgresql+psycopg2"}
#: Where the driver comes from, for the error that says what to install.
DRIVER_HINT = "pip install 'fusetune[fleet]' (psycopg)"
#: One advisory-lock number for creating the tables, so that processes starting together do not race.
SCHEMA_LOCK = 0x66757365  # "fuse"



@dataclasses.dataclass(frozen=True)
class Table:
    """One table of fusetune's in the database: its name, its columns (name, type and constraints) and the
    table's own constraints and indexes. Its DDL is made of these; statements name it through ``name``."""

    name: str
    columns: tuple[tuple[str, str], ...]
    constraints: tuple[str, ...] = ()
    indexes: tuple[tuple[str, str], ...] = ()  # (index name, "(column, ...)")

    def create(self) -> list[str]:
        """The statements that create the table and its indexes where they do not exist."""
        body = ",\n    ".join([f"{name} {kind}" for name, kind in self.columns] + list(self.constraints))
        return [f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {body}\n)"] + [
            f"CREATE INDEX IF NOT EXISTS {index} ON {self.name} {columns}" for index, columns in self.indexes]


#: One winner per cache key (fusetune.cache.make_key): the first writer's, shared by the fleet.
WINNERS = Table("fusetune_winners", (
    ("key", "text PRIMARY KEY"),
    ("gpu", "text NOT NULL"),
    ("fields", "jsonb NOT NULL"),
    ("winner", "jsonb NOT NULL"),
    ("written_by", "text NOT NULL DEFAULT ''"),
    ("written_at", "timestamptz NOT NULL DEFAULT now()"),
))
#: The fleet's queue of (config, shape, GPU type) jobs (fusetune/fleet.py).
JOBS = Table("fusetune_jobs", (
    ("id", "bigserial PRIMARY KEY"),
    ("config_name", "text NOT NULL"),
    ("config_path", "text NOT NULL"),
    ("config_text", "text NOT NULL"),
    ("config_sha", "text NOT NULL"),
    ("shape", "jsonb NOT NULL"),
    ("gpu", "text NOT NULL"),
    ("state", "text NOT NULL DEFAULT 'queued'"),
    ("worker", "text"),
    ("lease_until", "timestamptz"),
    ("attempts", "integer NOT NULL DEFAULT 0"),
    ("key", "text"),
    ("message", "text NOT NULL DEFAULT ''"),
    ("submitted_at", "timestamptz NOT NULL DEFAULT now()"),
    ("finished_at", "timestamptz"),
), constraints=("UNIQUE (config_sha, shape, gpu)",), indexes=(("fusetune_jobs_claim", "(gpu, state, id)"),))
TABLES = (WINNERS, JOBS)

#: Storage.publish's ``over`` where none is given: a damaged stored winner may be JSON null itself (None).
NOTHING = object()
#: The winners of a list of keys, in one statement (a deploy asks for all of its keys at once).
SELECT_WINNERS = f"SELECT key, winner FROM {WINNERS.name} WHERE key = ANY(%(keys)s)"
#: What every reader of a winner takes from it (search.tune_shape, deploy.load_tuned, export), and its type:
#: a stored winner without one of them (a row written by hand, cut short) is not used, and is searched again.
WINNER_NEEDS: dict[str, type | tuple[type, ...]] = {"candidate": dict, "variant": dict, "time_ms": (int, float)}


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
    """One PostgreSQL database shared by every process that names it.

    ``lazy``: connect through psycopg alone now (so that a database out of reach is said at once), and make
    the SQLAlchemy engine and the tables where a statement first needs them. A deploy whose winners are all
    stored reads them in one query through that connection and never loads SQLAlchemy or optuna (about half
    a second of imports); a key that misses opens the engine as an eager Storage would have."""

    def __init__(self, url: str, heartbeat: Heartbeat = Heartbeat(), *, lazy: bool = False) -> None:
        self.url = engine_url(url)
        self.heartbeat = heartbeat
        self.shown = redact(url)
        self._engine: Any = None
        self._optuna: Any = None
        self._plain: Any = None  # psycopg's connection, where lazy
        if not lazy or self._plain_connection() is None:
            self.engine  # noqa: B018 -- made now: a database out of reach is said here

    def __repr__(self) -> str:
        return f"Storage({redact(self.url)})"

    @property
    def engine(self) -> "sqlalchemy.engine.Engine":
        """The pooled SQLAlchemy engine (connections pinged before use: a restarted database is reconnected
        to), made on first use with the tables under the advisory lock."""
        if self._engine is None:
            import sqlalchemy

            try:
                engine = sqlalchemy.create_engine(self.url, pool_pre_ping=True, pool_size=2, max_overflow=4)
            except ImportError as exc:
                raise MissingDependencyError(f"--storage needs a PostgreSQL driver ({exc}): {DRIVER_HINT}") from None
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
                    for table in TABLES:
                        for statement in table.create():
                            conn.exec_driver_sql(statement)
            except sqlalchemy.exc.DBAPIError as exc:
                engine.dispose()
                raise FusetuneError(f"cannot use the database {self.shown}: {first_line(exc)}") from None
            self._engine = engine
            if self._plain is not None:  # the engine reads from now on: one connection less held on the server
                self._plain.close()
                self._plain = None
        return self._engine

    def _plain_connection(self) -> Any:
        """psycopg's own connection (autocommit: each statement its own transaction), made once, until the
        engine is; None where psycopg 3 is not installed (a psycopg2 URL's host): the engine reads instead."""
        if self._plain is None:
            try:
                import psycopg
            except ImportError:
                return None
            try:
                self._plain = psycopg.connect(libpq_url(self.url), autocommit=True)
            except psycopg.Error as exc:
                raise FusetuneError(f"cannot use the database {self.shown}: {first_line(exc)}") from None
        return self._plain

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
        """The winner stored for ``key`` as it is (usable or not); None where there is none."""
        return self._select([key]).get(key)

    def lookup(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The usable winners (``usable_winner``) stored for ``keys``, by key, read in one statement."""
        return {key: won for key, won in self._select(sorted(set(keys))).items() if usable_winner(won)}

    def _select(self, keys: list[str]) -> dict[str, Any]:
        """SELECT_WINNERS for ``keys``: through psycopg's connection while the engine is not made (a table
        not created yet holds nothing), else through the engine."""
        if not keys:
            return {}
        if self._engine is None and self._plain is not None:
            import psycopg

            try:
                rows = self._plain.execute(SELECT_WINNERS, {"keys": keys}).fetchall()
            except psycopg.errors.UndefinedTable:
                return {}
            except psycopg.Error as exc:
                raise FusetuneError(f"cannot use the database {self.shown}: {first_line(exc)}") from None
        else:
            with self.engine.connect() as conn:
                rows = conn.exec_driver_sql(SELECT_WINNERS, {"keys": keys}).all()
        return {row[0]: _json(row[1]) for row in rows}

    def publish(self, key: str, fields: Mapping[str, Any], winner: Mapping[str, Any], *, by: str = "",
                replace: bool = False, over: Any = NOTHING) -> dict[str, Any]:
        """Store ``winner`` for ``key`` unless one is stored already (or, with ``replace``, over it: a
        forced search; with ``over``, only over that stored winner: a damaged one, replaced by the first
        process that finds it so); returns the winner the database holds afterwards."""
        params = {"key": key, "gpu": str(fields.get("gpu", "")), "fields": json.dumps(fields, default=list),
                  "winner": json.dumps(winner, default=list), "by": by}
        conflict = "DO NOTHING"
        if replace or over is not NOTHING:
            conflict = ("DO UPDATE SET winner = EXCLUDED.winner, fields = EXCLUDED.fields, "
                        "written_by = EXCLUDED.written_by, written_at = now()")
        if over is not NOTHING and not replace:
            conflict += f" WHERE {WINNERS.name}.winner = %(over)s::jsonb"
            params["over"] = json.dumps(over, default=list)
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO {WINNERS.name} (key, gpu, fields, winner, written_by) "
                                 "VALUES (%(key)s, %(gpu)s, %(fields)s, %(winner)s, %(by)s) "
                                 f"ON CONFLICT (key) {conflict}", params)
            row = conn.exec_driver_sql(SELECT_WINNERS, {"keys": [key]}).first()
        return _json(row[1])

    def winners(self) -> list[dict[str, Any]]:
        """Every stored winner: key, gpu, fields, winner, written_by."""
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(f"SELECT key, gpu, fields, winner, written_by FROM {WINNERS.name} "
                                        "ORDER BY written_at").all()
        return [{"key": r[0], "gpu": r[1], "fields": _json(r[2]), "winner": _json(r[3]), "written_by": r[4]}
                for r in rows]

    def close(self) -> None:
        if self._plain is not None:
            self._plain.close()
        if self._engine is not None:
            self._engine.dispose()
        if self._optuna is not None:
            self._optuna.engine.dispose()


def libpq_url(url: str) -> str:
    """``url`` (an ``engine_url``) as libpq and psycopg.connect take it: the scheme without its driver."""
    return "postgresql" + url[url.index("://"):]


def usable_winner(winner: Any) -> bool:
    """Whether a stored winner holds what its readers take (WINNER_NEEDS), each of its type."""
    return isinstance(winner, dict) and all(isinstance(winner.get(name), kind) and not isinstance(winner[name], bool)
                                            for name, kind in WINNER_NEEDS.items())


def pull_winners(storage: Storage, cache: "Cache", fields: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The keys of ``fields`` (key -> its fields) whose winner the database holds, looked up in one statement
    and written into the local cache where its entry differs (the first writer wins: a local winner of
    another candidate is replaced, as ``push_winner`` would). Of the other keys nothing is written: a local
    winner of one is published by ``pull_winner`` when its shape is reached."""
    shared = storage.lookup(fields)
    for key, won in shared.items():
        entry = cache.load(key)
        if entry is None or entry.winner != won:
            cache.update(key, fields[key], lambda e, won=won: setattr(e, "winner", won))
    return set(shared)


def pull_winner(storage: Storage, cache: "Cache", key: str, fields: Mapping[str, Any],
                entry: "Entry | None") -> "Entry | None":
    """``entry`` (the local cache's, read first) agreed with the database before a search: a local
    winner is published (a host that tuned before it joined, or lost the database as it published,
    shares it now) and the stored one kept where they differ; without a local winner, the database's
    (where usable) is written into the local cache. None where neither has one."""
    if entry is not None and entry.winner is not None:
        return push_winner(storage, cache, key, fields, replace=False)
    shared = storage.lookup([key]).get(key)
    if shared is None:
        return entry
    return cache.update(key, fields, lambda e: setattr(e, "winner", shared))


def push_winner(storage: Storage, cache: "Cache", key: str, fields: Mapping[str, Any], *, replace: bool,
                by: str = "") -> "Entry | None":
    """Publish the local entry's winner; where another process published first, its winner replaces
    ours locally too (the first writer wins, so every host of the fleet runs the same kernel). A stored
    winner that is not usable is replaced by ours (by the first process to find it so)."""
    entry = cache.load(key)
    if entry is None or entry.winner is None:
        return entry
    stored = storage.publish(key, entry.fields, entry.winner, by=by, replace=replace)
    if not usable_winner(stored):
        stored = storage.publish(key, entry.fields, entry.winner, by=by, over=stored)
    if usable_winner(stored) and stored != json.loads(json.dumps(entry.winner, default=list)):
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
    """A jsonb column's value: psycopg decodes it already; other drivers may hand text. Text that is no JSON is a
    damaged row's value as it is (usable_winner refuses it: searched again), never an error."""
    if not isinstance(value, (str, bytes)):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value
