"""On a GPU: a direct-world winner of an adaptive pool whose windows are one 4 x 4 window at the config's shapes
alone (EXACT_WORLDS), built as optimize builds it (its own module: lazy.winner_module), run at a shape of unequal
windows. The cuDNN world's default kernels run there (the module compiles them), match float64 as verification
requires (fusetune.evaluate: within ERROR_RATIO of eager PyTorch's error), and the log says so once; at a config
shape the direct kernels run. tests/test_fallback.py has the decisions on the CPU.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_fallback.py
"""
from __future__ import annotations

import logging
import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.build import build_and_load  # noqa: E402
from fusetune.codegen import plan_space  # noqa: E402
from fusetune.config import load_config  # noqa: E402
from fusetune.evaluate import ERROR_FLOOR, ERROR_RATIO, _errors  # noqa: E402
from fusetune.lazy import starts, winner_module  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.search import Machine  # noqa: E402

from conftest import ROOT  # noqa: E402

GRID = ROOT / "tests" / "chains" / "conv2d_relu_adaptivemaxpool_grid_divides.yaml"
#: The convolution's 17 x 21 output into the 4 x 5 grid: windows of 4 and 5 rows, 4 and 5 columns.
UNEQUAL = (3, 8, 19, 23)


def test_a_direct_winner_runs_cudnns_kernels_where_its_windows_are_unequal(cache, monkeypatch, caplog):
    plan = make_plan(load_config(GRID))
    capability = Machine.detect().capability
    # The direct world's start as the search takes it: the feasible candidate nearest its defaults at the config's
    # shape (its template defaults are not feasible there: a launch with them fails as an invalid argument).
    start = next(c for c in starts(plan.spec, plan, tuple(plan.spec.shapes[0]), capability)
                 if c.get("producer.impl") == "direct")
    variant = plan_space(plan).stage_values(start)
    generated = build_and_load(winner_module(plan, variant), cache, capability)
    launched = []
    launch = generated._launch

    def spy(kernels, stage, *args, **kwargs):
        launched.append(generated.STAGES[stage])
        return launch(kernels, stage, *args, **kwargs)

    monkeypatch.setattr(generated, "_launch", spy)
    monkeypatch.setattr(generated, "_SAID", set())
    caplog.set_level(logging.WARNING)
    seed = int.from_bytes(os.urandom(4), "little")  # fresh inputs each run; the seed printed to reproduce one
    print(f"seed {seed}")
    torch.manual_seed(seed)
    fused = generated.ModelNew(variant=variant).cuda()
    fused.fill_value = float("nan")
    reference = generated.Model().cuda()
    reference.load_state_dict(fused.state_dict())
    exact = generated.Model().cuda().double()
    exact.load_state_dict(fused.state_dict())
    for shape, stages in ((UNEQUAL, ["window_map"]), (tuple(plan.spec.shapes[0]), ["direct_main"])):
        launched.clear()
        x = torch.randn(shape, device="cuda")
        with torch.no_grad():
            out, eager, out64 = fused(x), reference(x), exact(x.double())
        assert launched == stages, (shape, launched)
        eager_rel, eager_mx = _errors(eager, out64)
        rel, mx = _errors(out, out64)
        assert rel <= max(ERROR_RATIO * eager_rel, ERROR_FLOOR) and mx <= max(ERROR_RATIO * eager_mx, ERROR_FLOOR), \
            (shape, rel, mx, eager_rel, eager_mx)
    said = [r.getMessage() for r in caplog.records if r.name == f"fusetune.generated.{generated.MODULE_NAME}"]
    assert len(said) == 1 and "the direct world does not run input shape" in said[0] and "cudnn world" in said[0]
