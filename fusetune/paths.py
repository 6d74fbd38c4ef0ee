"""Config arguments as a user types them: files, folders of configs, or glob patterns.

``fusetune search configs/`` and ``fusetune search 'configs/*.yaml'`` mean every config found,
in sorted order, so that a run over a folder is repeatable. A folder or pattern that finds
nothing is bad input (exit 2), named, rather than a search of nothing that looks like success.
"""
from __future__ import annotations

import glob
from pathlib import Path
from typing import Iterable

from fusetune.errors import ConfigError, closest

#: What a folder's configs are called (as in tune-on-deploy).
CONFIG_SUFFIXES = (".yaml", ".yml")
GLOB_CHARS = frozenset("*?[")


def configs_in(folder: Path) -> list[Path]:
    """The configs directly in ``folder``, sorted."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in CONFIG_SUFFIXES)


def expand_configs(arguments: Iterable[str]) -> list[str]:
    """Each argument's configs in order, each file once: a folder's configs, a pattern's matches
    (sorted), or the argument itself (one that names nothing is refused, with the config it may have meant)."""
    found: list[str] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            matches = [str(p) for p in configs_in(path)]
            if not matches:
                raise ConfigError(argument, "", f"no configs ({', '.join('*' + s for s in CONFIG_SUFFIXES)}) "
                                                "in this folder")
        elif not path.exists() and GLOB_CHARS & set(argument):
            matches = sorted(p for p in glob.glob(argument) if Path(p).is_file())
            if not matches:
                raise ConfigError(argument, "", "no file matches this pattern")
        elif not path.exists():
            raise ConfigError(argument, "", missing(path))
        else:
            matches = [argument]
        found += [m for m in matches if m not in found]
    return found


def missing(path: Path) -> str:
    """What to say of a config argument that names nothing: the config beside it it may have meant
    (``my.yml`` for ``my.yaml``, ``conv2d_relu.yaml`` for ``conv2d_rleu.yaml``), or the folder that is
    missing too."""
    folder = path.parent
    if not folder.is_dir():
        return f"no such file: the folder {folder} does not exist either"
    near = closest(path.name, [p.name for p in configs_in(folder)])
    return "no such file" + (f"; did you mean {folder / near}?" if near else "")


def read_bytes(path: Path, where: str) -> bytes:
    """A file's bytes; where it cannot be read, a ConfigError naming ``where`` and the system's reason."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read the file: {exc.strerror or exc}") from None


def decode_text(data: bytes, where: str, encoding: str, after: str) -> str:
    """``data`` as text in ``encoding``; where it is not, a ConfigError naming ``where``, the first bad byte, its
    offset and its line (what an editor needs to find it), then ``after`` (why it matters, what to do)."""
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        name = "UTF-8" if encoding.replace("_", "-").lower().startswith("utf-8") else encoding
        raise ConfigError(where, "", f"not {name} text: byte 0x{data[exc.start]:02x} at byte offset {exc.start} "
                                     f"(line {line}) is not valid {name}{after}") from None

