"""Every world of the registry (fusetune/worlds/), run over the chain corpus: one module each, a doc,
stages that are declared kernel families, a reason wherever it is not offered, and the facts its
stages' spaces read. What names worlds elsewhere (producer.impl's choices, the docs) derives from or
agrees with the registry."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

from fusetune.codegen import plan_facts, plan_space
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.worlds.base import LAUNCHES
from fusetune.search import shape_facts
from fusetune.space import load_family
from fusetune.templates import template_dir
from fusetune.worlds import DEFAULT, WORLDS, World, offered, refusals

from conftest import ROOT

CHAINS = sorted((ROOT / "tests" / "chains").glob("*.yaml")) + sorted((ROOT / "configs").glob("*.yaml"))
#: Names a space expression may read besides the plan's facts, the shape's and its own family's parameters.
PRODUCER_CHOICES = ("impl", "layout", "store", "form")


@pytest.fixture(scope="module")
def plans():
    return {path.stem: make_plan(load_config(path)) for path in CHAINS}


@pytest.mark.parametrize("name", list(WORLDS))
def test_every_world_is_a_module_of_its_own_with_its_data(name):
    world = WORLDS[name]
    assert isinstance(world, World) and world.name == name
    assert type(world).__module__ == f"fusetune.worlds.{name}"
    assert importlib.import_module(f"fusetune.worlds.{name}")
    assert world.doc.strip() and "\n" not in world.doc  # one line, for docs and `fusetune plan`
    assert isinstance(world.computes_conv_inside, bool) and world.min_sm in (0, 80, 90)
    assert "float32" in world.dtypes
    assert world.launch in LAUNCHES
    # the worlds without kernels of fusetune's run the reference (eager: as it is; inductor: compiled, in
    # its mode), and only a compiler's world needs time beyond the job timeout to warm up
    assert world.runs_reference == (world.launch in ("eager", "inductor"))
    assert (world.compile_mode is not None) == (world.launch == "inductor") == (world.warmup_s > 0)


def test_each_chain_is_offered_or_refused_with_why_by_every_world(plans):
    declared = {p.stem for p in template_dir().glob("*.yaml")} | {"finalize"}  # finalize: nothing to tune
    for chain, plan in plans.items():
        stages, why = offered(plan), refusals(plan)
        assert set(stages) | set(why) == set(WORLDS) and not set(stages) & set(why), chain
        assert DEFAULT in stages and stages["eager"] == stages["inductor"] == stages["inductor_default"] == (), chain
        assert all(reason.strip() for reason in why.values()), (chain, why)
        for name, world_stages in stages.items():
            assert WORLDS[name].own_kernels == bool(world_stages), (chain, name)
            assert set(world_stages) <= declared, (chain, name, world_stages)
            assert all((template_dir() / f"{s}.cu.j2").is_file() for s in world_stages), (chain, name)
        assert plan.impl_stages == stages and list(plan.impl_stages) == [w for w in WORLDS if w in stages]


EXPECTED = yaml.safe_load((ROOT / "tests" / "worlds_expected.yaml").read_text())


@pytest.mark.parametrize("entry", EXPECTED, ids=lambda e: Path(e["config"]).stem)
def test_which_worlds_take_a_chain_and_why_not_match_the_reviewed_table(entry):
    """Seeds, their float16, bfloat16 and precision-ieee variants and a few chains: the worlds offered,
    in order, and why each other one is not (its reason's first words), as tests/worlds_expected.yaml
    records them."""
    plan = make_plan(load_config(ROOT / entry["config"]))
    assert list(offered(plan)) == entry["offered"]
    why = refusals(plan)
    assert set(why) == set(entry["refused"])
    for name, start in entry["refused"].items():
        assert why[name].startswith(start), (name, why[name])


def test_producer_impl_choices_and_constraints_come_from_the_registry(plans):
    for chain, plan in plans.items():
        producer = plan_space(plan).families[0]
        impl = producer.params[0]
        assert producer.family == "producer" and impl.name == "impl" and list(impl.choices) == list(WORLDS)
        assert impl.default == DEFAULT == next(iter(WORLDS))  # the registry's first: cudnn
        exprs = {c.expr: c.why for c in producer.constraints}
        for name, reason in refusals(plan).items():
            assert exprs[f"impl != {name!r}"].endswith(reason), (chain, name)
        for name, world in WORLDS.items():
            if world.min_sm and name in plan.impl_stages:
                assert any(name in expr and f"sm >= {world.min_sm}" in expr for expr in exprs), (chain, name)


def test_stages_run_exactly_under_the_worlds_that_launch_them(plans):
    """A stage's space is active under a candidate exactly where the candidate's world runs it."""
    for chain, plan in plans.items():
        space = plan_space(plan)
        for name, stages in plan.impl_stages.items():
            candidate = space.canonical({**space.default(), "producer.impl": name})
            active = {f.family for f in space.active(candidate)} - {"producer"}
            assert active == set(stages), (chain, name, active, stages)


def _names(expr: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(expr, mode="eval")) if isinstance(node, ast.Name)}


def test_the_facts_a_worlds_stages_read_exist(plans):
    for chain, plan in plans.items():
        spec = plan.spec
        known = {**plan_facts(plan), **shape_facts(spec, plan, spec.shapes[0], "9.0")}
        for name, stages in plan.impl_stages.items():
            for stage in stages:
                family = load_family(stage)
                own = {p.name for p in family.params}
                exprs = [c.expr for c in family.constraints] + [p.when for p in family.params if p.when]
                exprs += [family.compile_if] if family.compile_if else []
                for expr in exprs:
                    missing = _names(expr) - own - set(known) - set(PRODUCER_CHOICES)
                    assert not missing, (chain, name, stage, expr, missing)


def test_the_design_docs_world_table_is_the_registrys():
    """docs/design.md's table of worlds: every world of the registry, in its order, with its doc."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## Worlds\n"):design.index("\n## ", design.index("## Worlds\n") + 1)]
    rows = re.findall(r"^\| `(\w+)` \| (any|sm_\d+\+) \| (.+) \|$", section, re.M)
    assert rows == [(name, f"sm_{w.min_sm}+" if w.min_sm else "any", w.doc) for name, w in WORLDS.items()]


def test_every_world_file_is_registered():
    modules = {p.stem for p in Path(importlib.import_module("fusetune.worlds").__file__).parent.glob("*.py")}
    assert modules - {"__init__", "base", "facts"} == set(WORLDS)


def test_two_worlds_may_not_name_one_fact(plans, monkeypatch):
    """The worlds' facts are one namespace that the stages' spaces read by name: a second world defining
    a fact of the same name is refused, not silently merged over the first."""
    from fusetune.worlds import all_facts

    plan = plans["conv2d_groupnorm_scale_maxpool_clamp"]
    owner = next(w for w in WORLDS.values() if w.facts(plan))
    other = next(w for w in WORLDS.values() if w is not owner)
    monkeypatch.setattr(type(other), "facts", lambda self, plan_: dict(owner.facts(plan_)))
    with pytest.raises(AssertionError, match="redefines facts"):
        all_facts(plan)
