"""GPU tests of mean centring and scalar parameters in the kernels (tests/test_centring.py has the plans and the
lowering on the CPU; a layer norm over some trailing dims is tests/test_gpu_layer_norm.py's): each config in
every world its plan offers (cuDNN's in both layouts; not torch.compile's), and each later region's, its default
variant built and verified against float64 through fusetune's own evaluation (fresh inputs, NaN-filled outputs,
norms moved off their identity, shapes no tile divides), as scripts/verify-chains does.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_centring.py
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


from conftest import ROOT, verify_worlds  # noqa: E402

#: The configs: a centring in region 0 over each scope (a plane after a transposed convolution, before a max
#: pool; a sample; a channel over the batch), one finalize computes a spatial mean after, one a group norm
#: follows (a later region), one after a batch norm (a later region on the tensor as it is), one over the last
#: dims (a later region on a plane view); scalar parameters after a channel min.
CONFIGS = ["chains/convt2d_centre_spatial_tanh_maxpool", "centring/centre_chw_gelu", "centring/centre_batch_scope_relu",
           "centring/centre_chw_spatial_mean", "centring/centre_spatial_groupnorm",
           "chains/convt3d_batchnorm_centre_spatial", "views/centre_last_dims_tanh",
           "chains/conv2d_min_channels_keepdim_scalar_bias_tanh"]
#: Worlds that must verify, by region (a later one named <name>_r<k>; cudnn for any other); a tensor-core
#: world's TF32 refusal as scripts/verify-chains judges it counts.
MUST_RUN = {"convt2d_centre_spatial_tanh_maxpool": ("cudnn", "cudnn/channels_last", "direct"),
            "centre_chw_gelu": ("cudnn", "cudnn/channels_last", "direct", "gemm", "gemm_store"),
            "centre_batch_scope_relu": ("cudnn", "cudnn/channels_last", "direct", "gemm", "gemm_store"),
            "centre_chw_spatial_mean": ("cudnn", "direct", "gemm"),
            # 10 channels: no direct world (its channel reductions take 2 to 32 in powers of two)
            "conv2d_min_channels_keepdim_scalar_bias_tanh": ("cudnn", "cudnn/channels_last", "gemm_wide")}
#: The later regions each config must have verified.
LATER = {"centre_spatial_groupnorm": ["centre_spatial_groupnorm_r1"],
         "convt3d_batchnorm_centre_spatial": ["convt3d_batchnorm_centre_spatial_r1"],
         "centre_last_dims_tanh": ["views_centre_last_dims_tanh_r1"]}


@pytest.mark.parametrize("config", CONFIGS)
def test_every_world_matches_float64(config, cache, worker):
    path = ROOT / "tests" / f"{config}.yaml"
    records, failed = verify_worlds(path, cache, worker)
    assert records and not failed, "\n".join(failed)
    regions = {r["name"] for r in records}
    assert set(LATER.get(path.stem, [])) <= regions, sorted(regions)
    for region in regions:
        ok = {r["impl"] for r in records if r["name"] == region and r["status"] in ("ok", "tf32_refused")}
        missing = [impl for impl in MUST_RUN.get(region, ("cudnn",)) if impl not in ok]
        assert not missing, (region, missing, sorted(ok))
