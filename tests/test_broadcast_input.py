"""Extra inputs that broadcast (``inputs: [{name: temb, shape: per_sample_channel}]``, fusetune/broadcast.py): a
diffusion UNet's ``conv(x) + temb[:, :, None, None]``, a per-sample scale (N, 1, 1, 1), a per-channel forward input
(1, C, 1, 1). The kernels read them where they store each element, at its (n, c): ft_post/ft_final take the stored
index (ft_stored) and read ``a.extra`` at ``n * C + c``, ``n`` or ``c``. The chains: tests/broadcast_input/. The
kernels on a GPU: tests/test_gpu_second_input.py.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from fusetune import broadcast
from fusetune.codegen import render
from fusetune.config import load_config, parse_config
from fusetune.plan import make_plan
from fusetune.worlds import WORLDS
from fusetune.worlds.facts import INPUT_STAGES

from conftest import ROOT, import_file

NVCC = shutil.which("nvcc")
FOLDER = ROOT / "tests" / "broadcast_input"
#: Each chain, the input region 0 reads, its kind, the chain (post or final) that reads it, and the worlds of kernels
#: region 0 offers (beside the reference's own forwards).
CHAINS = [
    ("conv2d_add_temb_silu", "temb", "per_sample_channel", "post", {"cudnn", "direct"}),
    ("conv2d_groupnorm_maxpool_mul_temb_relu", "temb", "per_sample_channel", "post",
     {"cudnn", "direct", "gemm", "gemm_cluster", "gemm_extrema", "gemm_store"}),
    ("conv2d_groupnorm_silu_add_temb", "temb", "per_sample_channel", "post",
     {"cudnn", "direct", "gemm", "gemm_cluster", "gemm_store"}),
    ("conv2d_instancenorm_max_channels_add_floor_relu", "floor", "per_sample", "final",
     {"cudnn", "direct", "gemm", "gemm_cluster", "gemm_store"}),
    ("conv2d_relu_maxpool_mul_scale", "scale", "per_sample", "post", {"cudnn", "direct", "gemm"}),
    ("conv2d_softmax_channels_mul_gain", "gain", "per_channel", "final", {"cudnn"}),
    ("conv2d_sum_channels_sub_shift_tanh", "shift", "per_sample", "final", {"cudnn", "gemm_wide"}),
    ("conv2d_wide96_relu_add_temb_hardswish", "temb", "per_sample_channel", "post", {"cudnn", "gemm_wide"}),
    ("conv3d_mean_spatial_add_gain", "gain", "per_channel", "final", {"cudnn", "direct"}),
]
IDS = [c[0] for c in CHAINS]
#: The index each kind reads at, as the rendered chain spells it (its stored tensor's channels and size a sample).
INDEX = {
    ("per_sample_channel", "post"): "ft_stored / (a.C * a.OD * a.OH * a.OW) * (a.C) + c",
    ("per_sample", "post"): "ft_stored / (a.C * a.OD * a.OH * a.OW)",
    ("per_sample", "final"): "ft_stored / (a.OD * a.OH * a.OW)",
    ("per_channel", "final"): "c",
}


def _plan(stem: str):
    return make_plan(load_config(FOLDER / f"{stem}.yaml"))


def _raw(stem: str, **changes) -> dict:
    return {**yaml.safe_load((FOLDER / f"{stem}.yaml").read_text()), **changes}


def test_the_folder_holds_exactly_the_listed_chains():
    assert sorted(p.stem for p in FOLDER.glob("*.yaml")) == sorted(IDS)


def test_the_kinds_are_broadcast_shapes():
    chain = (3, 12, 5, 7)
    assert [broadcast.KINDS[k].shape(chain) for k in ("per_sample_channel", "per_sample", "per_channel")] == [
        (3, 12, 1, 1), (3, 1, 1, 1), (1, 12, 1, 1)]
    assert broadcast.kind_of_shape((3, 12, 1, 1), chain) == "per_sample_channel"
    assert broadcast.kind_of_shape((1, 12, 1, 1), chain) == "per_channel"
    assert broadcast.kind_of_shape(chain, chain) == broadcast.FULL
    assert broadcast.kind_of_shape((3, 12, 5, 1), chain) is None


# ------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------

def test_the_config_declares_the_kind_and_the_input_has_its_shape():
    spec = load_config(FOLDER / "conv2d_add_temb_silu.yaml")
    assert spec.inputs == ("temb",) and spec.input_kinds == (("temb", "per_sample_channel"),)
    assert spec.input_shapes((3, 5, 13, 17)) == [(3, 12, 1, 1)]
    assert spec.canonical()["input_kinds"] == {"temb": "per_sample_channel"}
    full = parse_config(_raw("conv2d_add_temb_silu", inputs=["temb"]), "full.yaml")
    assert full.input_kinds == () and "input_kinds" not in full.canonical()  # a full-shape input's key as it was
    assert full.digest() != spec.digest()
    named = parse_config(_raw("conv2d_add_temb_silu", inputs=[{"name": "temb", "shape": "full"}]), "named.yaml")
    assert named.digest() == full.digest()


# ------------------------------------------------------------------------------------------------------
# Plan and rendering
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem, extra, kind, chain, worlds", CHAINS, ids=IDS)
def test_region_zero_reads_the_input_where_it_stores_at_the_elements_n_and_c(stem, extra, kind, chain, worlds):
    plan = _plan(stem)
    assert plan.extra == extra and not plan.tail
    assert {impl for impl in plan.impl_stages if not WORLDS[impl].runs_reference} == worlds
    assert any(op.reads_input() for op in (plan.post if chain == "post" else plan.final))
    files = render(plan).files
    index = INDEX.get((kind, chain)) or broadcast.read_index(plan, chain)
    for stage in set(plan.stages) & set(INPUT_STAGES):
        if stage == "finalize" and plan.family is not None:
            continue
        units = [text for name, text in files.items() if (name == f"{stage}.cu" or name.startswith(f"{stage}_"))
                 and "__global__" in text]
        assert units, stage
        for text in units:
            assert f"const int64_t ft_o = {index};" in text, stage
            assert "int64_t ft_stored)" in text and "__ldg(a.extra + ft_o)" in text, stage


def test_a_broadcast_input_where_the_kernels_do_not_store_its_n_and_c_runs_after_the_region():
    """A per-channel input after a channel reduction that drops the channel dim ((N, H, W): its dim 1 is H, which the
    kernels' store sites do not know): PyTorch applies it, and the plan says why, naming the op that reads it."""
    raw = _raw("conv2d_instancenorm_max_channels_add_floor_relu", inputs=[{"name": "floor", "shape": "per_channel"}])
    spec = parse_config(raw, "channel.yaml")
    assert spec.input_shapes(spec.shapes[0]) == [(1, 13, 1)]
    plan = make_plan(spec)
    assert plan.extra is None and plan.tail[0].op.reads_input() == "floor"
    assert "epilogue[2] (add) reads input 'floor'" in plan.ends and "(n, c)" in plan.ends, plan.ends  # the reader named


def test_a_chain_without_a_broadcast_input_renders_as_it_did():
    full = ROOT / "tests" / "second_input" / "conv2d_wide96_relu_add_input_hardswish.yaml"
    files = render(make_plan(load_config(full))).files
    text = files["wide_main_0.cu"] + files["window_map.cu"]
    assert "ft_stored" not in text and "int64_t ft_o) {" in text
    assert "KERNEL_INPUT_KIND" not in files["model.py"]


# ------------------------------------------------------------------------------------------------------
# The generated models
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem, extra, kind, chain, worlds", CHAINS, ids=IDS)
def test_the_reference_broadcasts_the_input_and_model_new_checks_its_shape(stem, extra, kind, chain, worlds, tmp_path):
    import torch

    plan = _plan(stem)
    generated = import_file(render(plan).write(tmp_path / "module") / "model.py")
    shape = tuple(plan.spec.shapes[0])
    assert generated.KERNEL_INPUT == extra and generated.KERNEL_INPUT_KIND == kind
    (wanted,) = plan.spec.input_shapes(shape)
    assert wanted == broadcast.KINDS[kind].shape(tuple(plan.spec.shapes_through(shape)[-1]))[:len(wanted)]
    torch.manual_seed(0)
    model = generated.Model().double()
    x = torch.rand(shape, dtype=torch.float64)
    t = torch.randn(wanted, dtype=torch.float64)
    with torch.no_grad():
        got = model(x, t)
        # where the input is read at the output's shape, the same values spelt out there
        spelt = model(x, t.expand(plan.spec.output_shape(shape)).contiguous()) if chain == "post" and not plan.pool \
            else got
    torch.testing.assert_close(got, spelt, rtol=0, atol=0)
    out = torch.empty(plan.spec.output_shape(shape))
    good = torch.randn(wanted)
    assert generated._as_output(good, out).is_contiguous()
    with pytest.raises(ValueError, match=rf"input '{extra}' \({kind}\) has shape"):
        generated._as_output(torch.randn(out.shape), out)


# ------------------------------------------------------------------------------------------------------
# nvcc: one representative unit (CI time)
# ------------------------------------------------------------------------------------------------------

@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_a_unit_that_reads_a_broadcast_input_compiles_for_sm90_without_spills(tmp_path):
    where = render(_plan("conv2d_add_temb_silu")).write(tmp_path / "m")
    done = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-c", "window_map.cu", "-o",
                           "window_map.o"], cwd=where, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    spills = [line for line in log.splitlines() if "spill stores" in line]
    assert spills and all(" 0 bytes spill stores" in line for line in spills), log[-2000:]


# ------------------------------------------------------------------------------------------------------
# Importer: a UNet block's conditioning
# ------------------------------------------------------------------------------------------------------

def test_a_unet_block_imports_temb_scale_and_gain_as_broadcast_inputs(tmp_path):
    """``h + temb[:, :, None, None]``, ``h * scale`` of a (N, 1, 1, 1) argument, ``h + gain.view(1, -1, 1, 1)``:
    each an extra input of its kind, named by the forward's argument; region 0 reads the first."""
    from fusetune.importer import import_model

    result = import_model(str(ROOT / "tests" / "models" / "kb_unet_block_temb.py"), tmp_path)
    (written,) = result.written
    assert list(written.inputs) == ["temb", "scale", "gain"]
    spec = load_config(written.config)
    assert spec.input_kinds == (("temb", "per_sample_channel"), ("scale", "per_sample"), ("gain", "per_channel"))
    assert spec.input_shapes(spec.shapes[0]) == [(3, 12, 1, 1), (3, 1, 1, 1), (1, 12, 1, 1)]
    assert [op.reads_input() for op in spec.epilogue] == ["temb", None, "scale", "gain"]
    plan = make_plan(spec)
    assert plan.extra == "temb" and [s.op.reads_input() for s in plan.tail] == ["scale", "gain"]


def test_the_optimized_unet_block_calls_the_fused_chain_with_the_viewed_temb(tmp_path):
    """optimize() replaces the chain by a fused module called with ``temb[:, :, None, None]`` (the view node, computed
    after the convolution in the forward) and the other two; on the CPU it runs the reference, equal to eager."""
    import torch

    from fake_handlers import FakeBench
    from fusetune.optimizer import FusedChain, optimize
    from test_optimize import MACHINE, TRIALS, _model

    model, inputs = _model("kb_unet_block_temb")
    model.eval()
    opt = optimize(model, inputs, cache_dir=tmp_path, trials=TRIALS, benchmarker=FakeBench().factory,
                   machine=MACHINE)
    calls = [n for n in opt.graph.nodes
             if n.op == "call_module" and isinstance(opt.get_submodule(n.target), FusedChain)]
    assert len(calls) == 1 and [a.name for a in calls[0].args[1:]] == ["getitem", "scale", "view"]
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), model(*inputs), rtol=0, atol=0)


def test_cli_plan_json_names_the_inputs_kind():
    import json

    from click.testing import CliRunner

    from fusetune.cli import main

    done = CliRunner().invoke(main, ["plan", "--json", str(FOLDER / "conv2d_relu_maxpool_mul_scale.yaml")])
    assert done.exit_code == 0, done.output
    (doc,) = json.loads(done.output)
    assert doc["input_kinds"] == {"scale": "per_sample"} and doc["kernel_input"] == "scale"
