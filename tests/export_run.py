"""Run an exported module in a fresh interpreter, without fusetune, and compare it with its reference.

Shared by the GPU tests that check an export stands alone (tests/test_gpu.py: a built export;
tests/test_fast_start.py: a prebuilt one from a read-only folder, without nvcc): the same script
builds the reference ``Model`` and the fused ``ModelNew`` with one set of weights, runs both on one
random input, and reports what each test asserts on, so that the two cannot drift apart.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

#: The script: ``first_forward_s`` from before the import to the first forward's end (the start-up a
#: user waits through), the kernel library loaded (None where the winner is PyTorch's or torch.compile's
#: forward: no kernels), the relative error against float64, and what a
#: float64 input gave (the message it was refused with, or None where it was accepted).
SCRIPT = """
import json, shutil, sys, time
sys.modules["fusetune"] = None  # the export must not need fusetune
import torch
if {without_nvcc!r}:
    assert shutil.which("nvcc") is None, "nvcc is still on PATH"
start = time.perf_counter()
sys.path.insert(0, {parent!r})
from {name} import Model, ModelNew, model as generated
torch.manual_seed(1)
ref = Model().cuda()
fused = ModelNew().cuda()
fused.load_state_dict(ref.state_dict())
x = torch.rand({shape!r}, device="cuda")
with torch.no_grad():
    got = fused(x)
torch.cuda.synchronize()
first_s = time.perf_counter() - start
with torch.no_grad():
    want = ref.double()(x.double())
    try:
        fused(x.double())
        float64 = None
    except ValueError as exc:
        float64 = str(exc)
print(json.dumps({{"first_forward_s": first_s, "library": getattr(generated._KERNELS, "__file__", None),
                  "error": ((got.double() - want).norm() / want.norm()).item(), "float64": float64}}))
"""


def run_export(export_dir: Path, shape: Sequence[int], env: Mapping[str, str], *,
               without_nvcc: bool = False) -> dict[str, Any]:
    """Import ``export_dir`` as a package in a new interpreter under ``env``, run it on ``shape`` and
    return the script's report; a failing script fails the test with its output."""
    script = SCRIPT.format(parent=str(export_dir.parent), name=export_dir.name, shape=list(shape),
                           without_nvcc=without_nvcc)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(env), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
