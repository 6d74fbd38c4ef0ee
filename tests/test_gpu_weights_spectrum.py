"""On a GPU: the spectral world's model keeps its weights' spectrum between forwards (ModelNew._weights_spectrum) and
recomputes it where the weights or the output's size changed. Forwards of one model, with new input values, a step of
the weights in place between them (as an optimizer's), and a new input shape, each match float64 as verification
requires (fusetune.evaluate: within ERROR_RATIO of eager PyTorch's error at the dtype), and the weights kernel runs
at exactly the forwards that needed it. tests/test_weights_spectrum.py has the decisions on the CPU.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_weights_spectrum.py
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.build import build_and_load  # noqa: E402
from fusetune.config import load_config  # noqa: E402
from fusetune.evaluate import ERROR_FLOOR, ERROR_RATIO, _errors  # noqa: E402
from fusetune.lazy import winner_module  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.search import Machine  # noqa: E402

from conftest import ROOT  # noqa: E402

#: A small spectral chain (an even output width, a negative scale, a clamp after the mean), and the batch-norm seed in
#: float32 and bfloat16 at its odd shape (64 -> 128 channels, k = 5).
CONFIGS = [ROOT / "tests" / "gpu_chains" / "convt3d_spectral_bn_gap_clamp.yaml",
           ROOT / "configs" / "convt3d_scale_batchnorm_gap.yaml",
           ROOT / "benchmarks" / "half" / "convt3d_scale_batchnorm_gap_bf16.yaml"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_forwards_across_a_change_of_the_weights_match_float64(config, cache, monkeypatch):
    spec = load_config(config)
    plan = make_plan(spec)
    variant = {"producer": {"impl": "spectral"}}
    generated = build_and_load(winner_module(plan, variant), cache, Machine.detect().capability)
    computed = []  # per spectral_stats launch: whether it was given the weights (computed their spectrum)
    launch = generated._launch

    def spy(kernels, stage, *args, **kwargs):
        if generated.STAGES[stage] == "spectral_stats":
            computed.append(kwargs["weight"].numel() > 0)
        return launch(kernels, stage, *args, **kwargs)

    monkeypatch.setattr(generated, "_launch", spy)
    seed = int.from_bytes(os.urandom(4), "little")  # fresh inputs each run; the seed printed to reproduce one
    print(f"seed {seed}")
    torch.manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    fused = generated.ModelNew(variant=variant).cuda()  # in the config's dtype, as Model is
    fused.fill_value = float("nan")  # unwritten elements show
    eager, exact = generated.Model().cuda(), generated.Model().cuda().double()
    shape, other = tuple(spec.shapes[-1]), (2, spec.shapes[-1][1], 4, 6, 8)
    steps = [(shape, None, True), (shape, None, False), (shape, "step", True), (shape, None, False),
             (other, None, True), (shape, None, True)]
    for at, change, computes in steps:
        if change == "step":
            with torch.no_grad():  # an optimizer's step: in place, by as much as the weights' own size
                fused.producer.weight.add_(torch.randn_like(fused.producer.weight) * fused.producer.weight.std())
        eager.load_state_dict(fused.state_dict())
        exact.load_state_dict(fused.state_dict())
        x = torch.randn(at, device="cuda", dtype=dtype)
        with torch.no_grad():
            out, out_eager, out64 = fused(x), eager(x), exact(x.double())
        eager_rel, eager_mx = _errors(out_eager, out64)
        rel, mx = _errors(out, out64)
        assert rel <= max(ERROR_RATIO * eager_rel, ERROR_FLOOR) and mx <= max(ERROR_RATIO * eager_mx, ERROR_FLOOR), \
            (at, change, rel, mx, eager_rel, eager_mx)
        assert computed[-1] == computes, (at, change, computed)
    assert len(computed) == len(steps)
