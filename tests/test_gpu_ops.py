"""GPU test of the elementwise helpers whose device form is not their host form (templates/elementwise.cuh): the
quotients through ft_div_fast, __fdividef on the device (sigmoid, silu, gelu's tanh form, mish). tests/test_ops.py
runs the helpers compiled by g++, which checks the host form only; here every sample of those ops runs in a CUDA
kernel (nvcc, default flags as the kernels' builds) over test_ops' grid, checked against PyTorch in float64 as the
host forms are, within DEVICE_ULPS.

Skipped without a CUDA GPU or nvcc: python -m pytest -q -m gpu tests/test_gpu_ops.py
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")]

from test_ops import (PARAM_VALUES, TEMPLATES, ZERO_SIGN_UNCHECKED, input_grid, mismatches, op_functions,  # noqa: E402
                      producer_grid, samples, torch_values)

#: The ops whose helpers differ on the device (ft_div_fast).
DEVICE_FORMS = ("sigmoid", "silu", "gelu", "mish")
#: float32 ulps of the float64 reference: the device's expf and __fdividef are each within 2.
DEVICE_ULPS = 8


def device_program(ops: list) -> str:
    """host_program's CUDA twin: reads n, m, x[n], y[n], p[m] on stdin, evaluates every op's fragment in a kernel
    (a thread per input), writes out[op][p][i] as float32 on stdout."""
    functions = op_functions(ops, "__device__")
    calls = "\n".join(f"    out[({i} * m + j) * n + k] = f{i}(x[k], p[j], y[k]);" for i in range(len(ops)))
    return f"""#include "elementwise.cuh"
#include <stdio.h>
#include <stdint.h>
#include <vector>
#include <cuda_runtime.h>
{functions}
__global__ void ft_run(const float* x, const float* y, const float* p, int n, int m, float* out) {{
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n) return;
  for (int j = 0; j < m; ++j) {{
{calls}
  }}
}}
int main() {{
  int32_t n = 0, m = 0;
  if (fread(&n, 4, 1, stdin) != 1 || fread(&m, 4, 1, stdin) != 1) return 1;
  const size_t outs = (size_t){len(ops)} * m * n;
  std::vector<float> host(2 * n + m), out(outs);
  if (fread(host.data(), 4, host.size(), stdin) != host.size()) return 1;
  float *d = nullptr, *o = nullptr;
  if (cudaMalloc(&d, 4 * host.size()) != cudaSuccess || cudaMalloc(&o, 4 * outs) != cudaSuccess) return 2;
  cudaMemcpy(d, host.data(), 4 * host.size(), cudaMemcpyHostToDevice);
  ft_run<<<(n + 127) / 128, 128>>>(d, d + n, d + 2 * n, n, m, o);
  if (cudaMemcpy(out.data(), o, 4 * outs, cudaMemcpyDeviceToHost) != cudaSuccess) return 3;
  fwrite(out.data(), 4, outs, stdout);
  return 0;
}}
"""


def run_on_device(ops: list, folder: Path, x: np.ndarray) -> np.ndarray:
    """The ops' fragments run on the GPU over ``x``: float32 values, shape (ops, parameter values, inputs)."""
    major, minor = torch.cuda.get_device_capability()
    (folder / "ops.cu").write_text(device_program(ops))
    build = subprocess.run(["nvcc", "-std=c++17", "-O3", f"-arch=sm_{major}{minor}", f"-I{TEMPLATES}", "ops.cu",
                            "-o", "ops"], cwd=folder, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    p = np.array(PARAM_VALUES, np.float32)
    stdin = np.array([x.size, p.size], np.int32).tobytes() + x.tobytes() + producer_grid(x).tobytes() + p.tobytes()
    run = subprocess.run([str(folder / "ops")], input=stdin, capture_output=True, check=True)
    return np.frombuffer(run.stdout, np.float32).reshape(len(ops), p.size, x.size)


def test_device_forms_match_torch(tmp_path):
    chosen = [(sid, op) for sid, op in samples() if sid.split("[")[0] in DEVICE_FORMS]
    assert {sid.split("[")[0] for sid, _ in chosen} == set(DEVICE_FORMS)
    x = input_grid()
    values = run_on_device([op for _, op in chosen], tmp_path, x)
    failures = []
    for (sid, op), got_op in zip(chosen, values):
        for j, param in enumerate(PARAM_VALUES if op.params() else PARAM_VALUES[:1]):
            got, ref = got_op[j], torch_values(op, x, producer_grid(x), param)
            for i in mismatches(got, ref, sid.split("[")[0] not in ZERO_SIGN_UNCHECKED, ulps=DEVICE_ULPS)[:5]:
                failures.append(f"{sid} {op.forward_code('x', None)} x={x[i]!r}: cuda {got[i]!r}, torch {ref[i]!r}")
    assert not failures, "\n".join(failures)
