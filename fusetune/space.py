"""Search spaces, declared as data beside each template (``templates/<family>.yaml``).

The space, its validation and its documentation all come from that one declaration.
Compile-time parameters are instantiated in the module (one variant per combination, chosen
at run time by index); run-time parameters are passed as kernel arguments.
A candidate is a flat dict ``{"<family>.<param>": value}`` over every stage of a plan.

A family (or one parameter) may declare ``when``: an expression over the producer's choices
(``impl``, ``layout``) and the plan's facts (``family``, ``direct``, ``gemm``, ``spectral``, ... : all
of codegen.plan_facts) under which it matters at all. Where it does not, the candidate is
canonical with the declared default there, so the search never times the same kernels twice
under two names (cuDNN's layout means nothing to a kernel that computes the convolution itself).
A stage family's own ``when`` comes from the worlds (codegen.plan_space): it matters where the chosen
world's stages hold it; the producer's ``impl`` and its constraints come from fusetune.worlds too.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from types import CodeType
from typing import Any, Iterable, Iterator, Mapping

import yaml

from fusetune.errors import FusetuneError
from fusetune.templates import find_template
from fusetune.worlds import DEFAULT as DEFAULT_WORLD

Candidate = dict[str, Any]


@functools.lru_cache(maxsize=None)
def _code(expr: str) -> CodeType:
    """An expression compiled once: a search checks every candidate of a space against the same few
    dozen (tens of thousands of candidates for the K-tiled worlds), and parsing them each time took
    most of that."""
    return compile(expr, "<space expression>", "eval")


def _holds(expr: str, names: Mapping[str, Any]) -> bool:
    return bool(eval(_code(expr), {"__builtins__": {}}, names))  # noqa: S307 - our own data


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    choices: tuple[Any, ...]
    default: Any
    compile_time: bool
    doc: str
    when: str | None = None  # expression over the producer's choices: where this parameter matters


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
    when: str | None = None  # expression over the producer's choices: where this family runs
    compile_if: str | None = None  # expression over a variant, C and the plan's facts: worth compiling

    def compiles(self, variant: Mapping[str, Any], names: Mapping[str, Any]) -> bool:
        """Whether a compile-time variant is built for a plan (``names``: C and the plan's facts);
        the others break the family's constraints for every shape of that plan."""
        return self.compile_if is None or _holds(self.compile_if, {**names, **variant})

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
    """Read ``<family>.yaml`` beside the template; a broken declaration is our bug, said plainly.
    Read once per file version (its path, size and modification time): every render of a plan reads
    its families again, and parsing them was most of a warm ``fusetune.optimize``."""
    if family == "finalize":
        return _FIXED
    path = find_template(f"{family}.yaml")
    try:
        stat = path.stat()
    except OSError as exc:
        raise FusetuneError(f"{path}: broken template space declaration: {exc!r}") from None
    return _read_family(family, path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _read_family(family: str, path: Path, mtime_ns: int, size: int) -> FamilySpace:
    try:
        raw = yaml.safe_load(path.read_text())
        params = tuple(
            ParamSpec(name=name, choices=tuple(d["choices"]), default=d["default"],
                      compile_time=bool(d.get("compile_time", True)), doc=str(d.get("doc", "")),
                      when=d.get("when"))
            for name, d in raw["params"].items())
        constraints = tuple(Constraint(expr=c["expr"], why=c["why"]) for c in raw.get("constraints") or [])
        when = raw.get("when")
        compile_if = raw.get("compile_if")
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise FusetuneError(f"{path}: broken template space declaration: {exc!r}") from None
    for p in params:
        if p.default not in p.choices:
            raise FusetuneError(f"{path}: params.{p.name}.default {p.default!r} is not one of its choices")
    return FamilySpace(family=family, doc=str(raw.get("doc", "")).strip(), params=params, constraints=constraints,
                       when=when, compile_if=compile_if)


@dataclasses.dataclass(frozen=True)
class PlanSpace:
    """The product of the spaces of a plan's stages, with flat ``family.param`` names."""

    families: tuple[FamilySpace, ...]
    #: What the plan offers, for ``when`` and constraints: ``family`` (the main kernel's), ``direct``,
    #: ``gemm``, ``spectral``, ``forward_form`` and the rest of codegen.plan_facts.
    plan_facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def names(self) -> list[str]:
        return [f"{f.family}.{p.name}" for f in self.families for p in f.params]

    def choices(self) -> dict[str, tuple[Any, ...]]:
        return {f"{f.family}.{p.name}": p.choices for f in self.families for p in f.params}

    def default(self) -> Candidate:
        return {f"{f.family}.{k}": v for f in self.families for k, v in f.default().items()}

    def with_choices(self, candidate: Mapping[str, Any], written: Iterable[tuple[str, str]]) -> Candidate:
        """``candidate`` with each (``family.param``, value as text) of ``written`` set to the declared choice
        written so (``("gemm_stats.taps", "2")``: 2), as the scripts' ``--set`` gives them; a FusetuneError names a
        parameter the space has not, or a value not among its choices."""
        out = dict(candidate)
        declared = self.choices()
        for name, text in written:
            if name not in declared:
                raise FusetuneError(f"{name}: no such parameter in this plan's space")
            match = [choice for choice in declared[name] if str(choice) == text]
            if not match:
                raise FusetuneError(f"{name}={text}: expected one of {', '.join(map(str, declared[name]))}")
            out[name] = match[0]
        return out

    def size(self) -> int:
        size = 1
        for f in self.families:
            size *= f.size()
        return size

    def producer_starts(self) -> list[Candidate]:
        """The defaults under every distinct choice of the producer (where the convolution runs, and
        how cuDNN runs it): the choices that move a candidate's time most, and cost no build. One
        per world first (a small budget still reaches every world), then cuDNN's other choices."""
        starts: dict[str, Candidate] = {}
        for choice in self._producer_combos():
            start = self.canonical({**self.default(), **choice})
            starts.setdefault(candidate_key(start), start)
        firsts: dict[Any, Candidate] = {}
        for start in starts.values():
            firsts.setdefault(start.get("producer.impl"), start)
        return list(firsts.values()) + [s for s in starts.values() if s not in firsts.values()]

    def all(self, producer: Mapping[str, Any] | None = None) -> Iterator[Candidate]:
        """Every distinct canonical candidate, in a fixed order: for each choice of the producer,
        the product of the choices that matter under it (the rest stay at their defaults). With
        ``producer`` ({"producer.impl": "gemm_wide"}), only under the producer's choices that agree."""
        # Producer choices with the same canonical base enumerate the same candidates, and different bases
        # (they differ in a producer choice, which no candidate under them varies) disjoint ones: so the
        # bases alone are deduplicated, not the tens of thousands of candidates (keying each took seconds).
        seen: set[str] = set()
        choices = self.choices()
        for choice in self._producer_combos():
            base = self.canonical({**self.default(), **choice})
            if producer and any(base.get(name) != value for name, value in producer.items()):
                continue  # as canonical: a choice that does not matter here is its default
            if candidate_key(base) in seen:
                continue
            seen.add(candidate_key(base))
            varying = [name for name in self.names() if name not in choice
                       and self.canonical({**base, name: "\0"})[name] == "\0"]  # the choices that matter here
            for values in itertools.product(*(choices[name] for name in varying)):
                yield {**base, **dict(zip(varying, values))}

    def _producer_combos(self) -> list[dict[str, Any]]:
        """Every combination of the producer's choices, ``{"producer.<param>": value}`` (one empty
        one for a space without a producer family)."""
        producer = next((f for f in self.families if f.family == "producer"), None)
        if producer is None:
            return [{}]
        names = [f"producer.{p.name}" for p in producer.params]
        return [dict(zip(names, combo)) for combo in itertools.product(*(p.choices for p in producer.params))]

    def _producer_choices(self, candidate: Mapping[str, Any]) -> dict[str, Any]:
        """The names a ``when`` may use: the producer's choices and the plan's facts."""
        return {**self.plan_facts, "impl": candidate.get("producer.impl", DEFAULT_WORLD),
                "layout": candidate.get("producer.layout", "contiguous")}

    def _matters(self, when: str | None, producer: Mapping[str, Any]) -> bool:
        return when is None or _holds(when, producer)

    def canonical(self, candidate: Mapping[str, Any]) -> Candidate:
        """The candidate with every choice that does not matter under its producer set to its default."""
        out = dict(candidate)
        for f in self.families:  # the producer first, in declaration order: layout's `when` reads impl
            if f.family == "producer":
                for p in f.params:
                    if not self._matters(p.when, self._producer_choices(out)):
                        out[f"producer.{p.name}"] = p.default
        producer = self._producer_choices(out)
        for f in self.families:
            if f.family == "producer":
                continue
            family_matters = self._matters(f.when, producer)
            for p in f.params:
                if not (family_matters and self._matters(p.when, producer)):
                    out[f"{f.family}.{p.name}"] = p.default
        return out

    def relevant(self, candidate: Mapping[str, Any]) -> dict[str, Any]:
        """The choices that matter under the candidate's producer: what a report should show."""
        producer = self._producer_choices(candidate)
        return {f"{f.family}.{p.name}": candidate[f"{f.family}.{p.name}"] for f in self.active(candidate)
                for p in f.params if f"{f.family}.{p.name}" in candidate and self._matters(p.when, producer)}

    def active(self, candidate: Mapping[str, Any]) -> list[FamilySpace]:
        """The families that run for this candidate (the others are canonical defaults only)."""
        producer = self._producer_choices(candidate)
        return [f for f in self.families if self._matters(f.when, producer)]

    def violations(self, candidate: Mapping[str, Any], facts: Mapping[str, int],
                   memo: dict[Any, list[str]] | None = None) -> list[str]:
        """Constraints the candidate breaks at a shape; empty when it is feasible.

        Only the families that run for the candidate are checked. ``memo``: a dict the caller keeps for one
        ``facts`` while it checks many candidates (a search checks every one of its space, tens of thousands
        for the K-tiled worlds): a family's verdict depends only on its own values and the producer's
        choices, which most candidates share."""
        broken = []
        producer = self._producer_choices(candidate)
        shared = {**facts, **producer}
        for f in self.active(candidate):
            names = {p.name: candidate[f"{f.family}.{p.name}"] for p in f.params}
            key = (f.family, producer["impl"], producer["layout"], tuple(names.values()))
            if memo is not None and key in memo:
                broken += memo[key]
                continue
            found = [f"{f.family}: {c.why} ({c.expr})" for c in f.constraints if not _holds(c.expr, {**shared, **names})]
            if memo is not None:
                memo[key] = found
            broken += found
        return broken

    def stage_values(self, candidate: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``{"stats": {"block": 256, ...}, ...}``: the per-stage view the generated model takes."""
        return {f.family: {p.name: candidate[f"{f.family}.{p.name}"] for p in f.params} for f in self.families}


def candidate_key(candidate: Mapping[str, Any]) -> str:
    """A stable string for a candidate: what trials and outcomes are keyed on."""
    return ",".join(f"{k}={candidate[k]}" for k in sorted(candidate))
