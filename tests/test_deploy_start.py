"""A deploy whose winners are stored starts only what finding them needs: no optuna, no compiler, no evaluation
process, each region rendered once; ``--timings`` says where its time went (a FakeBench tunes, a machine by
name: tests/deploy_child.py). The GPU's name and capability come from the CUDA driver without torch: checked
against a stand-in driver (tests/fake_cuda/driver.c), and against torch's answer on a GPU."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fusetune.cache import Cache
from fusetune.config import load_config
from fusetune.deploy import PHASES, WATCHED_MODULES, ensure_tuned
from fusetune.pipeline import expand
from fusetune.search import Machine, driver_machine, torch_build

import deploy_child
from deploy_child import NOT_LOADED
from conftest import SEEDS
from fake_handlers import MACHINE_FIELDS, FakeBench

#: The phases a deploy that finds every winner goes through (``--timings``), without --storage.
PHASES_SEEN = ("start", "imports", "machine", "configs", "plans", "lookups", "close", "output")
CONFIGS = ("maxpool_gap", "groupnorm")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, Cache, int]:
    """A folder of CONFIGS, every shape of theirs tuned by a FakeBench into a cache; the number of shapes."""
    tmp_path = tmp_path_factory.mktemp("tuned")
    folder = tmp_path / "configs"
    folder.mkdir()
    for name in CONFIGS:
        shutil.copy(SEEDS[name], folder)
    cache = Cache(tmp_path / "cache")
    report = ensure_tuned(folder, cache, 600.0, lambda *a: FakeBench().factory, Machine(*MACHINE_FIELDS),
                          echo=lambda line: None)
    assert report.ok and not report.cached, report.fallback
    return folder, cache, len(report.tuned)


def test_a_deploy_of_stored_winners_loads_no_search_no_compiler_and_no_evaluation_process(tuned, tmp_path):
    folder, cache, shapes = tuned
    done, loaded = deploy_child.run(["--cache-dir", str(cache.root), "deploy", str(folder), "--strict", "--timings"],
                                    MACHINE_FIELDS, tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert f"{shapes} cached, 0 tuned, 0 on eager PyTorch" in done.stdout
    assert loaded and not [m for m in NOT_LOADED if m in loaded], done.stderr
    timings = done.stderr.split("fusetune deploy: timings\n", 1)[1].splitlines()
    assert [line.split()[0] for line in timings if line.split()[0] in PHASES] == list(PHASES_SEEN)
    assert any(line.split()[0] == "total" for line in timings)
    assert f"not loaded: {', '.join(m for m in WATCHED_MODULES if m not in loaded)}" in done.stderr


def test_a_deploy_of_stored_winners_does_not_import_torch(tuned, tmp_path):
    folder, cache, shapes = tuned
    done, loaded = deploy_child.run(["--cache-dir", str(cache.root), "deploy", str(folder)], MACHINE_FIELDS,
                                    tmp_path / "modules.json")
    assert done.returncode == 0 and f"{shapes} cached" in done.stdout, done.stderr
    assert "torch" not in loaded


def test_deploy_renders_each_region_once_and_finds_the_winners_a_search_stored(tuned, monkeypatch):
    """The source hash in every key is the region's, whatever the shape: rendered once per region, not per
    shape; the keys found are those the tuning stored (each shape cached, none tuned again)."""
    import fusetune.search

    folder, cache, shapes = tuned
    regions = sum(len(expand(spec, list(spec.shapes))) for spec in map(load_config, sorted(folder.glob("*.yaml"))))
    assert regions < shapes  # else rendering per shape could not be told apart
    rendered: list[str] = []
    render = fusetune.search.render
    monkeypatch.setattr(fusetune.search, "render", lambda plan, *a: rendered.append(plan.spec.name) or render(plan, *a))
    bench = FakeBench()
    report = ensure_tuned(folder, cache, 600.0, lambda *a: bench.factory, Machine(*MACHINE_FIELDS),
                          echo=lambda line: None)
    assert len(report.cached) == shapes and not report.tuned and not report.fallback
    assert bench.made == 0 and len(rendered) == regions == len(set(rendered))


def test_nn_modules_attributes_read_from_its_source_are_those_torch_has():
    """config.module_attributes without torch (its class's source) names what dir(torch.nn.Module) does."""
    probe = ("import sys\nfrom fusetune.config import module_attributes\nread = module_attributes()\n"
             "assert 'torch' not in sys.modules\nimport torch\nmissing = set(dir(torch.nn.Module)) ^ read\n"
             "assert not missing, sorted(missing)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def fake_driver(tmp_path, monkeypatch) -> None:
    """tests/fake_cuda/driver.c built as the CUDA driver driver_machine loads, for a torch built for CUDA 12.8:
    one NVIDIA H200 (9.0) with a 12.8 driver, unless a test sets the environment otherwise."""
    import fusetune.search

    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the stand-in CUDA driver")
    library, source = tmp_path / "libcuda.so.1", Path(__file__).parent / "fake_cuda" / "driver.c"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=120)
    monkeypatch.setattr(fusetune.search, "CUDA_DRIVER", str(library))
    monkeypatch.setattr(fusetune.search, "torch_build", lambda: ("2.9.1+cu128", "12.8"))
    for name, value in {"FAKE_CUDA_DRIVER": "12080", "FAKE_CUDA_COUNT": "1", "FAKE_CUDA_NAME": "NVIDIA H200",
                        "FAKE_CUDA_CAPABILITY": "9.0"}.items():
        monkeypatch.setenv(name, value)


def test_the_driver_names_device_0_and_its_capability_with_torchs_versions(fake_driver):
    assert driver_machine() == Machine("NVIDIA H200", "9.0", "12.8", "2.9.1")


@pytest.mark.parametrize("setting", [{"FAKE_CUDA_COUNT": "0"}, {"FAKE_CUDA_DRIVER": "11080"}],
                         ids=["no device visible", "driver of an older CUDA than torch's"])
def test_where_torch_would_see_no_gpu_the_driver_does_not_answer(fake_driver, monkeypatch, setting):
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert driver_machine() is None


def test_a_torch_without_cuda_is_asked_itself(fake_driver, monkeypatch):
    import fusetune.search

    monkeypatch.setattr(fusetune.search, "torch_build", lambda: ("2.9.1+cpu", None))
    assert driver_machine() is None


def test_where_torch_is_imported_it_is_asked_not_the_driver(fake_driver, monkeypatch):
    """torch's current device may be another than 0, and tests stand in for torch.cuda: torch answers."""
    from fusetune.errors import NoGpuError

    assert "torch" in sys.modules and driver_machine() is not None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGpuError):
        Machine.detect()


def test_torch_build_reads_the_version_torch_reports():
    assert torch_build() == (str(torch.__version__), torch.version.cuda)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_driver_names_the_gpu_as_torch_does():
    """On a GPU: Machine.detect in a process without torch (the CUDA driver's answer) is torch's answer, and
    imports no torch."""
    probe = ("import sys\nfrom fusetune.search import Machine, driver_machine\nfast = driver_machine()\n"
             "assert 'torch' not in sys.modules\nassert fast is not None, 'the driver did not answer'\n"
             "assert fast == Machine.from_torch(), (fast, Machine.from_torch())\nprint(fast)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
