"""Tune on deploy: make sure every shape a service will see is tuned on the GPU it runs on.

Never breaks a deploy unless asked to be strict: a shape that cannot be tuned in the time
budget (or a machine without a GPU) falls back to eager PyTorch, and is reported.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from fusetune.build import build_and_load, load_generated
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import ProblemSpec, load_config
from fusetune.errors import ConfigError, FusetuneError
from fusetune.export import find_winner
from fusetune.plan import make_plan
from fusetune.paths import configs_in
from fusetune.progress import PlainReporter, Reporter
from fusetune.pipeline import expand
from fusetune.search import BenchmarkerFactory, Machine, Prepared, ShapeResult, prepare, shape_key, tune_shape
from fusetune.storage import Storage, pull_winners
from fusetune.winners import render_winners

if TYPE_CHECKING:  # torch is imported by load_tuned: a deploy whose winners are stored runs without it
    import torch

log = logging.getLogger("fusetune.deploy")

#: The phases of ``fusetune deploy`` that ``--timings`` shows, in order, and what each covers.
PHASES = {
    "start": "Python's start, fusetune.cli's imports and the options (from the process's start)",
    "imports": "the command's own imports (fusetune.deploy, fusetune.search, codegen and its templates' engine)",
    "machine": "the GPU's name and capability for the keys (search.Machine.detect)",
    "storage": "connecting to --storage (psycopg alone: SQLAlchemy and the tables only where a key misses)",
    "configs": "reading the configs and listing their regions",
    "plans": "planning and rendering each region once (its source hash is part of every key)",
    "lookups": "every shape's key looked up in --storage at once, then in the cache; a search where none is found",
    "close": "stopping the evaluation process and the builds (where a shape was searched), the database",
    "output": "writing the result",
}
#: Modules ``--timings`` says were loaded or not: the costly ones a deploy of stored winners does without
#: (torch, optuna, a compiler's), and those it needs (jinja2 renders the keys' sources; the database's).
WATCHED_MODULES = ("torch", "torch.utils.cpp_extension", "torch._inductor", "triton", "sympy", "optuna", "rich",
                   "jinja2", "sqlalchemy", "psycopg")


@dataclasses.dataclass
class DeployReport:
    tuned: list[str] = dataclasses.field(default_factory=list)
    cached: list[str] = dataclasses.field(default_factory=list)
    fallback: list[str] = dataclasses.field(default_factory=list)  # "config shape: why"
    configs: list[str] = dataclasses.field(default_factory=list)  # every config file found
    seconds: float = 0.0  # the deploy's own time: without the process's start (Python, torch, CUDA)

    @property
    def ok(self) -> bool:
        """Every shape of at least one config tuned: a folder without configs is not ok (a typo?)."""
        return bool(self.configs) and not self.fallback


class Phases:
    """Wall seconds per phase of a deploy (``PHASES``), for ``fusetune deploy --timings``: where the
    command's time goes, the same way on any host. A phase entered again adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def lines(self) -> list[str]:
        """One line per phase in ``PHASES``' order, the process's age, and which of ``WATCHED_MODULES`` loaded."""
        out = [f"  {name:<8} {self.seconds[name]:6.2f} s  {what}" for name, what in PHASES.items()
               if name in self.seconds]
        age = process_seconds()
        if age is not None:
            out.append(f"  {'total':<8} {age:6.2f} s  since the process started (its exit comes after)")
        loaded = [m for m in WATCHED_MODULES if m in sys.modules]
        out.append(f"  loaded: {', '.join(loaded) or 'none'}; not loaded: "
                   f"{', '.join(m for m in WATCHED_MODULES if m not in loaded) or 'none'}")
        return out


def process_seconds() -> float | None:
    """Seconds since this process started, from Linux's /proc (to 10 ms); None where there is none."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def ensure_tuned(config_dir: Path, cache: Cache, budget_s: float, make_bench_for: Callable, machine: Machine | None,
                 echo: Callable[[str], None] = print, reporter: Reporter | None = None,
                 storage: Storage | None = None, phases: Phases | None = None) -> DeployReport:
    """Tune every untuned shape of every config in ``config_dir`` within ``budget_s`` seconds in all.

    ``make_bench_for(cache, machine, seconds_left)`` returns a benchmarker factory whose builds and
    set-up must also end within ``seconds_left``: the budget bounds more than the trials. It is called
    only where a shape is searched: a deploy whose winners are all found starts no evaluation process.
    ``reporter`` shows progress (shape k of n; default: plain lines through ``echo``).
    ``storage`` (``--storage``): winners stored in that database are used before anything is tuned, every
    key read in one statement (``pull_winners``); only a shape whose key misses asks it again (to publish a
    local winner, or to search: SQLAlchemy and optuna, where ``storage`` is lazy, are loaded then).
    ``phases`` gets the time of reading the configs, planning them and looking up (or tuning) the shapes.
    """
    reporter = reporter or PlainReporter(echo)
    phases = phases if phases is not None else Phases()
    report = DeployReport()
    start = time.perf_counter()
    if not Path(config_dir).is_dir():
        raise ConfigError(str(config_dir), "", "no such folder of configs")
    with phases("configs"):
        configs = configs_in(Path(config_dir))
        report.configs = [str(p) for p in configs]
        specs: list[ProblemSpec] = []
        for path in configs:
            try:
                specs.append(load_config(path))
            except ConfigError as exc:  # names the file already
                report.fallback.append(str(exc))
            except Exception as exc:  # one config never takes the others down
                report.fallback.append(f"{path}: {type(exc).__name__}: {exc}")
        deadline = time.monotonic() + budget_s
        # Every config's first region first (most of a chain's time), then the later regions (fusetune/pipeline.py).
        todo = [(spec, shape) for spec in specs for shape in spec.shapes] + [
            (region, shape) for spec in specs for region, shapes in expand(spec, list(spec.shapes))[1:]
            for shape in shapes]
    prepared: dict[int, Prepared | FusetuneError] = {}  # per region (id of its spec): planned once
    stored = _pull_stored(todo, prepared, cache, machine, storage, phases) \
        if storage is not None and machine is not None else set()
    for number, (spec, shape) in enumerate(todo, 1):
        label = f"{spec.name} {list(shape)}"
        reporter.deploy_item(number, len(todo), label)
        if machine is None:
            report.fallback.append(f"{label}: no CUDA GPU visible")
            continue
        left = deadline - time.monotonic()
        if left <= 1 and number not in stored:  # a winner the database held is in the cache: no time needed
            report.fallback.append(f"{label}: time budget spent")
            continue
        try:
            with phases("plans"):
                ready = _prepared(spec, prepared)
            with phases("lookups"):
                result: ShapeResult = tune_shape(spec, shape, cache, machine,
                                                 _when_searched(make_bench_for, cache, machine, left),
                                                 timeout=min(left, spec.search.timeout), reporter=reporter,
                                                 storage=None if number in stored else storage, budget_s=left,
                                                 prepared=ready)
        except FusetuneError as exc:
            report.fallback.append(f"{label}: {exc}")
            continue
        {"cached": report.cached, "tuned": report.tuned}.get(result.status, report.fallback).append(
            label if result.status != "failed" else f"{label}: {result.message}")
    report.seconds = time.perf_counter() - start
    return report


def _pull_stored(todo: list[tuple[ProblemSpec, tuple[int, ...]]], prepared: dict[int, Prepared | FusetuneError],
                 cache: Cache, machine: Machine, storage: Storage, phases: Phases) -> set[int]:
    """The numbers (from 1) of ``todo``'s shapes whose winner ``storage`` holds, written into ``cache``: every
    key planned first, then one statement for them all. A shape whose plan fails is left to the loop, which
    says why; a key that misses is looked up again there, by tune_shape, with a local winner or a search."""
    keys: dict[int, tuple[str, dict]] = {}
    with phases("plans"):
        for number, (spec, shape) in enumerate(todo, 1):
            try:
                ready = _prepared(spec, prepared)
            except FusetuneError:
                continue
            keys[number] = shape_key(spec, shape, machine, ready.rendered.source_hash)
    with phases("lookups"):
        try:
            found = pull_winners(storage, cache, dict(keys.values()))
        except FusetuneError:  # the database failed the one lookup: each shape asks again (tune_shape), as without
            return set()
    return {number for number, (key, _) in keys.items() if key in found}


def _prepared(spec: ProblemSpec, made: dict[int, Prepared | FusetuneError]) -> Prepared:
    """``spec``'s plan, rendered (search.prepare), made at its first shape and kept in ``made``: the key of
    every shape needs its source hash, the same for all. A plan that fails fails each shape alike."""
    if id(spec) not in made:
        try:
            made[id(spec)] = prepare(spec)
        except FusetuneError as exc:
            made[id(spec)] = exc
    found = made[id(spec)]
    if isinstance(found, FusetuneError):
        raise found
    return found


def _when_searched(make_bench_for: Callable, cache: Cache, machine: Machine,
                   seconds_left: float) -> BenchmarkerFactory:
    """The factory ``make_bench_for(cache, machine, seconds_left)`` makes, asked for when a search asks for its
    benchmarker (tune_shape does so only where no winner is found)."""
    return lambda plan, shape: make_bench_for(cache, machine, seconds_left)(plan, shape)


def load_tuned(config: str | Path, cache: Cache | None = None, *,
               weights: torch.nn.Module | Mapping[str, torch.Tensor] | None = None,
               device: str | torch.device | None = None) -> torch.nn.Module:
    """The fused model with this GPU's winners, or the eager reference with a warning.

    Each tuned shape uses its own winner; other shapes use the first tuned one. Only the winners'
    variants are built, into the cache directory (``winners.render_winners``).

    ``weights``: the user's model or its ``state_dict``, by the user's own names where the config
    was written by ``fusetune import`` (its map beside the config names them), else by the
    generated model's (``producer.weight``, ...). ``device``: where the model goes (default: CUDA
    where there is a GPU, else the CPU).
    """
    import torch

    spec = load_config(config)
    cache = cache or Cache()
    plan = make_plan(spec)
    rendered = render(plan)
    try:
        machine = Machine.detect()
    except FusetuneError as exc:
        warnings.warn(f"fusetune: {spec.name}: {exc}; using eager PyTorch", stacklevel=2)
        return _placed(_eager(rendered, cache).Model(), spec, config, weights, device or "cpu")
    device = device or "cuda"
    if torch.device(device).type != "cuda":  # the kernels take CUDA tensors alone
        log.info("fusetune: %s: device %s: the tuned kernels run on CUDA; using eager PyTorch", spec.name, device)
        return _placed(_eager(rendered, cache).Model(), spec, config, weights, device)
    winners = {}
    for shape in spec.shapes:
        entry = find_winner(cache, spec, shape, rendered.source_hash, machine.gpu)
        if entry is not None and entry.winner is not None:
            winners[tuple(shape)] = entry.winner["variant"]
    if not winners:
        warnings.warn(f"fusetune: {spec.name}: no tuned winner on {machine.gpu}; using eager PyTorch "
                      f"(run `fusetune search {config}`)", stacklevel=2)
        return _placed(_eager(rendered, cache).Model(), spec, config, weights, device)
    try:
        generated = build_and_load(render_winners(plan, winners.values()), cache, machine.capability)
        model = generated.ModelNew(variant=next(iter(winners.values())))
        for input_shape, variant in winners.items():
            model._by_shape[input_shape] = model._resolve(variant)
        from fusetune.later import attach_later

        attach_later(model, plan, cache, machine.gpu, machine.capability)  # each later region tuned: its kernels
    except Exception as exc:  # a failed build, an extension that does not load: a deploy never breaks on it
        warnings.warn(f"fusetune: {spec.name}: the tuned kernels did not load ({type(exc).__name__}: "
                      f"{str(exc)[-1000:]}); using eager PyTorch", stacklevel=2)
        return _placed(_eager(rendered, cache).Model(), spec, config, weights, device)
    return _placed(model, spec, config, weights, device)


def _eager(rendered, cache: Cache):
    """The generated module, for its reference Model (nothing is built)."""
    return load_generated(rendered.write(cache.module_dir(rendered.name)))


def _placed(model: torch.nn.Module, spec: ProblemSpec, config: str | Path,
            weights: torch.nn.Module | Mapping[str, torch.Tensor] | None,
            device: str | torch.device) -> torch.nn.Module:
    """``model`` with ``weights`` loaded (see ``load_tuned``), on ``device``."""
    if weights is not None:
        model.load_state_dict(_renamed(model, spec, config, weights))
    return model.to(device)


def user_names(config: str | Path, spec: ProblemSpec) -> dict[str, str]:
    """The generated model's state key -> the user's name, from the map ``fusetune import`` wrote beside
    the config (``<stem>.map.json``); empty where there is none."""
    return {str(k): str(v) for k, v in _map_chain(config, spec).get("weights", {}).items()}


def derived_params(config: str | Path, spec: ProblemSpec) -> dict:
    """The config's parameters that the model computes from its tensors (fusetune/derived.py), and the
    convolution's weight or bias where the model computes it (``producer.weight``: weight norm, pruning,
    fusetune/computed_weights.py): name -> Derivation, from the map beside the config; empty where there is none."""
    from fusetune.derived import Derivation

    return {str(k): Derivation.from_json(v) for k, v in _map_chain(config, spec).get("derived", {}).items()}


def _map_chain(config: str | Path, spec: ProblemSpec) -> dict:
    """The map's entry of this config (``fusetune import``'s ``<stem>.map.json`` beside it); empty where none."""
    folder = Path(config).parent
    for path in sorted(folder.glob("*.map.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for chain in doc.get("chains", []) if isinstance(doc, dict) else []:
            if isinstance(chain, dict) and chain.get("name") == spec.name and Path(str(chain.get("config", ""))).name == Path(config).name:
                return chain
    return {}


def _renamed(model: torch.nn.Module, spec: ProblemSpec, config: str | Path,
             weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The generated model's state dict made of ``weights``, each key looked up by the user's name first."""
    import torch

    from fusetune.importer import declared_view

    given = weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)
    names = user_names(config, spec)
    derived = derived_params(config, spec)
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    params = {p.name for p in spec.parameters}
    for key, ours in model.state_dict().items():
        name = names.get(key, key)
        if key in derived:  # computed from the user's tensors, now (load_state_dict copies every weight)
            try:
                out[key] = derived[key].compute(given.__getitem__)
            except KeyError as exc:
                missing.append(f"{exc.args[0]} (for {key} = {derived[key].describe()})")
        elif name in given:
            theirs = given[name]
            if key in params and theirs.shape != ours.shape and theirs.numel() in (1, ours.numel()):
                theirs = declared_view(theirs, ours.shape)  # a 0-dim or (1, C, 1, 1) parameter, as imported
            out[key] = theirs
        elif key in given:
            out[key] = given[key]
        else:
            missing.append(name if name == key else f"{name} (for {key})")
    if missing:
        raise FusetuneError(f"{config}: the weights lack {', '.join(missing)}; expected the user's model (or its "
                            f"state_dict) the config was imported from, or the generated model's names")
    return out
