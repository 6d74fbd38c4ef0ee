"""Loading built kernels without a GPU: the flags a load passes must be those of the build."""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from fusetune.build import BuildResult, load_kernels
from fusetune.cache import Cache
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
