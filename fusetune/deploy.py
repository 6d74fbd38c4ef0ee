"""Tune on deploy: make sure every shape a service will see is tuned on the GPU it runs on.

Never breaks a deploy unless asked to be strict: a shape that cannot be tuned in the time
budget (or a machine without a GPU) falls back to eager PyTorch, and is reported.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from fusetune.build import build_and_load, load_generated
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import ProblemSpec, load_config
from fusetune.errors import ConfigError, FusetuneError
from fusetune.export import find_winner
from fusetune.plan import make_plan
from fusetune.search import Machine, ShapeResult, tune_shape


@dataclasses.dataclass
class DeployReport:
    tuned: list[str] = dataclasses.field(default_factory=list)
    cached: list[str] = dataclasses.field(default_factory=list)
    fallback: list[str] = dataclasses.field(default_factory=list)  # "config shape: why"
    configs: list[str] = dataclasses.field(default_factory=list)  # every config file found

    @property
    def ok(self) -> bool:
        """Every shape of at least one config tuned: a folder without configs is not ok (a typo?)."""
        return bool(self.configs) and not self.fallback


def ensure_tuned(config_dir: Path, cache: Cache, budget_s: float, make_bench_for: Callable, machine: Machine | None,
                 echo: Callable[[str], None] = print) -> DeployReport:
    """Tune every untuned shape of every config in ``config_dir`` within ``budget_s`` seconds in all.

    ``make_bench_for(cache, machine, seconds_left)`` returns a benchmarker factory whose builds and
    set-up must also end within ``seconds_left``: the budget bounds more than the trials.
    """
    report = DeployReport()
    if not Path(config_dir).is_dir():
        raise ConfigError(str(config_dir), "", "no such folder of configs")
    configs = sorted(Path(config_dir).glob("*.yaml")) + sorted(Path(config_dir).glob("*.yml"))
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
    for spec in specs:
        for shape in spec.shapes:
            label = f"{spec.name} {list(shape)}"
            if machine is None:
                report.fallback.append(f"{label}: no CUDA GPU visible")
                continue
            left = deadline - time.monotonic()
            if left <= 1:
                report.fallback.append(f"{label}: time budget spent")
                continue
            try:
                result: ShapeResult = tune_shape(spec, shape, cache, machine, make_bench_for(cache, machine, left),
                                                 timeout=min(left, spec.search.timeout), echo=echo)
            except FusetuneError as exc:
                report.fallback.append(f"{label}: {exc}")
                continue
            {"cached": report.cached, "tuned": report.tuned}.get(result.status, report.fallback).append(
                label if result.status != "failed" else f"{label}: {result.message}")
    return report


def load_tuned(config: str | Path, cache: Cache | None = None) -> torch.nn.Module:
    """The fused model with this GPU's winners, or the eager reference with a warning.

    Each tuned shape uses its own winner; other shapes use the first tuned one.
    """
    spec = load_config(config)
    cache = cache or Cache()
    rendered = render(make_plan(spec))
    module_dir = rendered.write(cache.module_dir(rendered.name))
    generated = load_generated(module_dir)
    try:
        machine = Machine.detect()
    except FusetuneError as exc:
        warnings.warn(f"fusetune: {spec.name}: {exc}; using eager PyTorch", stacklevel=2)
        return generated.Model()
    winners = {}
    for shape in spec.shapes:
        entry = find_winner(cache, spec, shape, rendered.source_hash, machine.gpu)
        if entry is not None and entry.winner is not None:
            winners[tuple(shape)] = entry.winner["variant"]
    if not winners:
        warnings.warn(f"fusetune: {spec.name}: no tuned winner on {machine.gpu}; using eager PyTorch "
                      f"(run `fusetune search {config}`)", stacklevel=2)
        return generated.Model()
    try:
        generated = build_and_load(rendered, cache, machine.capability)
    except FusetuneError as exc:
        warnings.warn(f"fusetune: {spec.name}: {exc}; using eager PyTorch", stacklevel=2)
        return generated.Model()
    model = generated.ModelNew(variant=next(iter(winners.values())))
    for input_shape, variant in winners.items():
        model._by_shape[input_shape] = model._resolve(variant)
    return model
