"""Fast start: an exported or loaded module renders (and builds) the winners' variants alone, builds into
the cache folder (never beside model.py), and loads a prebuilt extension only where it was built for this
machine; ``load_tuned`` takes the user's weights by the user's own names. CPU only: the GPU side (a real
prebuilt .so started without nvcc) is in tests/test_optimize.py and scripts/optimize-resnet."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import torch

from fusetune import winners as fast
from fusetune.cache import Cache
from fusetune.codegen import plan_space, render
from fusetune.config import load_config
from fusetune.deploy import load_tuned
from fusetune.errors import FusetuneError
from fusetune.export import export
from fusetune.importer import import_model
from fusetune.plan import make_plan
from fusetune.search import Machine, tune_shape

from conftest import SEEDS, import_file
from export_run import run_export
from fake_handlers import MACHINE_FIELDS, FakeBench

MODELS = Path(__file__).resolve().parent / "models"
HERE_FIELDS = {"arch": "9.0", "torch": "2.11.0", "cuda": "13.0", "python": "3.12"}


def _two_winners(spec_path: Path) -> tuple:
    """A plan and two different variants of it (as winners name them: stage -> values)."""
    plan = make_plan(load_config(spec_path))
    space = plan_space(plan)
    candidates = list(itertools.islice(space.all(), 2000))
    rng = random.Random(0)
    first, second = space.default(), rng.choice(candidates)
    while space.stage_values(second) == space.stage_values(first):
        second = rng.choice(candidates)
    return plan, [space.stage_values(first), space.stage_values(second)]


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_only_the_winners_variants_are_rendered(seed: str, tmp_path: Path) -> None:
    plan, variants = _two_winners(SEEDS[seed])
    full, shipped = render(plan), fast.render_winners(plan, variants)
    assert shipped.name != full.name and len(shipped.cuda_sources) <= len(full.cuda_sources)
    generated = import_file(shipped.write(tmp_path / shipped.name) / "model.py")
    only = fast.winners_only(plan, variants)
    for family in plan_space(plan).families:
        if family.family in plan.stages and family.compile_params:
            wanted = [{p.name: v[family.family][p.name] for p in family.compile_params} for v in variants]
            compiled = generated.VARIANTS[family.family]  # in the family's order, not the winners'
            assert sorted(map(repr, compiled)) == sorted({repr(w) for w in wanted})
            assert sorted(map(repr, only[family.family])) == sorted(map(repr, compiled))
    for variant in variants:  # each winner resolves in the smaller module
        generated.ModelNew(variant=variant)


@pytest.fixture
def generated(tmp_path: Path):
    """An exported-like folder: the rendered files of one plan's winner, imported."""
    plan, variants = _two_winners(SEEDS["groupnorm"])
    rendered = fast.render_winners(plan, variants[:1])
    module = import_file(rendered.write(tmp_path / "export") / "model.py")
    module.machine_fields = lambda: dict(HERE_FIELDS)  # no GPU here: the machine the tests pretend to be
    return module


def test_builds_go_to_the_cache_folder_never_beside_model_py(generated, monkeypatch, tmp_path: Path) -> None:
    for name in ("FUSETUNE_BUILD_DIR", "FUSETUNE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert generated.default_build_directory() == str(
        tmp_path / "home" / ".cache" / "fusetune" / "builds" / f"{generated.MODULE_NAME}-sm90")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert generated.default_build_directory().startswith(str(tmp_path / "xdg" / "fusetune" / "builds"))
    monkeypatch.setenv("FUSETUNE_CACHE_DIR", str(tmp_path / "cache"))
    # As fusetune names its own builds: a module fusetune built is loaded, not built again.
    assert generated.default_build_directory() == str(Cache(tmp_path / "cache").build_dir(
        f"{generated.MODULE_NAME}-sm90"))
    monkeypatch.setenv("FUSETUNE_BUILD_DIR", str(tmp_path / "here"))
    assert generated.default_build_directory() == str(tmp_path / "here")
    assert not generated.default_build_directory().startswith(generated.HERE)


def _ship(folder: Path, module: str, fields: dict) -> Path:
    """A fake prebuilt extension and its manifest entry, as export --prebuilt writes them."""
    so = folder / "built" / f"{module}.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    so.write_bytes(b"\x7fELF not really")
    entry = fast.prebuilt_entry(module, so, fields)
    (folder / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
    (folder / entry["file"]).write_bytes(so.read_bytes())
    fast.write_manifest(folder, [entry])
    return folder / entry["file"]


@pytest.mark.parametrize("change", [{}, {"arch": "8.0"}, {"torch": "2.10.0"}, {"cuda": "12.8"}, {"python": "3.11"},
                                    {"module": "ft_other"}])
def test_a_prebuilt_extension_is_used_only_where_it_matches(generated, change: dict) -> None:
    assert generated.PREBUILT_KEYS == fast.PREBUILT_KEYS
    folder = Path(generated.HERE)
    assert generated.prebuilt_library() is None  # no manifest: build
    library = _ship(folder, change.get("module", generated.MODULE_NAME), {**HERE_FIELDS, **change})
    manifest = __import__("json").loads((folder / fast.PREBUILT_MANIFEST).read_text())
    expected = str(library) if not change else None
    assert generated.prebuilt_library() == expected
    picked = fast.pick_prebuilt(manifest, generated.MODULE_NAME, HERE_FIELDS)
    assert (str(folder / picked["file"]) if picked else None) == expected  # fusetune and model.py agree
    if not change:
        library.unlink()  # listed but gone: build
        assert generated.prebuilt_library() is None


class _FakeLoad:
    """torch.utils.cpp_extension.load without a compiler: records the call, returns a module stand-in."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        Path(kwargs["build_directory"], f"{kwargs['name']}.so").write_bytes(b"built")
        return object()


def _finished(build: Path, module, library_bytes: bytes = b"\x7fELF not really", marker: bool = True,
              **stamp) -> Path:
    """A build folder as a finished build leaves it: the .so, an object file, the stamp and the marker."""
    build.mkdir(parents=True, exist_ok=True)
    library = build / f"{module.MODULE_NAME}.so"
    library.write_bytes(library_bytes)
    (build / "stage.cuda.o").write_bytes(b"object")
    (build / module.BUILD_STAMP).write_text(json.dumps({"arch": HERE_FIELDS["arch"], **module.software_fields(),
                                                        **stamp}))
    if marker:
        (build / module.BUILT_MARKER).write_text("1\n")
    return library


def test_model_py_and_fusetune_name_the_build_files_alike(generated) -> None:
    from fusetune import build

    assert (generated.BUILT_MARKER, generated.BUILD_STAMP) == (build.BUILT_MARKER, build.BUILD_STAMP)


@pytest.mark.parametrize("where", ["prebuilt", "built"])
def test_a_shipped_or_finished_build_that_does_not_load_is_built_again(generated, where: str, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """The extension file is imported as it is, without ninja (a fake one here, so the import fails): a
    half-written or foreign .so is then built (warned), never left raising ImportError."""
    build = tmp_path / "build"
    fake = _FakeLoad()
    monkeypatch.setattr("torch.utils.cpp_extension.load", fake)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", HERE_FIELDS["arch"])
    if where == "prebuilt":
        library = _ship(Path(generated.HERE), generated.MODULE_NAME, HERE_FIELDS)
        generated.default_build_directory = lambda: str(build)
        call = generated.load_kernels
    else:
        library = _finished(build, generated)
        call = lambda: generated.load_kernels(build_directory=str(build))  # noqa: E731
    with pytest.warns(UserWarning, match="does not load") as said:
        assert call() is not None
    assert str(library) in str(said[0].message)
    assert [c["build_directory"] for c in fake.calls] == [str(build)]
    if where == "built":  # the folder's own half-written one: removed, so that it is linked again
        assert library.read_bytes() == b"built" and not (build / "stage.cuda.o").exists()
    else:  # a shipped one is never touched
        assert library.read_bytes() == b"\x7fELF not really"
    assert (build / generated.BUILT_MARKER).exists()  # this build is stamped for this machine
    assert generated.finished_build(str(build), HERE_FIELDS["arch"]) == str(build / f"{generated.MODULE_NAME}.so")


@pytest.mark.parametrize("state", ["no marker", "no stamp", "torch", "python", "arch", "ok"])
def test_a_finished_build_is_used_only_with_its_marker_and_this_machines_stamp(generated, state: str,
                                                                               tmp_path: Path) -> None:
    from fusetune.build import finished

    build = tmp_path / "build"
    stamp = {"torch": {"torch": "1.0.0"}, "python": {"python": "2.7"}, "arch": {"arch": "8.0"}}.get(state, {})
    library = _finished(build, generated, marker=state != "no marker", **stamp)
    if state == "no stamp":
        (build / generated.BUILD_STAMP).unlink()
    assert finished(build, HERE_FIELDS["arch"]) == (state == "ok")  # fusetune's check agrees with model.py's
    picked = generated.finished_build(str(build), HERE_FIELDS["arch"])
    assert picked == (str(library) if state == "ok" else None)
    stale = state in ("no stamp", "torch", "python", "arch")  # built for another machine: nothing of it is kept
    assert library.exists() != stale and (build / "stage.cuda.o").exists() != stale


def test_export_prebuilt_needs_a_gpu_and_writes_nothing_without_one(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks a machine without a CUDA GPU")
    spec = load_config(SEEDS["groupnorm"])
    cache = Cache(tmp_path / "cache")
    tune_shape(spec, spec.shapes[0], cache, Machine(*MACHINE_FIELDS), FakeBench().factory, trials=2,
               echo=lambda line: None)
    with pytest.raises(FusetuneError, match="no CUDA GPU is visible"):
        export(spec, [spec.shapes[0]], cache, tmp_path / "out", "FakeGPU", prebuilt=True)
    assert not (tmp_path / "out" / spec.name).exists()
    target = export(spec, [spec.shapes[0]], cache, tmp_path / "out", "FakeGPU")
    assert not (target / fast.PREBUILT_MANIFEST).exists()


def test_load_tuned_takes_the_users_weights_by_their_names(tmp_path: Path) -> None:
    result = import_model(str(MODELS / "conv2d_groupnorm_scale_clamp.py"), tmp_path / "configs")
    config = result.written[0].config
    user_file = import_file(MODELS / "conv2d_groupnorm_scale_clamp.py")
    torch.manual_seed(1)
    user = user_file.Model(*user_file.get_init_inputs())
    x = torch.randn(*load_config(config).shapes[0])
    cache = Cache(tmp_path / "cache")
    with pytest.warns(UserWarning, match="eager PyTorch"):  # no GPU (or no winner): the reference, loaded
        loaded = load_tuned(config, cache, weights=user, device="cpu")
    with pytest.warns(UserWarning):
        from_state = load_tuned(config, cache, weights=user.state_dict(), device="cpu")
    with torch.no_grad():
        assert torch.equal(loaded(x), user(x)) and torch.equal(from_state(x), user(x))
    assert next(loaded.parameters()).device.type == "cpu"
    partial = {k: v for k, v in user.state_dict().items() if k != "scale"}
    with pytest.warns(UserWarning), pytest.raises(FusetuneError, match=r"lack scale\b"):
        load_tuned(config, cache, weights=partial, device="cpu")


def _tuned_import(tmp_path: Path, monkeypatch):
    """An imported config with a winner cached for the fake machine, which load_tuned then detects."""
    result = import_model(str(MODELS / "conv2d_groupnorm_scale_clamp.py"), tmp_path / "configs")
    config = result.written[0].config
    spec = load_config(config)
    cache = Cache(tmp_path / "cache")
    machine = Machine(*MACHINE_FIELDS)
    tune_shape(spec, spec.shapes[0], cache, machine, FakeBench().factory, trials=2, echo=lambda line: None)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: machine))
    user_file = import_file(MODELS / "conv2d_groupnorm_scale_clamp.py")
    torch.manual_seed(1)
    return config, cache, user_file.Model(*user_file.get_init_inputs()), torch.randn(*spec.shapes[0])


def test_load_tuned_on_the_cpu_of_a_gpu_machine_is_the_eager_model(tmp_path: Path, monkeypatch, caplog) -> None:
    """The kernels take CUDA tensors alone: device="cpu" gets the reference Model, said in the log."""
    import logging

    from fusetune import deploy

    config, cache, user, x = _tuned_import(tmp_path, monkeypatch)
    monkeypatch.setattr(deploy, "build_and_load", lambda *a, **k: pytest.fail("built kernels for the CPU"))
    caplog.set_level(logging.INFO, logger="fusetune.deploy")
    loaded = load_tuned(config, cache, weights=user, device="cpu")
    assert type(loaded).__name__ == "Model"
    with torch.no_grad():
        assert torch.equal(loaded(x), user(x))
    assert any("run on CUDA" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("error", [ImportError("undefined symbol: _ZN3c10"), OSError("file too short"),
                                   RuntimeError("CUDA error")])
def test_load_tuned_falls_back_to_eager_on_any_build_or_load_failure(error: Exception, tmp_path: Path,
                                                                      monkeypatch) -> None:
    from fusetune import deploy

    config, cache, user, x = _tuned_import(tmp_path, monkeypatch)

    def fail(*args, **kwargs):
        raise error
    placed = []
    monkeypatch.setattr(deploy, "build_and_load", fail)
    monkeypatch.setattr(deploy, "_placed", lambda model, *rest: placed.append((model, rest[-1])) or model)
    with pytest.warns(UserWarning, match=f"did not load \\({type(error).__name__}: .*; using eager PyTorch"):
        loaded = load_tuned(config, cache, weights=user)
    assert type(loaded).__name__ == "Model" and placed == [(loaded, "cuda")]


# -- on a GPU: a prebuilt export starts without a compiler -------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prebuilt_export_starts_without_nvcc_from_a_read_only_folder(tmp_path: Path) -> None:
    import json
    import math
    import os

    from fusetune.runner import GpuBenchmarker
    from fusetune.worker import Worker

    spec = load_config(SEEDS["groupnorm"])
    shape = min(spec.shapes, key=math.prod)
    cache = Cache(tmp_path / "cache")
    machine = Machine.detect()
    with Worker() as worker:
        result = tune_shape(spec, shape, cache, machine,
                            lambda plan, s: GpuBenchmarker(plan, s, cache, machine, worker, echo=print), trials=3)
    assert result.status == "tuned", result
    target = export(spec, [shape], cache, tmp_path / "out", machine.gpu, prebuilt=True)
    manifest = json.loads((target / fast.PREBUILT_MANIFEST).read_text())
    entry = fast.pick_prebuilt(manifest, json.loads((target / "winner.json").read_text())["module"],
                               fast.machine_fields())
    assert entry is not None and (target / entry["file"]).is_file()
    for path in [target, *target.rglob("*")]:  # a read-only image
        path.chmod(path.stat().st_mode & ~0o222)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "nvcc").exists())
    env = {**os.environ, "PATH": path, "CUDA_HOME": str(tmp_path / "no-cuda"), "CUDA_PATH": str(tmp_path / "no-cuda"),
           "FUSETUNE_CACHE_DIR": str(tmp_path / "empty-cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("FUSETUNE_BUILD_DIR", None)
    got = run_export(target, shape, env, without_nvcc=True)
    print(f"\nprebuilt export: first forward {got['first_forward_s']:.2f} s after import torch; "
          f"error {got['error']:.2e}")
    assert Path(got["library"]).resolve() == (target / entry["file"]).resolve()
    assert got["error"] < 1e-2
    assert not (tmp_path / "empty-cache").exists()  # nothing built
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # let tmp_path be cleaned up


STAMPED_START = """
import importlib.util, json, shutil, sys
sys.modules["fusetune"] = None  # model.py alone
assert shutil.which("nvcc") is None, "nvcc is still on PATH"
spec = importlib.util.spec_from_file_location("generated", {model!r})
generated = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generated)
try:
    generated.load_kernels(build_directory={build!r})
    print(json.dumps({{"library": generated._KERNELS.__file__}}))
except Exception as exc:
    print(json.dumps({{"error": type(exc).__name__}}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_stamped_build_starts_without_nvcc_and_one_stamped_for_another_torch_is_not_imported(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from fusetune.build import BUILD_STAMP, build_and_load, finished

    plan = make_plan(load_config(SEEDS["groupnorm"]))
    space = plan_space(plan)
    rendered = fast.render_winners(plan, [space.stage_values(space.default())])
    cache = Cache(tmp_path / "cache")
    arch = fast.machine_fields()["arch"]
    build_and_load(rendered, cache, arch)  # nvcc, here
    build = cache.build_dir(f"{rendered.name}-sm{arch.replace('.', '')}")
    assert finished(build, arch)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "nvcc").exists())
    env = {**os.environ, "PATH": path, "CUDA_HOME": str(tmp_path / "no-cuda"), "CUDA_PATH": str(tmp_path / "no-cuda")}
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    script = STAMPED_START.format(model=str(cache.module_dir(rendered.name) / "model.py"), build=str(build))

    def start() -> dict:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(start()["library"]).resolve() == (build / f"{rendered.name}.so").resolve()  # imported, no compiler
    stamp = json.loads((build / BUILD_STAMP).read_text())
    (build / BUILD_STAMP).write_text(json.dumps({**stamp, "torch": "1.0.0"}))  # as after a torch upgrade
    assert "error" in start()  # not imported: it builds, and there is no compiler here
    assert not (build / f"{rendered.name}.so").exists() and not finished(build, arch)
