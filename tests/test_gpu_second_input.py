"""GPU tests of a second input tensor of the model (``inputs: [identity]``, ``by: identity``; tests/test_second_input.py
has the config, the plan, the rendering and the compile on the CPU): each chain of that file, in every world its
plan offers (cuDNN's in both layouts; not torch.compile's), its default variant built and verified against float64
through fusetune's own evaluation (fresh random inputs, the extra one among them, NaN-filled outputs, norms moved
off their identity, shapes no tile divides), as scripts/verify-chains does; a later region that reads the input
too. Between them they run every output stage of facts.INPUT_STAGES. wide_main's store paths again at one and two
channel tiles of the output's 96 channels (its default variant has one). And ModelNew called with the input in the
other memory layout, and with a wrong one.

Skipped without a CUDA GPU: python -m pytest -q -m gpu tests/test_gpu_second_input.py
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.search import Machine  # noqa: E402

from conftest import import_script, verify_worlds  # noqa: E402
from test_second_input import CHAINS, MORE, WIDE_MAIN_READERS  # noqa: E402

#: Worlds that need more than a CUDA GPU of compute capability 8.0 (gemm_cluster: thread-block clusters, sm_90):
#: elsewhere their refusal (launch_error from the launcher's own check) is not required to be "ok".
NEEDS_SM90 = ("gemm_cluster",)


def _verified_in_every_world(path, stem: str, worlds, cache, worker) -> list[dict]:
    """verify-chains' records for the config, none failed, and the chain's first region run (ok, or TF32-refused)
    in cuDNN's world in both layouts and in each of ``worlds`` (gemm_cluster only from sm_90)."""
    records, failed = verify_worlds(path, cache, worker)
    assert records and not failed, "\n".join(failed)
    ran = {r["impl"] for r in records if r["name"] == stem and r["status"] in ("ok", "tf32_refused")}
    must = {"cudnn", "cudnn/channels_last", *worlds}
    if torch.cuda.get_device_capability() < (9, 0):
        must -= set(NEEDS_SM90)
    missing = sorted(must - ran)
    assert not missing, (missing, sorted(ran))
    return records


@pytest.mark.parametrize("folder, stem, extra, worlds", CHAINS, ids=[c[1] for c in CHAINS])
def test_every_world_of_a_chain_reading_a_second_input_matches_float64(folder, stem, extra, worlds, cache, worker):
    records = _verified_in_every_world(folder / f"{stem}.yaml", stem, worlds, cache, worker)
    if extra is None:  # the later region that reads the input was verified too
        assert any(r["name"] == f"{stem}_r1" and r["status"] == "ok" for r in records), records


#: wide_main's channel tiles beside the default variant's one of 128 (32 channels past C = 96): two of 64, the second
#: half past C (a channel reduction's tiles folded by its combine kernel), two blocks a sample and tile; each at bm
#: 128, which 437 outputs and the pooled bricks do not divide either.
WIDE_TILES = ({"wide_main.bn": 64, "wide_main.bm": 128, "wide_main.split": 2},
              {"wide_main.bn": 128, "wide_main.bm": 128})


@pytest.mark.parametrize("stem", sorted(WIDE_MAIN_READERS))
def test_wide_main_reads_the_input_in_each_tiling_and_matches_float64(stem, cache, worker):
    """Each of wide_main's store paths that read the input (the unpooled map, the pooled map at float16, the channel
    reduction and its combine kernel), in its world (WIDE_MAIN_READERS), at one and two channel tiles: verified
    against float64 as verify-chains does (fresh inputs, NaN-filled outputs), the variants built in one module."""
    from fusetune.codegen import plan_space
    from fusetune.config import load_config
    from fusetune.plan import make_plan
    from fusetune.runner import GpuBenchmarker
    from fusetune.search import _nearest, shape_facts

    world = WIDE_MAIN_READERS[stem][0]
    script = import_script("verify-chains")
    plan = make_plan(load_config(MORE / f"{stem}.yaml"))
    shape = plan.spec.shapes[0]
    machine = Machine.detect()
    space = plan_space(plan)
    facts = shape_facts(plan.spec, plan, shape, machine.capability)
    feasible = [c for c in space.all({"producer.impl": world}) if not space.violations(c, facts)]
    start = space.canonical({**space.default(), "producer.impl": world})
    chosen = []
    for tile in WIDE_TILES:
        same = [c for c in feasible if all(c[k] == v for k, v in tile.items())]
        candidate = _nearest({**start, **tile}, same)
        assert candidate is not None, (stem, tile)
        chosen.append(candidate)
    bench = GpuBenchmarker(plan, shape, cache, machine, worker, job_timeout=180.0, echo=lambda *a, **k: None)
    bench.main = bench._build(script._variants_of(chosen, space, bench))
    for candidate in chosen:
        outcome = bench.verify(candidate)
        record = {"name": stem, "impl": world, **outcome}
        print(script.format_line(record), candidate)
        assert outcome["status"] == "ok" or script.tf32_refused(record), (candidate, outcome.get("log", "")[-2000:])


def test_model_new_takes_the_input_in_either_layout_and_refuses_a_wrong_one(tmp_path):
    """The kernels read the input at the output's offsets: one in the other memory layout is converted first, and
    the result is the same; one of another shape, dtype or device is refused with its name."""
    from fusetune.build import build_and_load
    from fusetune.cache import Cache
    from fusetune.codegen import render
    from fusetune.config import load_config
    from fusetune.plan import make_plan

    from conftest import ROOT

    plan = make_plan(load_config(ROOT / "tests" / "chains" / "conv2d_nobias_batchnorm_eval_add_input_relu.yaml"))
    major, minor = torch.cuda.get_device_capability()
    # the cuDNN world's stages alone (the direct and tensor-core ones are verify-chains' above): a quick build
    rendered = render(plan, only={"direct_main": [], "gemm_main": []})
    generated = build_and_load(rendered, Cache(tmp_path), f"{major}.{minor}")
    seed = int.from_bytes(os.urandom(4), "little")  # fresh inputs each run; the seed printed to reproduce one
    print(f"seed {seed}")
    torch.manual_seed(seed)
    reference = generated.Model().cuda().eval()
    with torch.no_grad():
        reference.batch_norm_0.running_mean.uniform_(-0.5, 0.5)
        reference.batch_norm_0.running_var.uniform_(0.5, 2.0)
    shape = plan.spec.shapes[0]
    x = torch.rand(shape, device="cuda")
    identity = torch.randn(plan.spec.input_shapes(tuple(shape))[0], device="cuda")
    with torch.no_grad():
        exact = reference.double()(x.double(), identity.double())
        reference.float()
        # eager's error in either layout, as verification takes it (fusetune.evaluate: cuDNN's channels-last
        # convolution may be TF32's where the contiguous one is not)
        eager_error = max(((reference(x.contiguous(memory_format=fmt), identity.contiguous(memory_format=fmt)).double()
                            - exact).norm() / exact.norm()).item() for fmt in (torch.contiguous_format, torch.channels_last))
    for layout in ("contiguous", "channels_last"):
        for fmt in (torch.contiguous_format, torch.channels_last):
            fused = generated.ModelNew(variant={"producer": {"layout": layout}}).cuda().eval()
            fused.load_state_dict(reference.state_dict())
            fused.fill_value = float("nan")
            with torch.no_grad():
                got = fused(x, identity.contiguous(memory_format=fmt))
            error = ((got.double() - exact).norm() / exact.norm()).item()
            bound = max(8 * eager_error, 1e-5)
            assert not torch.isnan(got).any() and error <= bound, (layout, fmt, error, bound)
    with pytest.raises(ValueError, match="input 'identity' has shape"):
        fused(x, identity[..., :-1])
    with pytest.raises(ValueError, match="input 'identity': expected torch.float32"):
        fused(x, identity.double())
    with pytest.raises(ValueError, match="input 'identity' is on cpu"):
        fused(x, identity.cpu())


# ------------------------------------------------------------------------------------------------------
# Inputs that broadcast (tests/test_broadcast_input.py): read at each stored element's (n, c)
# ------------------------------------------------------------------------------------------------------

from test_broadcast_input import CHAINS as BROADCAST_CHAINS  # noqa: E402
from test_broadcast_input import FOLDER as BROADCAST  # noqa: E402


@pytest.mark.parametrize("stem, extra, kind, chain, worlds", BROADCAST_CHAINS, ids=[c[0] for c in BROADCAST_CHAINS])
def test_every_world_of_a_chain_reading_a_broadcast_input_matches_float64(stem, extra, kind, chain, worlds, cache,
                                                                         worker):
    """Each chain of tests/broadcast_input/ in every world its plan offers (cuDNN's in both layouts: the input is read
    at (n, c) whatever the output's layout), verified against float64 as verify-chains does (fresh random inputs, the
    broadcast one drawn at its own shape, NaN-filled outputs, shapes no tile divides)."""
    _verified_in_every_world(BROADCAST / f"{stem}.yaml", stem, worlds, cache, worker)


def test_model_new_reads_temb_per_sample_and_channel_in_either_layout_against_float64(tmp_path):
    """conv(x) + temb[:, :, None, None], then SiLU, in the cuDNN world (contiguous and channels-last output):
    ModelNew against the float64 reference with fresh inputs (seed printed), its output NaN-filled first, temb a
    (N, C) tensor's view; a temb of the output's full shape is refused with its name and kind."""
    from fusetune.build import build_and_load
    from fusetune.cache import Cache
    from fusetune.codegen import render
    from fusetune.config import load_config
    from fusetune.plan import make_plan

    plan = make_plan(load_config(BROADCAST / "conv2d_add_temb_silu.yaml"))
    major, minor = torch.cuda.get_device_capability()
    generated = build_and_load(render(plan, only={"direct_main": []}), Cache(tmp_path), f"{major}.{minor}")
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    torch.manual_seed(seed)
    reference = generated.Model().cuda().eval()
    shape = tuple(plan.spec.shapes[0])
    x = torch.rand(shape, device="cuda")
    temb = torch.randn(shape[0], 12, device="cuda")[:, :, None, None]
    with torch.no_grad():
        exact = reference.double()(x.double(), temb.double())
        reference.float()
        eager = reference(x, temb)
    for layout in ("contiguous", "channels_last"):
        fused = generated.ModelNew(variant={"producer": {"layout": layout}}).cuda().eval()
        fused.load_state_dict(reference.state_dict())
        fused.fill_value = float("nan")
        with torch.no_grad():
            got = fused(x, temb)
        error = ((got.double() - exact).norm() / exact.norm()).item()
        bound = max(8 * ((eager.double() - exact).norm() / exact.norm()).item(), 1e-5)
        assert not torch.isnan(got).any() and error <= bound, (layout, error, bound)
    with pytest.raises(ValueError, match=r"input 'temb' \(per_sample_channel\) has shape"):
        fused(x, torch.randn(got.shape, device="cuda"))
