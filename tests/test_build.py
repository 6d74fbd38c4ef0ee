"""Loading built kernels without a GPU: the flags a load passes must be those of the build."""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from fusetune.build import BuildResult, build, load_generated, load_kernels
from fusetune.cache import Cache
from fusetune.codegen import RenderedModule
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.runner import GpuBenchmarker
from fusetune.search import Machine

from conftest import SEEDS


@pytest.mark.parametrize("before", [None, "8.0"])
def test_kernels_load_under_the_architecture_they_were_built_for(before, monkeypatch):
    """torch turns TORCH_CUDA_ARCH_LIST into nvcc's -gencode flags, and ninja rebuilds every unit
    whose flags changed: a load must see the build's value, and leave the caller's as it was."""
    if before is None:
        monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    else:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", before)
    seen = []
    generated = types.SimpleNamespace(load_kernels=lambda build_directory: seen.append(
        (build_directory, os.environ.get("TORCH_CUDA_ARCH_LIST"))))
    load_kernels(generated, "/tmp/b", "9.0")
    assert seen == [("/tmp/b", "9.0")] and os.environ.get("TORCH_CUDA_ARCH_LIST") == before


def test_worker_jobs_name_the_build_architecture(tmp_path):
    """The worker loads the module the search built: its jobs carry the architecture it was built for."""
    machine = Machine("FakeGPU", "9.0", "13.0", "2.13")
    bench = GpuBenchmarker(make_plan(load_config(SEEDS["groupnorm"])), (2, 8, 9, 9), Cache(tmp_path), machine,
                           worker=None)
    module = BuildResult("m", True, 0.0, "", Path(tmp_path / "m"), Path(tmp_path / "b"))
    assert bench._job("open", None, module)["arch"] == "9.0"


def _module(name: str, load_kernels_body: str) -> RenderedModule:
    """A module whose build (fusetune.build's child: import model.py, call load_kernels) runs the body."""
    model = f"def load_kernels(build_directory):\n    import os, signal, sys\n    {load_kernels_body}\n"
    return RenderedModule(name=name, files={"model.py": model}, source_hash=name)


def test_a_build_failure_is_remembered_and_a_killed_build_is_not(tmp_path):
    """A compiler error is the sources' for good: the next build of the same sources answers from the
    cache. A build killed from outside (Ctrl-C kills every running build; the OOM killer) says nothing
    about the sources: it must not be remembered as a failure, or the next search would skip them."""
    cache = Cache(tmp_path)
    failing = _module("ft_fails", "sys.exit(3)")
    first = build(failing, cache)
    assert not first.ok and not first.cached
    again = build(failing, cache)
    assert not again.ok and again.cached
    killed = _module("ft_killed", "os.kill(os.getpid(), signal.SIGKILL)")
    first = build(killed, cache)
    assert not first.ok and "killed by signal 9" in first.log
    again = build(killed, cache)
    assert not again.ok and not again.cached  # built again, not answered from the cache
    # the OOM killer takes a compiler under the build, which then fails with status 1
    oom = _module("ft_oom", "print(\"nvcc error   : 'cicc' died due to signal 9 (Kill signal)\"); sys.exit(1)")
    assert not build(oom, cache).ok and not build(oom, cache).cached
    # a crash of the build's own process is its sources' (a loader fault, say): remembered
    crash = _module("ft_crash", "os.kill(os.getpid(), signal.SIGSEGV)")
    assert not build(crash, cache).ok and build(crash, cache).cached


def test_a_build_dies_with_its_parent_and_the_next_build_takes_its_place(tmp_path):
    """A fleet worker killed with SIGKILL mid-build: its build and the build's compilers die with it (an
    orphaned build is work nobody reads, and its torch lock, removed by the next build, would be released
    under that build: seen on four H200s as 'No such file or directory: .../lock'); the next build of the
    module runs, finding the dead one's torch lock stale."""
    import subprocess
    import sys
    import time

    pids = tmp_path / "compiler.pid"
    body = (f"compiler = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"    open({str(pids)!r}, 'w').write(str(compiler.pid))\n    compiler.wait()")
    script = tmp_path / "parent.py"  # a process that builds, as a fleet worker does
    script.write_text(f"import sys\nfrom pathlib import Path\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      f"from fusetune.build import build\nfrom fusetune.cache import Cache\nfrom test_build import _module\n"
                      f"build(_module('ft_slow', {('import subprocess' + chr(10) + '    ' + body)!r}), "
                      f"Cache(Path({str(tmp_path)!r})))\n")
    parent = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids.exists(), "the build never started its compiler"
    time.sleep(0.2)
    compiler = int(pids.read_text())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(compiler) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(compiler), "the build's compiler outlived the process that started the build"
    cache = Cache(tmp_path)
    build_dir = cache.build_dir("ft_slow")
    (build_dir / "lock").write_text("")  # torch's lock, left by the killed build
    done = build(_module("ft_slow", "open(os.path.join(build_directory, 'out'), 'w').write('x')"), cache)
    assert done.ok and (build_dir / "out").exists() and not (build_dir / "lock").exists()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped by its parent, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_generated_module_is_reused_from_its_own_file_only(tmp_path):
    """Two folders of one name (a later region's r1 in two tests, two caches) hold different code: each import is
    its own file's, and the same file again is the module already imported."""
    first, second = tmp_path / "a" / "r1", tmp_path / "b" / "r1"
    for folder, value in ((first, 1), (second, 2)):
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(f"VALUE = {value}\n")
    one = load_generated(first)
    assert (one.VALUE, load_generated(second).VALUE) == (1, 2)
    assert load_generated(first) is not one or one.VALUE == 1
    again = load_generated(first)
    assert again.VALUE == 1 and load_generated(first) is again
