"""GPU tests of adaptive pools to a grid in the kernels (tests/test_adaptive.py has the window bounds, the plan
and the rendering on the CPU): PyTorch's windows, of unequal sizes where the output does not divide the input,
at any shape.

Each corpus chain with an adaptive grid, in every world its plan offers (cuDNN's in both layouts, gemm_wide's
statistics before window_map, and direct and gemm where the windows are one window at the config's shapes; not
torch.compile's), its default variant verified against float64 as
scripts/verify-chains does (fresh inputs, NaN-filled outputs, norms moved off their identity); every compiled
variant and run-time choice of the main kernels that pool them (window_map averaging and taking the max in 2-D,
plane_reduce after a 3-D max), both layouts, at the config's shapes and at one that is not, no tile dividing
them; and a max pool's NaN, which propagates exactly where PyTorch's does.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_adaptive.py
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.codegen import plan_space, render  # noqa: E402
from fusetune.config import load_config  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.runner import GpuBenchmarker  # noqa: E402
from fusetune.search import Machine, shape_facts  # noqa: E402
from fusetune.space import candidate_key  # noqa: E402

from conftest import ROOT, verify_worlds  # noqa: E402

CHAINS = ROOT / "tests" / "chains"
GRID_CHAINS = sorted(p.stem for p in CHAINS.glob("*adaptive*grid*.yaml"))
#: Worlds that must verify, by chain (cudnn in both layouts for any other): gemm_wide's statistics before
#: window_map; direct and gemm where the windows are one 4 x 4 window at the config's shapes.
MUST_RUN = {"convt3d_wide64_stride1_groupnorm_relu_adaptiveavgpool_grid": ("cudnn", "cudnn/channels_last",
                                                                          "gemm_wide"),
            "conv2d_relu_adaptivemaxpool_grid_divides": ("cudnn", "cudnn/channels_last", "direct", "gemm")}
#: The chains whose main kernels run every variant, each at its config's shapes and at one more, whose
#: convolution output no window, tile or vector width divides (the grid (2, 3), (4, 5), (2, 3, 2)).
VARIANT_SHAPES = {"conv2d_relu6_adaptiveavgpool_grid_flatten": [(2, 8, 19, 26)],
                  "conv2d_relu_adaptivemaxpool_grid_divides": [(3, 8, 21, 25)],
                  "conv3d_hardtanh_adaptivemaxpool_grid_mean_keepdim": [(2, 4, 10, 15, 9)]}


@pytest.mark.parametrize("name", GRID_CHAINS)
def test_every_world_of_an_adaptive_grid_chain_matches_float64(name, cache, worker):
    records, failed = verify_worlds(CHAINS / f"{name}.yaml", cache, worker)
    assert records and not failed, "\n".join(failed)
    ok = {r["impl"] for r in records if r["name"] == name and r["status"] in ("ok", "tf32_refused")}
    missing = [impl for impl in MUST_RUN.get(name, ("cudnn", "cudnn/channels_last")) if impl not in ok]
    assert not missing, (missing, sorted(ok))


def _covering(space, facts) -> list:
    """Feasible cuDNN-world candidates that between them run every compiled variant and every run-time choice
    (layout, splits) of its stages (greedy: the sum of the stages' spaces, not their product)."""
    covered, out = set(), []
    for candidate in space.all({"producer.impl": "cudnn"}):
        if space.violations(candidate, facts):
            continue
        parts = {(f.family, p.name, candidate[f"{f.family}.{p.name}"]) for f in space.active(candidate)
                 for p in f.params if not p.compile_time}
        parts |= {("producer.layout", candidate.get("producer.layout"))}
        parts |= {(f.family, repr(sorted((p.name, candidate[f"{f.family}.{p.name}"]) for p in f.compile_params)))
                  for f in space.active(candidate)}
        if not parts <= covered:
            covered |= parts
            out.append(candidate)
    return out


@pytest.mark.parametrize("name", sorted(VARIANT_SHAPES))
def test_every_variant_of_the_main_kernels_pools_torchs_windows(name, cache, worker):
    machine = Machine.detect()
    spec = load_config(CHAINS / f"{name}.yaml")
    plan = make_plan(spec)
    assert plan.pool_output is not None
    space = plan_space(plan)
    failures, verified = [], 0
    for shape in [*spec.shapes, *VARIANT_SHAPES[name]]:
        bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
        bench.prepare()
        facts = shape_facts(spec, plan, shape, machine.capability)
        candidates = _covering(space, facts)
        assert {c.get("producer.layout") for c in candidates} == {"contiguous", "channels_last"}
        for candidate in candidates:
            outcome = bench.verify(candidate)
            verified += 1
            if outcome["status"] != "ok":
                failures.append((shape, candidate_key(candidate), outcome))
    print(name, plan.describe(), verified, "candidates verified")
    assert not failures, failures[:5]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_max_pools_nan_propagates_as_torchs(layout, cache, tmp_path):
    """A NaN in the input reaches the convolution's outputs around it; every adaptive window that holds one is
    NaN, as in PyTorch, and no other (the output NaN-filled first: an element left unwritten shows too), at a
    shape whose windows are unequal; the other values within float32's error (precision ieee: no TF32)."""
    import yaml

    from fusetune.build import build_and_load

    raw = yaml.safe_load((CHAINS / "conv2d_relu_adaptivemaxpool_grid_divides.yaml").read_text())
    path = tmp_path / "adaptive_nan.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "adaptive_nan", "precision": "ieee"}, sort_keys=False))
    spec = load_config(path)
    generated = build_and_load(render(make_plan(spec)), cache, Machine.detect().capability)
    model = generated.ModelNew(variant={"producer": {"impl": "cudnn", "layout": layout}}).cuda().eval()
    model.fill_value = float("nan")
    reference = generated.Model().cuda().double().eval()
    reference.load_state_dict(model.state_dict())
    seed = int.from_bytes(os.urandom(4), "little")  # fresh inputs each run; the seed printed to reproduce one
    print(f"seed {seed}")
    torch.manual_seed(seed)
    x = torch.randn(2, 8, 21, 25, device="cuda")  # 19 x 23 after the convolution: windows of 4 and 5, 4 and 6
    x[0, 3, 10, 12] = float("nan")
    x[1, 0, 0, 24] = float("nan")
    with torch.no_grad():
        out = model(x)
        want = reference(x.double())
    assert out.shape == want.shape
    assert want.isnan().any() and not want.isnan().all()
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.allclose(out.double().nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-5)
