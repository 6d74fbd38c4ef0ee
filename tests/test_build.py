"""Loading built kernels without a GPU: the flags a load passes must be those of the build."""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from fusetune.build import BuildResult, build, load_kernels
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
