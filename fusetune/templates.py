"""The one Jinja environment: templates are files under ``templates/``, undefined is an error."""
from __future__ import annotations

import functools
import hashlib
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


@functools.lru_cache(maxsize=4)
def environment(root: str | None = None) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(root or str(template_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def source_hash(names: list[str]) -> str:
    """Hash of template files' text: part of every cache key, so editing a template invalidates."""
    digest = hashlib.sha256()
    root = template_dir()
    for name in sorted(names):
        digest.update(name.encode())
        digest.update((root / name).read_bytes())
    return digest.hexdigest()[:16]
