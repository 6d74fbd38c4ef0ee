"""The one Jinja environment: templates are files under ``templates/``, undefined is an error."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import jinja2

from fusetune.errors import FusetuneError


def template_dir() -> Path:
    """``$FUSETUNE_TEMPLATES`` if set, else the ``templates/`` folder of this checkout."""
    override = os.environ.get("FUSETUNE_TEMPLATES")
    path = Path(override) if override else Path(__file__).resolve().parent.parent / "templates"
    if not path.is_dir():
        raise FusetuneError(f"template folder {path} not found; install fusetune from a checkout "
                            "(pip install -e .) or set FUSETUNE_TEMPLATES")
    return path


def search_path() -> list[Path]:
    """``templates/`` first, then the folders in ``$FUSETUNE_TEMPLATE_PATH`` (extra families)."""
    extra = [Path(p) for p in os.environ.get("FUSETUNE_TEMPLATE_PATH", "").split(os.pathsep) if p]
    return [template_dir(), *extra]


def find_template(name: str) -> Path:
    for root in search_path():
        if (root / name).is_file():
            return root / name
    raise FusetuneError(f"no template file {name} in {', '.join(map(str, search_path()))}")


def environment() -> jinja2.Environment:
    return _environment(tuple(str(p) for p in search_path()))


@functools.lru_cache(maxsize=4)
def _environment(roots: tuple[str, ...]) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(list(roots)),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


