"""Exceptions that carry enough context to tell the user what to fix."""
from __future__ import annotations


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


class PlanError(FusetuneError):
    """The op chain is valid but no template family can fuse it (yet)."""

    exit_code = 2


class CacheError(FusetuneError):
    """The cache directory cannot be used (permissions, not a directory)."""
