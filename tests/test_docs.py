"""The README's op table and config schema name the whole vocabulary: every op of the registry and
every producer kind, so the documentation cannot fall behind what a config may write."""
from __future__ import annotations

import re

from fusetune.ops import REGISTRY
from fusetune.producers import KINDS

from conftest import ROOT


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_readme_op_table_lists_every_op_of_the_registry():
    table = _section((ROOT / "README.md").read_text(), "Ops")
    named = set(re.findall(r"`([a-z_0-9]+)`", table))
    assert set(REGISTRY) - named == set(), "ops missing from README.md's op table"
    assert named - set(REGISTRY) - {"producer"} == set(), "README.md's op table names ops the registry lacks"


def test_the_readme_schema_names_every_producer_kind():
    schema = _section((ROOT / "README.md").read_text(), "Config schema")
    for kind in KINDS:
        stem, dims = kind[:-2], kind[-2]
        assert kind in schema or re.search(rf"{stem}(\dd/)*{dims}d", schema), kind  # conv1d/2d/3d


def test_the_readme_is_read_in_minutes():
    """Issue 27: a user reads the README in three minutes; the design and the details live in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move details to docs/design.md"
