"""GPU tests of an op that reads the convolution's output after the norm (``by: producer`` in the mid chain;
tests/test_producer_after_norm.py has the plan, the lowering and the compile on the CPU): each chain of that
file, in every world its plan offers (cuDNN's in both layouts; not torch.compile's), its default variant built
and verified against float64 through fusetune's own evaluation (fresh inputs, NaN-filled outputs, norms moved
off their identity, shapes no tile divides), as scripts/verify-chains does. Between them they run every main
stage of facts.PRODUCER_STAGES.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_producer_after_norm.py
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


from conftest import verify_worlds  # noqa: E402
from test_producer_after_norm import CHAINS  # noqa: E402

#: Worlds that need more than a CUDA GPU of compute capability 8.0 (gemm_cluster: thread-block clusters, sm_90):
#: elsewhere their refusal (launch_error from the launcher's own check) is not required to be "ok".
NEEDS_SM90 = ("gemm_cluster",)


@pytest.mark.parametrize("folder, stem, worlds", CHAINS, ids=[c[1] for c in CHAINS])
def test_every_world_of_a_chain_reading_the_output_after_its_norm_matches_float64(folder, stem, worlds, cache,
                                                                                  worker):
    records, failed = verify_worlds(folder / f"{stem}.yaml", cache, worker)
    assert records and not failed, "\n".join(failed)
    assert {r["name"] for r in records} == {stem}  # one region: the kernels take the whole chain
    ran = {r["impl"] for r in records if r["status"] in ("ok", "tf32_refused")}
    must = {"cudnn", "cudnn/channels_last", *worlds}
    if torch.cuda.get_device_capability() < (9, 0):
        must -= set(NEEDS_SM90)
    missing = sorted(must - ran)
    assert not missing, (missing, sorted(ran))
