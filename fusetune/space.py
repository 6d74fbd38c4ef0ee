"""Search spaces, declared as data beside each template (``templates/<family>.yaml``).

The space, its validation and its documentation all come from that one declaration.
Compile-time parameters are instantiated in the module (one variant per combination, chosen
at run time by index); run-time parameters are passed as kernel arguments.
A candidate is a flat dict ``{"<family>.<param>": value}`` over every stage of a plan.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator, Mapping

import yaml

from fusetune.errors import FusetuneError
from fusetune.templates import find_template

Candidate = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    choices: tuple[Any, ...]
    default: Any
    compile_time: bool
    doc: str


@dataclasses.dataclass(frozen=True)
class Constraint:
    expr: str  # Python expression over the parameters and the shape facts
    why: str


@dataclasses.dataclass(frozen=True)
class FamilySpace:
    """The declared space of one template family."""

    family: str
    doc: str
    params: tuple[ParamSpec, ...]
    constraints: tuple[Constraint, ...]

    @property
    def compile_params(self) -> tuple[ParamSpec, ...]:
        return tuple(p for p in self.params if p.compile_time)

    def variants(self) -> list[dict[str, Any]]:
        """Every combination of compile-time parameters, in a fixed order (the variant index)."""
        names = [p.name for p in self.compile_params]
        return [dict(zip(names, combo)) for combo in itertools.product(*(p.choices for p in self.compile_params))]

    def variant_index(self, values: Mapping[str, Any]) -> int:
        key = {p.name: values[p.name] for p in self.compile_params}
        return self.variants().index(key)

    def default(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def size(self) -> int:
        size = 1
        for p in self.params:
            size *= len(p.choices)
        return size


#: The finalize kernel has nothing to tune; it still takes part as a stage.
_FIXED = FamilySpace(family="finalize", doc="norm statistics to affine maps", params=(), constraints=())


def load_family(family: str) -> FamilySpace:
    """Read ``<family>.yaml`` beside the template; a broken declaration is our bug, said plainly."""
    if family == "finalize":
        return _FIXED
    path = find_template(f"{family}.yaml")
    try:
        raw = yaml.safe_load(path.read_text())
        params = tuple(
            ParamSpec(name=name, choices=tuple(d["choices"]), default=d["default"],
                      compile_time=bool(d.get("compile_time", True)), doc=str(d.get("doc", "")))
            for name, d in raw["params"].items())
        constraints = tuple(Constraint(expr=c["expr"], why=c["why"]) for c in raw.get("constraints") or [])
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise FusetuneError(f"{path}: broken template space declaration: {exc!r}") from None
    for p in params:
        if p.default not in p.choices:
            raise FusetuneError(f"{path}: params.{p.name}.default {p.default!r} is not one of its choices")
    return FamilySpace(family=family, doc=str(raw.get("doc", "")).strip(), params=params, constraints=constraints)


@dataclasses.dataclass(frozen=True)
class PlanSpace:
    """The product of the spaces of a plan's stages, with flat ``family.param`` names."""

    families: tuple[FamilySpace, ...]

    def names(self) -> list[str]:
        return [f"{f.family}.{p.name}" for f in self.families for p in f.params]

    def choices(self) -> dict[str, tuple[Any, ...]]:
        return {f"{f.family}.{p.name}": p.choices for f in self.families for p in f.params}

    def default(self) -> Candidate:
        return {f"{f.family}.{k}": v for f in self.families for k, v in f.default().items()}

    def size(self) -> int:
        size = 1
        for f in self.families:
            size *= f.size()
        return size

    def all(self) -> Iterator[Candidate]:
        names = self.names()
        for combo in itertools.product(*self.choices().values()):
            yield dict(zip(names, combo))

    def violations(self, candidate: Mapping[str, Any], facts: Mapping[str, int]) -> list[str]:
        """Constraints the candidate breaks at a shape; empty when it is feasible."""
        broken = []
        shared = {**facts, "layout": candidate.get("producer.layout", "contiguous")}
        for f in self.families:
            names = {p.name: candidate[f"{f.family}.{p.name}"] for p in f.params}
            for c in f.constraints:
                if not eval(c.expr, {"__builtins__": {}}, {**shared, **names}):  # noqa: S307 - our own data
                    broken.append(f"{f.family}: {c.why} ({c.expr})")
        return broken

    def stage_values(self, candidate: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``{"stats": {"block": 256, ...}, ...}``: the per-stage view the generated model takes."""
        return {f.family: {p.name: candidate[f"{f.family}.{p.name}"] for p in f.params} for f in self.families}


def candidate_key(candidate: Mapping[str, Any]) -> str:
    """A stable string for a candidate: what trials and outcomes are keyed on."""
    return ",".join(f"{k}={candidate[k]}" for k in sorted(candidate))
