"""Shared helpers for the CPU-only test suite."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import logging
import os
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


def _reference_worlds() -> tuple[str, ...]:
    from fusetune.worlds import WORLDS

    return tuple(name for name, world in WORLDS.items() if world.runs_reference)


#: The worlds whose candidate is the reference's own forward (eager, torch.compile's modes), in registry order:
#: offered for every region, so tests that list what a plan offers add them from the registry.
REFERENCE_WORLDS = _reference_worlds()

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


def verify_worlds(path: Path, cache, worker) -> tuple[list[dict], list[str]]:
    """scripts/verify-chains' records for a config (each world its plan offers, each region, against float64) and
    the lines of those that failed, every record printed; torch.compile's worlds left out (a max-autotune
    compile each: minutes, and nothing of fusetune's kernels under test). The GPU tests' shared check."""
    from fusetune.search import Machine
    from fusetune.worlds import WORLDS

    script = import_script("verify-chains")
    compiled = tuple(name for name, world in WORLDS.items() if world.compile_mode)
    records = script.verify_chain(path, cache, Machine.detect(), worker, 180.0, exclude=compiled)
    for record in records:
        print(script.format_line(record))
    return records, [script.format_line(r) for r in records if script.failed(r)]


def chain_files(folder: str) -> dict[str, Path]:
    """The chain configs of a folder of test data under tests/ (``compile_chains``, ``gpu_chains``): name -> file,
    in the files' name order. Each file is named after its chain (its ``name:``), so that a test id that names a
    chain names its file; a file that is not says so here, at collection (read as plain YAML: the tests parse
    them, and collection stays free of torch's import)."""
    import yaml

    files = {path.stem: path for path in sorted((ROOT / "tests" / folder).glob("*.yaml"))}
    assert files, f"no chain configs in tests/{folder}/"
    for stem, path in files.items():
        raw = yaml.safe_load(path.read_text())
        name = raw.get("name") if isinstance(raw, dict) else None
        assert name == stem, f"{path}: name {name!r}, expected the file's own name {stem!r}"
    return files


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


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh cache for the GPU tests (a file's own ``cache`` fixture overrides this); with
    FUSETUNE_TEST_CACHE=DIR, its modules and builds are DIR's, so that runs of parts of the GPU files
    (-k) one after another share their builds. Winners and studies stay the run's own: the tests
    that tune expect none yet."""
    from fusetune.cache import Cache

    root = tmp_path_factory.mktemp("cache")
    shared = os.environ.get("FUSETUNE_TEST_CACHE")
    if shared:
        for part in ("modules", "builds"):
            (Path(shared) / part).mkdir(parents=True, exist_ok=True)
            (root / part).symlink_to(Path(shared) / part, target_is_directory=True)
    return Cache(root)


@pytest.fixture(scope="module")
def worker():
    """One evaluation worker process for a GPU test file (a file's own ``worker`` fixture overrides this)."""
    from fusetune.worker import Worker

    with Worker() as w:
        yield w


@pytest.fixture(autouse=True)
def _fusetune_logger_restored():
    """A CLI run configures the "fusetune" logger for its process (level, a stderr handler, no
    propagation); in one test process that would hide later tests' records from caplog, so each test
    gets the logger back as it found it."""
    logger = logging.getLogger("fusetune")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    yield
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    logger.handlers[:] = saved[2]


def tf32_state(torch) -> list:
    """cuDNN's TF32 settings as the new API holds them (convolutions and RNNs apart: the legacy allow_tf32
    setter changes both, and a state that mixes the two APIs makes torch.export refuse), or the legacy flag."""
    cudnn = torch.backends.cudnn
    saved = []
    try:  # the legacy flag first: setting it back resets the new API's values, which then go back over it
        saved.append((cudnn, "allow_tf32", cudnn.allow_tf32))
    except RuntimeError:  # already a mix of the two APIs: nothing to read it from
        pass
    owners = [o for o in (cudnn, getattr(cudnn, "conv", None), getattr(cudnn, "rnn", None))
              if o is not None and hasattr(o, "fp32_precision")]
    return saved + [(o, "fp32_precision", o.fp32_precision) for o in owners]


def restore_tf32_state(saved: list) -> None:
    for owner, name, value in saved:
        setattr(owner, name, value)


@pytest.fixture(autouse=True)
def _tf32_setting_restored():
    """torch's TF32 switches are process-wide: a test that sets them (and fails before putting them back)
    must not change what later tests see. Restored by value, through the API this torch has."""
    torch = sys.modules.get("torch")  # only where a test imported it: no torch import for the others
    saved = tf32_state(torch) if torch else None
    yield
    if saved is not None:
        restore_tf32_state(saved)
