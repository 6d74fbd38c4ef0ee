"""Exceptions that carry enough context to tell the user what to fix."""
from __future__ import annotations

from typing import Iterable


class FusetuneError(Exception):
    """Base class for errors fusetune reports to the user (exit status 1 unless noted)."""

    exit_code = 1


class ConfigError(FusetuneError):
    """A config file is malformed: names the file, the key path and what was expected.

    Exit status 2, like a usage error: nothing was tuned or written.
    """

    exit_code = 2

    def __init__(self, path: str, key: str, message: str) -> None:
        self.path = str(path)
        self.key = key
        self.message = message
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {message}")


def count(n: int, noun: str) -> str:
    """``1 channel``, ``3 channels``: a count as a message reads it (a channel reduction leaves 1)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _folded(word: object) -> str:
    """``word`` as compared for a suggestion: PyTorch's spellings (``ReLU``, ``GroupNorm``, ``group-norm``)
    are near misses of ours (``relu``, ``group_norm``) in case and separators only."""
    return str(word).lower().replace("_", "").replace("-", "")


def closest(word: object, choices: "Iterable[str]") -> str | None:
    """The one of ``choices`` that ``word`` is a near miss of, if any.

    Compared without case and separators, so that ``Relu`` finds ``relu`` (not ``elu``, nearer letter by
    letter) and ``GroupNorm`` finds ``group_norm``."""
    import difflib

    by_folded: dict[str, str] = {}
    for choice in choices:
        by_folded.setdefault(_folded(choice), choice)
    close = difflib.get_close_matches(_folded(word), list(by_folded), n=1, cutoff=0.6)
    return by_folded[close[0]] if close else None


def did_you_mean(word: object, choices: "Iterable[str]") -> str:
    """``; did you mean 'gelu'?`` where ``word`` is a near miss of one of ``choices``, else ``""``."""
    return suggestion(closest(word, choices))


def suggestion(name: str | None) -> str:
    """``; did you mean 'name'?``, the end of a message, or ``""`` without a name (a near miss's, or a table's:
    dtypes.alias_of)."""
    return f"; did you mean '{name}'?" if name is not None else ""


#: How many cached names a message offers at most (a short prefix may start hundreds).
NAMES_SHOWN = 5


def no_cache_entry(target: str, names: "Iterable[str]") -> str:
    """Why no cache entry matches ``target`` (a key prefix or a config name, as ``cache show``, ``cache clear``
    and ``report`` take it), with the names cached that it may have meant: a config name is matched
    whole, so a prefix of one (``conv2d_groupnorm`` for ``conv2d_groupnorm_scale_maxpool_clamp``) names
    the names it starts."""
    known = sorted(set(names))
    started = [name for name in known if name.startswith(target)]
    if len(started) == 1:
        hint = f"; a config name is matched whole: did you mean '{started[0]}'?"
    elif started:
        more = f" (and {len(started) - NAMES_SHOWN} more)" if len(started) > NAMES_SHOWN else ""
        hint = f"; a config name is matched whole: did you mean one of {', '.join(started[:NAMES_SHOWN])}{more}?"
    else:
        hint = did_you_mean(target, known)
    return f"no cache entry matches {target!r} (see `fusetune cache list`){hint}"


class PlanError(FusetuneError):
    """The op chain is valid but no template family can fuse it (yet)."""

    exit_code = 2


class CacheError(FusetuneError):
    """The cache directory cannot be used (permissions, not a directory)."""


class NoGpuError(FusetuneError):
    """No CUDA GPU can be used here (a CPU-only torch, no device visible): exit status 3, so that a
    script can tell "run this elsewhere" from a failed search."""

    exit_code = 3


class MissingDependencyError(FusetuneError):
    """An optional package a command needs is not installed (exit status 1): names the extra to install."""


#: What ``fusetune`` exits with, for ``fusetune -h`` and the README (tests check each path).
EXIT_CODES = {
    0: "success (a deploy that falls back to eager PyTorch too, unless --strict)",
    1: "a search found no verified candidate, a deploy --strict fell back, or another error",
    2: "bad input: a config, option, argument, path or glob; nothing was tuned or written",
    3: "no usable CUDA GPU (a CPU-only torch build, or no device visible)",
    130: "interrupted (Ctrl-C); finished trials are kept",
}
