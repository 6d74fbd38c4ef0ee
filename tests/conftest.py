"""Shared helpers for the CPU-only test suite."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
SEEDS = {
    "groupnorm": CONFIGS / "conv2d_groupnorm_scale_maxpool_clamp.yaml",
    "instancenorm": CONFIGS / "conv3d_mul_instancenorm_clamp_mul_max.yaml",
    "batchnorm": CONFIGS / "convt3d_scale_batchnorm_gap.yaml",
    "maxpool_gap": CONFIGS / "convt3d_scale_maxpool_gap_clamp.yaml",
}

_counter = itertools.count()


def import_file(path: Path):
    """Import a Python file as a fresh module (a new name each time, so nothing is shared)."""
    name = f"_fusetune_generated_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_script(name: str):
    """Import one of scripts/ (files without a .py suffix) as a fresh module, to test what needs no GPU."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(params=sorted(SEEDS), ids=sorted(SEEDS))
def seed_path(request) -> Path:
    return SEEDS[request.param]


def run_processes(procs: list, timeout: float) -> list:
    """Start the processes, wait up to ``timeout`` s for each, kill stragglers; their exit codes."""
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]
