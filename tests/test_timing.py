"""search.timing: a candidate timed as its forward is issued op by op (``launch``), or replayed from a CUDA graph
(``graph``, optimize's). The setting travels from the config to the worker's timing; it keys the cache."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from fusetune import evaluate
from fusetune.build import BuildResult
from fusetune.cache import Cache
from fusetune.config import load_config
from fusetune.evaluate import median_ms
from fusetune.plan import make_plan
from fusetune.runner import GpuBenchmarker
from fusetune.search import Machine

from conftest import SEEDS

MACHINE = Machine("FakeGPU", "9.0", "13.0", "2.13")


def _graph_spec(timing: str):
    spec = load_config(SEEDS["groupnorm"])
    return dataclasses.replace(spec, search=dataclasses.replace(spec.search, timing=timing))


@pytest.mark.parametrize("timing", ["launch", "graph"])
def test_the_workers_jobs_carry_the_configs_timing(timing: str, tmp_path: Path) -> None:
    bench = GpuBenchmarker(make_plan(_graph_spec(timing)), (2, 8, 9, 9), Cache(tmp_path), MACHINE, worker=None)
    module = BuildResult("m", True, 0.0, "", Path(tmp_path / "m"), Path(tmp_path / "b"))
    assert bench._job("evaluate", None, module)["timing"] == timing
    assert bench._job("eager", None, module)["timing"] == timing


@pytest.mark.parametrize("kind", ["evaluate", "eager"])
@pytest.mark.parametrize("timing", [None, "launch", "graph"])
def test_the_worker_times_a_candidate_and_eager_as_the_job_says(kind: str, timing: str | None,
                                                                 monkeypatch) -> None:
    """A job without ``timing`` (a worker of an older fusetune's queue) times as before: op by op."""
    timed: list[tuple[str, str]] = []

    class Session:
        def verify(self, variant):
            return {"status": "ok"}

        def time(self, variant, reps, timing="launch"):
            timed.append(("candidate", timing))
            return 1.0

        def time_eager(self, reps, timing="launch"):
            timed.append(("eager", timing))
            return 2.0

    monkeypatch.setattr(evaluate, "_session", lambda job: Session())
    job = {"kind": kind, "variant": {}, **({"timing": timing} if timing else {})}
    result = evaluate.handle(job)
    assert result["status"] == "ok" and result["time_ms"] == (1.0 if kind == "evaluate" else 2.0)
    assert timed == [("candidate" if kind == "evaluate" else "eager", timing or "launch")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_graph_times_many_small_kernels_without_the_hosts_gaps() -> None:
    """Forty tiny kernels: issued one by one the host's launches are most of their time; in a graph they are
    not. And what cannot be captured (a host read of a device value) raises instead of timing something else."""
    x = torch.randn(64, device="cuda")

    def small_kernels():
        y = x
        for _ in range(40):
            y = y * 1.0001 + 0.5
        return y

    launched = median_ms(small_kernels, reps=30)
    graphed = median_ms(small_kernels, reps=30, timing="graph")
    assert graphed < 0.8 * launched, (graphed, launched)
    with pytest.raises(Exception):
        median_ms(lambda: x.sum().item(), reps=3, timing="graph")
