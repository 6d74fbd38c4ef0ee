"""The on-disk cache: winners and every trial's outcome, keyed so that a result is reused
only where it is valid.

Layout under the cache root::

    entries/<key>.json     one shape of one problem on one software/hardware stack
    studies/<key>.journal  the optuna study of that shape (journal storage: resumable,
                           safe for several processes)
    modules/<name>/        rendered sources (<stage>.cu, binding.cpp, model.py)
    builds/<name>/         extension build directories, one per module
    locks/                 fcntl lock files

Every write goes to a temporary file and is renamed into place under an exclusive lock,
so readers never see half a file and concurrent searches merge instead of overwriting.
An unreadable entry is a miss, with a warning: it is never fatal.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from fusetune.errors import CacheError

SCHEMA = 1


class CacheWarning(UserWarning):
    """Something in the cache was unreadable and is ignored (a miss): never fatal. The command line
    prints these as one ``fusetune: warning: ...`` line."""


STATUSES = ("ok", "compile_error", "launch_error", "crash", "timeout", "wrong_result", "infeasible")


def default_root() -> Path:
    """``$FUSETUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fusetune``, else ``~/.cache/fusetune``."""
    if os.environ.get("FUSETUNE_CACHE_DIR"):
        return Path(os.environ["FUSETUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fusetune"


def make_key(fields: Mapping[str, Any]) -> str:
    """Hash of the canonical JSON of every field that can change a tuned result."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclasses.dataclass
class Entry:
    """What is known about one key: its fields, each candidate's outcome, and the winner."""

    key: str
    fields: dict[str, Any]
    outcomes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    winner: dict[str, Any] | None = None
    updated: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "key": self.key, "fields": self.fields, "outcomes": self.outcomes,
                "winner": self.winner, "updated": self.updated}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Entry":
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
        return cls(key=str(data["key"]), fields=dict(data["fields"]), outcomes=dict(data["outcomes"]),
                   winner=data.get("winner"), updated=float(data.get("updated", 0.0)))

    def best_ok(self) -> tuple[str, dict[str, Any]] | None:
        oks = [(k, o) for k, o in self.outcomes.items() if o.get("status") == "ok"]
        return min(oks, key=lambda item: item[1]["time_ms"]) if oks else None


class Cache:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        try:
            for sub in ("entries", "studies", "modules", "builds", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cache directory {self.root} is not usable: {exc.strerror or exc}") from None

    # -- paths ---------------------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        return self.root / "entries" / f"{key}.json"

    def study_path(self, key: str) -> Path:
        return self.root / "studies" / f"{key}.journal"

    def module_dir(self, name: str) -> Path:
        return self.root / "modules" / name

    def build_dir(self, name: str) -> Path:
        return self.root / "builds" / name

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive inter-process lock; released by the kernel if the holder dies."""
        path = self.root / "locks" / f"{name}.lock"
        with open(path, "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # -- entries -------------------------------------------------------------------------
    def load(self, key: str) -> Entry | None:
        """The entry for ``key``; None if absent or unreadable (with a warning)."""
        path = self.entry_path(key)
        if not path.exists():
            return None
        try:
            return Entry.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            warnings.warn(f"fusetune: ignoring unreadable cache entry {path} ({exc}); it will be rewritten",
                          CacheWarning, stacklevel=2)
            return None

    def update(self, key: str, fields: Mapping[str, Any], change: Callable[[Entry], None]) -> Entry:
        """Read-modify-write one entry under its lock, written atomically."""
        with self.lock(key):
            entry = self.load(key) or Entry(key=key, fields=dict(fields))
            change(entry)
            entry.updated = time.time()
            atomic_write_text(self.entry_path(key), json.dumps(entry.to_json(), indent=1, sort_keys=True))
            return entry

    def record(self, key: str, fields: Mapping[str, Any], candidate_key: str, outcome: Mapping[str, Any]) -> Entry:
        if outcome.get("status") not in STATUSES:
            raise ValueError(f"unknown outcome status {outcome.get('status')!r}")

        def change(entry: Entry) -> None:
            entry.outcomes[candidate_key] = dict(outcome)
        return self.update(key, fields, change)

    def entries(self) -> list[Entry]:
        out = []
        for path in sorted((self.root / "entries").glob("*.json")):
            entry = self.load(path.stem)
            if entry is not None:
                out.append(entry)
        return out

    def find(self, prefix: str) -> list[Entry]:
        return [e for e in self.entries() if e.key.startswith(prefix) or e.fields.get("problem_name") == prefix]

    def clear(self, keys: list[str] | None = None) -> int:
        """Remove the given entries (and their studies), or everything. Returns how many entries."""
        if keys is None:
            count = len(list((self.root / "entries").glob("*.json")))
            for sub in ("entries", "studies", "modules", "builds"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            return count
        for key in keys:
            with self.lock(key):
                self.entry_path(key).unlink(missing_ok=True)
                self.study_path(key).unlink(missing_ok=True)
        return len(keys)


def repair_journal(path: Path, settle_s: float = 0.2) -> bool:
    """Cut an optuna journal back to its longest readable prefix of log lines; True if it was cut.

    A journal truncated mid-line (a full disk, a killed copy) or with garbage in it makes optuna raise
    on the next read or append; its readable prefix is a consistent earlier state of the study. A last
    line without its newline may be a write in progress in another process: it is read again after
    ``settle_s`` before it is treated as broken.
    """
    def first_bad(data: bytes) -> int | None:
        offset = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                return offset
            try:
                json.loads(line)
            except ValueError:  # JSONDecodeError and UnicodeDecodeError
                return offset
            offset += len(line)
        return None

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    bad = first_bad(data)
    if bad is None:
        return False
    if b"\n" not in data[bad:]:  # only the last line is incomplete: perhaps a write in progress
        time.sleep(settle_s)
        data = path.read_bytes()
        bad = first_bad(data)
        if bad is None:
            return False
    warnings.warn(f"fusetune: study journal {path} is unreadable from byte {bad} of {len(data)}; "
                  f"keeping its readable part (finished trials after that point are searched again)",
                  CacheWarning, stacklevel=2)
    atomic_write_bytes(path, data[:bad])
    return True


def _read_umask() -> int:
    """The process's umask, read by setting it and back: done once, at import, before any thread of ours
    could create a file under the value set in between."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def usual_mode(folder: bool = False) -> int:
    """The mode ``open`` or ``mkdir`` would give a new file or folder under the umask. ``mkstemp`` and ``mkdtemp``
    create theirs 0600 and 0700, which a file renamed into place keeps: configs, exports and cache entries that
    a service account or a colleague could not read."""
    return (0o777 if folder else 0o666) & ~_UMASK


def atomic_write_bytes(path: Path, data: bytes, check: Callable[[Path], None] | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new, never a mix: a temporary
    file beside it, flushed to disk, renamed over it, with the mode a plain write would give it. ``check``
    reads the temporary file before the rename; what it raises leaves ``path`` as it was (an imported
    config that does not validate is never written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, usual_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, check: Callable[[Path], None] | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that readers see the old file or the new, never a mix."""
    atomic_write_bytes(path, text.encode("utf-8"), check)
