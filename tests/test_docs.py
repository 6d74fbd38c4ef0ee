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


def test_the_design_json_section_names_every_field_plan_prints():
    """README.md sends a reader of `--json` to docs/design.md's "JSON": every field of `plan --json` (a seed,
    a chain with later regions in PyTorch and in the kernels, one with a broadcast input) is named there."""
    import json

    from click.testing import CliRunner

    from fusetune.cli import main

    configs = [ROOT / "configs" / "conv2d_groupnorm_scale_maxpool_clamp.yaml",
               ROOT / "tests" / "centring" / "centre_channels_pytorch.yaml",
               ROOT / "tests" / "broadcast_input" / "conv2d_add_temb_silu.yaml"]
    result = CliRunner().invoke(main, ["plan", "--json", *map(str, configs)])
    assert result.exit_code == 0, result.output
    documents = json.loads(result.stdout)
    fields = {k for d in documents for k in d} | {k for d in documents for r in d["later"] for k in r} | {
        k for d in documents for step in d["fused"] for k in step}
    assert {"later", "input_kinds", "why", "tuned_as", "entries"} <= fields  # the three configs show every kind
    section = _section((ROOT / "docs" / "design.md").read_text(), "JSON")
    named = set(re.findall(r"[a-z_]+", section.split("`plan`", 1)[1].split("`search`", 1)[0]))
    assert fields - named == set(), "fields of `fusetune plan --json` that docs/design.md's JSON section omits"
