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


def did_you_mean(word: object, choices: "Iterable[str]") -> str:
    """``; did you mean 'gelu'?`` where ``word`` is a near miss of one of ``choices``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


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
