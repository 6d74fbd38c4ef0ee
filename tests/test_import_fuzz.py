"""The importer on random KernelBench-style models (tests/model_fuzz.py): every model imports, nothing the importer
builds is refused by a failure of its own, every config plans, each op left in PyTorch says why, and each chain's
generated reference Model, given the user's tensors, computes the user's value in float64 on fresh inputs.

A failure prints the seed and the model's source; ``python tests/model_fuzz.py SEED`` prints it again. Hunting:
``FUSETUNE_FUZZ_SEEDS=1000-1300 python -m pytest -q tests/test_import_fuzz.py -k random`` runs other seeds.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from fusetune.config import load_config
from fusetune.importer import import_model
from fusetune.plan import make_plan

from model_fuzz import FORMS, PRODUCERS, STRIDE, generate
from test_import import _intermediates, chain_outputs


#: The default seeds: those that draw every row of the table (model_fuzz.STRIDE), and a few drawn wholly at random
#: (models of one op among them).
DEFAULT_SEEDS = range(STRIDE + 8)


def _seeds() -> list[int]:
    """The seeds: FUSETUNE_FUZZ_SEEDS (``A-B``, B excluded, or a comma list) where set, else DEFAULT_SEEDS."""
    spec = os.environ.get("FUSETUNE_FUZZ_SEEDS")
    if not spec:
        return list(DEFAULT_SEEDS)
    if "-" in spec:
        first, last = spec.split("-")
        return list(range(int(first), int(last)))
    return [int(s) for s in spec.split(",")]


SEEDS = _seeds()

#: What the importer says where it caught a failure of its own (an exception in matching a producer, walking a
#: chain, a builder, writing or planning a config): a bug of the importer, never a reason for an op to stay in PyTorch.
SWALLOWED = re.compile(r"its arguments could not be read|the importer could not follow its output|"
                       r"writing its config failed|the planner fails on it|"
                       r"its arguments are not in the vocabulary \(\w+(Error|Exception)")


def test_the_seeds_draw_every_form_and_producer() -> None:
    """The default seeds cover the vocabulary's spellings (a row no seed draws is tested by none) and every kind of
    convolution, and some models have one op."""
    drawn = [generate(seed) for seed in DEFAULT_SEEDS]
    assert any(len(g.forms) == 1 for g in drawn)
    assert {p.name for p in PRODUCERS} <= {g.producer for g in drawn}
    missing = {f.name for f in FORMS} - {name for g in drawn for name in g.forms}
    assert not missing, missing


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_model_imports_into_chains_that_compute_it(seed: int, tmp_path: Path) -> None:
    generated = generate(seed)
    print(f"seed {seed}; the model (python tests/model_fuzz.py {seed}):\n{generated.source}")
    path = tmp_path / f"fuzz{seed}.py"
    path.write_text(generated.source)
    result = import_model(str(path), tmp_path / "out")
    doc = json.loads(result.map_path.read_text())
    assert all(isinstance(why, str) and why for why in doc["pytorch"].values())  # each op in PyTorch says why
    swallowed = {node: why for node, why in doc["pytorch"].items() if SWALLOWED.search(why)}
    assert not swallowed
    if not doc["chains"]:
        return
    torch.manual_seed(seed)
    user = result.loaded.model.double()  # the user's model, untouched by the import (which traced a copy)
    inputs = [torch.randn_like(x, dtype=torch.float64) for x in result.loaded.inputs]  # fresh, not the example's
    gm = result.gm.double()  # the import's trace: its nodes are the map's
    values = _intermediates(gm, user, inputs)
    for i, chain in enumerate(doc["chains"]):
        spec = load_config(Path(chain["config"]))
        make_plan(spec)  # plans (chain_outputs renders the plan again)
        for name, got, expected in chain_outputs(chain, spec, user, gm, values, tmp_path / f"gen{i}"):
            assert got.shape == expected.shape, (chain["config"], name)
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10, msg=lambda m: f"chain{i} {name}: {m}")
