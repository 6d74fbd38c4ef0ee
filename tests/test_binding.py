"""The binding (binding.cpp: Python's C API, no torch header) and model.py's ``_launch`` agree on what each
argument is: every keyword of ``_launch`` reaches its own FtArgs field, each dim its own size, each stage
its own launcher. The binding is compiled here by the host compiler with stub launchers that return the
field a test asks for (by the variant index), so no GPU and no CUDA toolkit library is needed."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

from fusetune.build import load_generated
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.plan import make_plan

from conftest import ROOT

GXX = shutil.which("g++")
CUDA_INCLUDE = next((p for p in (Path("/usr/local/cuda/include"),) if (p / "cuda_runtime.h").exists()), None)
if shutil.which("nvcc") and CUDA_INCLUDE is None:
    CUDA_INCLUDE = Path(shutil.which("nvcc")).resolve().parent.parent / "include"

#: What the stub launchers return for each variant index: one FtArgs field each (an address as an integer).
FIELDS = ["y", "out", "partials", "ab", "stats", "bias", "x", "weight", "extra", "norm_weight", "norm_bias",
          "running_mean", "running_var", "weight_spectrum", "p[0]", "p[1]", "N", "C", "D", "H", "W", "OD", "OH", "OW", "ID", "IH",
          "IW", "stats_splits", "splits", "layout", "(int)(a.momentum * 4)", "(int)(uintptr_t)stream"]
#: A chain with a norm, parameters and a pool (four stages), one of the K-tiled worlds (wide_workspace), and a
#: half one (where the workspace's float32 differs from the model's dtype).
CONFIGS = ["configs/conv2d_groupnorm_scale_maxpool_clamp.yaml", "tests/chains/conv3d_wide72_batchnorm_selu_maxpool.yaml",
           "benchmarks/half/convt3d_scale_batchnorm_gap_fp16.yaml"]


def _stubs(stages: list[str]) -> str:
    cases = "\n".join(f"    case {i}: return (int)(intptr_t)({f if f.startswith('(') else 'a.' + f});"
                      for i, f in enumerate(FIELDS))
    lines = ["#include <cstdint>", 'extern "C" const char* cudaGetErrorString(cudaError_t) { return "stub"; }',
             "static int ft_field(int variant, const FtArgs& a, cudaStream_t stream) {", "  switch (variant) {",
             cases, "    default: return -1;", "  }", "}"]
    for i, stage in enumerate(stages):
        lines.append(f'extern "C" int ft_launch_{stage}(int variant, FtArgs a, cudaStream_t stream) '
                     f"{{ return {i} * 100000 + ft_field(variant, a, stream); }}")
    return "\n".join(lines) + "\n"


def _compiled(config: str, tmp_path: Path):
    plan = make_plan(load_config(ROOT / config))
    module = render(plan)
    folder = module.write(tmp_path / module.name)
    source = tmp_path / "binding_stubs.cpp"
    source.write_text((folder / "binding.cpp").read_text() + "\n" + _stubs(list(plan.stages)))
    library = tmp_path / f"{module.name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    build = subprocess.run([GXX, "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", str(source),
                            f"-I{sysconfig.get_paths()['include']}", f"-I{CUDA_INCLUDE}",
                            f"-DTORCH_EXTENSION_NAME={module.name}", "-o", str(library)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-3000:]
    spec = importlib.util.spec_from_file_location(module.name, library)
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    return plan, load_generated(folder), kernels


class _Fake:
    """A stand-in tensor: its address, and a device for ``_launch``'s stream."""

    def __init__(self, address: int):
        self.address = address
        self.device = torch.device("cuda", 0)

    def numel(self) -> int:
        return 1


class _Recorder:
    def __init__(self):
        self.calls = []

    def launch(self, *args):
        self.calls.append(args)
        return 0


@pytest.mark.skipif(GXX is None or CUDA_INCLUDE is None, reason="g++ or CUDA's headers not found")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: Path(c).stem)
def test_launch_keywords_reach_their_fields(config, tmp_path, monkeypatch):
    plan, model, kernels = _compiled(config, tmp_path)
    asked = []
    monkeypatch.setattr(model, "_address", lambda t, dtype, what: asked.append((what, dtype)) or (0 if t is None else t.address))
    monkeypatch.setattr(model, "_stream", lambda device: 77)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # the fakes' device is the current one
    tensors = {name: _Fake(1000 + 16 * i) for i, name in enumerate(["y", "out", "partials", "ab", "stats", "bias", "x",
                                                                     "weight", "extra", "weight_spectrum"])}
    norm = [_Fake(2000 + 16 * i) for i in range(4)]
    params = [_Fake(3000), _Fake(3016)]
    dims = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    recorder = _Recorder()
    model._launch(recorder, 1, 0, dims, **tensors, norm=norm, params=params, stats_splits=41, splits=43,
                  momentum=0.25, layout=1)
    (stage, _, addresses, dims_sent, *rest), = recorder.calls
    expected = {**{k: t.address for k, t in tensors.items()},
                **dict(zip(["norm_weight", "norm_bias", "running_mean", "running_var"], [t.address for t in norm])),
                "p[0]": 3000, "p[1]": 3016, **dict(zip(["N", "C", "D", "H", "W", "OD", "OH", "OW", "ID", "IH", "IW"], dims)),
                "stats_splits": 41, "splits": 43, "layout": 1, "(int)(a.momentum * 4)": 1, "(int)(uintptr_t)stream": 77}
    for variant, field in enumerate(FIELDS):
        status = kernels.launch(stage, variant, addresses, dims_sent, *rest)
        assert status == stage * 100000 + expected[field], field
    # The workspace is float32 whatever the dtype; the model's own tensors are in its dtype, but for y as
    # gemm_store's float words (layout 2) and x and weight as spectra (layout 3).
    words, dtype = torch.float32, model.DTYPE
    for layout, y, x in ((0, dtype, dtype), (1, dtype, dtype), (2, words, dtype), (3, dtype, words)):
        asked.clear()
        model._launch(_Recorder(), 0, 0, dims, **tensors, norm=norm, params=params, layout=layout)
        wanted = {"y": y, "out": dtype, "partials": words, "ab": words, "stats": words, "the producer's bias": dtype,
                  "x": x, "weight": x, "extra": dtype, "the norm's weight": dtype, "the norm's bias": dtype,
                  "the norm's running mean": dtype, "the norm's running variance": dtype, "the weights' spectrum": words,
                  "a parameter": dtype}
        assert asked == [(what, wanted[what]) for what, _ in asked] and len(asked) == len(addresses), layout
    for stage in range(len(plan.stages)):  # each stage index reaches its own launcher
        assert kernels.launch(stage, FIELDS.index("N"), addresses, dims_sent, *rest) == stage * 100000 + 3
    assert kernels.launch(len(plan.stages), 0, addresses, dims_sent, *rest) == -4  # FT_BAD_STAGE
    assert kernels.launch(stage, 0, addresses, dims_sent[:10], *rest) == -3  # FT_BAD_ARGS: 10 dims
    assert kernels.launch(stage, 0, addresses[:5], dims_sent, *rest) == -3  # too few addresses
    assert kernels.describe(-4) == "no such stage" and kernels.describe(7) == "stub"
    with pytest.raises(TypeError):
        kernels.launch(stage, 0, list(addresses), dims_sent, *rest)
    if hasattr(kernels, "wide_workspace"):
        assert kernels.wide_workspace(*dims[:5]) > 0
