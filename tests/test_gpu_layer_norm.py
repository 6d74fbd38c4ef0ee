"""GPU tests of layer norm in the kernels (tests/test_layer_norm.py has the plan and the lowering on the CPU):
each corpus chain with a layer norm, in every world its plan offers (cuDNN's in both layouts; not
torch.compile's), its default variant built and verified against float64 through fusetune's own evaluation
(fresh inputs, NaN-filled outputs, the norm's per-element weight and bias moved off their identity, shapes no
tile divides), as scripts/verify-chains does; and the per-element affine at float16, where the main kernels
read the weight in the dtype.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_layer_norm.py
"""
from __future__ import annotations

import pytest
import yaml

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


from conftest import ROOT, verify_worlds  # noqa: E402

CHAINS = ROOT / "tests" / "chains"
#: The layer norm chains: over (C, H, W) with its affine, over the spatial dims (3-D, and 1-D after a transposed
#: convolution), over (H, W) before an average pool, over (C, H, W) before a spatial mean (the reduction's
#: kernels index the affine too), over (C, H, W) without an affine before a max pool (every
#: world), over the last dim alone and over (H, W) of a 3-D output (a later region of kernels on a plane view), and over
#: (C, H, W) after a pool (a later region's kernels).
LAYER_NORM_CHAINS = ["conv2d_layernorm_chw_gelu", "conv3d_layernorm_dhw_gelu", "convt1d_layernorm_gelu",
                     "conv2d_layernorm_hw_relu_avgpool", "conv2d_layernorm_chw_noaffine_maxpool",
                     "conv2d_layernorm_chw_gelu_scale_mean", "conv2d_layernorm_w_gelu",
                     "conv2d_maxpool_layernorm_chw_relu", "conv3d_layernorm_hw_gelu"]
#: Worlds that must verify (not merely be infeasible at the shape; a tensor-core world's TF32 refusal as
#: scripts/verify-chains judges it counts), by region (a later one named <chain>_r<k>); cudnn for any other.
MUST_RUN = {"conv2d_layernorm_chw_gelu": ("cudnn", "cudnn/channels_last", "direct", "gemm", "gemm_store"),
            "conv3d_layernorm_dhw_gelu": ("cudnn", "cudnn/channels_last", "direct", "gemm", "gemm_store"),
            "convt1d_layernorm_gelu": ("cudnn", "direct"),
            "conv2d_layernorm_hw_relu_avgpool": ("cudnn", "cudnn/channels_last", "direct"),
            "conv2d_layernorm_chw_gelu_scale_mean": ("cudnn", "cudnn/channels_last", "direct", "gemm", "gemm_store"),
            "conv2d_layernorm_chw_noaffine_maxpool": ("cudnn", "cudnn/channels_last", "direct", "gemm",
                                                      "gemm_extrema", "gemm_store"),
            "conv2d_maxpool_layernorm_chw_relu_r1": ("cudnn", "cudnn/channels_last"),
            "conv3d_layernorm_hw_gelu_r1": ("cudnn",)}


@pytest.mark.parametrize("name", LAYER_NORM_CHAINS)
def test_every_world_of_a_layer_norm_chain_matches_float64(name, cache, worker):
    records, failed = verify_worlds(CHAINS / f"{name}.yaml", cache, worker)
    assert records and not failed, "\n".join(failed)
    for region in {r["name"] for r in records}:
        ok = {r["impl"] for r in records if r["name"] == region and r["status"] in ("ok", "tf32_refused")}
        missing = [impl for impl in MUST_RUN.get(region, ("cudnn",)) if impl not in ok]
        assert not missing, (region, missing, sorted(ok))
    assert name + "_r1" not in MUST_RUN or any(r["name"] == name + "_r1" for r in records)  # the later region ran


@pytest.mark.parametrize("name", ["conv2d_layernorm_chw_gelu", "conv2d_layernorm_hw_relu_avgpool",
                                  "conv2d_layernorm_chw_gelu_scale_mean"])
def test_the_per_element_affine_at_float16(name, cache, worker, tmp_path):
    raw = yaml.safe_load((CHAINS / f"{name}.yaml").read_text())
    raw["dtype"] = "float16"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    records, failed = verify_worlds(path, cache, worker)
    assert records and not failed, "\n".join(failed)
    ran = {r["impl"] for r in records if r["status"] in ("ok", "tf32_refused")}
    assert {"cudnn", "cudnn/channels_last", "direct"} <= ran and ("gemm" in ran or "gemm" not in MUST_RUN[name])
