"""The norms over the channels of a position (fusetune/ops/channel.py): every row of CHANNEL_MAPS on the host
against its op's PyTorch form in float64, and the planner's, the renderer's and the config's side.

Each row's accumulator (step, merge as channels-last lanes do, including lanes past the channels) and its map
of each value (a layer norm's weight and bias included) are compiled with g++ against templates/channel.cuh and
templates/reduce.cuh and run on tests/reductions/rows.yaml's corner cases (NaN, infinities, extremes) and random
rows of odd lengths and scales; the reference is the op's own ``forward_code`` (what the generated Model runs)
evaluated in float64, which is itself checked against the formula written out here.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from fusetune import codegen
from fusetune.config import load_config
from fusetune.errors import ConfigError
from fusetune.ops import REGISTRY, OpContext, ParamDecl
from fusetune.ops.channel import CHANNEL_MAPS, ChannelNorm, channel_finish, channel_value
from fusetune.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
DATA = ROOT / "tests" / "channel_norms"
CHAINS = ROOT / "tests" / "chains"
LANES = 8
SAMPLES: dict[str, dict] = yaml.safe_load((DATA / "samples.yaml").read_text())["samples"]


def rows() -> list[np.ndarray]:
    """tests/reductions/rows.yaml's corner cases, then random rows of odd lengths at scales 1, 30 and 1000."""
    listed = yaml.safe_load((ROOT / "tests" / "reductions" / "rows.yaml").read_text())["rows"]
    out = [np.array(r, np.float32) for r in listed]
    rng = np.random.default_rng(11)
    for n in (1, 2, 5, 17, 31, 48, 97):
        for scale in (1.0, 30.0, 1000.0):
            out.append((rng.standard_normal(n) * scale + scale / 3).astype(np.float32))
        r = (rng.standard_normal(n) * 1e-3).astype(np.float32)  # norms below normalize's eps
        out.append(r)
    return out


def op_of(name: str):
    params = {"w": ParamDecl("w", "randn"), "b": ParamDecl("b", "randn")}
    # the channels are the row; the context's shape only needs rank 3
    ctx = OpContext(path="samples.yaml", key=name, in_shape=(1, 1, 1), spatial_dims=1, parameters=params)
    return REGISTRY[name].parse({"op": name, **SAMPLES[name]}, ctx)


def host_program(names: list[str]) -> str:
    """Reads rows (int32 n, n float32 values, n weights, n biases) from stdin; writes per row per op two maps
    of the row: folded one value after another, and over LANES lanes merged by xor butterflies, each
    accumulator finished once (channel_finish) as the kernels finish it."""
    headers = sorted({CHANNEL_MAPS[n].fold.header for n in names if CHANNEL_MAPS[n].fold.header})
    parts = ['#include "elementwise.cuh"', *(f'#include "{h}"' for h in headers),
             "#include <stdio.h>", "#include <stdint.h>", "#include <vector>"]
    for i, name in enumerate(names):
        fold = CHANNEL_MAPS[name].fold
        value = channel_value(op_of(name), "x[k]", "acc", "k", lambda p, c: f"{p}[{c}]")
        finish = channel_finish(op_of(name), "acc")
        parts.append(f"""
// {name}
static void run{i}(const float* x, const float* w, const float* b, int n, float* seq, float* lanes) {{
  (void)w; (void)b;
  {fold.acc} acc = {fold.identity};
  for (int k = 0; k < n; ++k) acc = {fold.fold_step("acc", "x[k]")};
  {finish}
  for (int k = 0; k < n; ++k) seq[k] = {value};
  {fold.acc} lane[{LANES}], next[{LANES}];
  for (int j = 0; j < {LANES}; ++j) {{
    lane[j] = {fold.identity};
    for (int k = j; k < n; k += {LANES}) lane[j] = {fold.fold_step("lane[j]", "x[k]")};
  }}
  for (int o = {LANES} / 2; o > 0; o >>= 1) {{
    for (int j = 0; j < {LANES}; ++j) next[j] = {fold.fold_merge("lane[j]", "lane[j ^ o]")};
    for (int j = 0; j < {LANES}; ++j) lane[j] = next[j];
  }}
  acc = lane[{LANES} - 1];
  {finish}
  for (int k = 0; k < n; ++k) lanes[k] = {value};
}}""")
    calls = "\n".join(f"    run{i}(x.data(), w.data(), b.data(), n, seq.data(), lanes.data()); "
                      "fwrite(seq.data(), 4, n, stdout); fwrite(lanes.data(), 4, n, stdout);"
                      for i in range(len(names)))
    parts.append(f"""
int main() {{
  int32_t n = 0;
  while (fread(&n, 4, 1, stdin) == 1) {{
    std::vector<float> x(n), w(n), b(n), seq(n), lanes(n);
    if (fread(x.data(), 4, n, stdin) != (size_t)n || fread(w.data(), 4, n, stdin) != (size_t)n
        || fread(b.data(), 4, n, stdin) != (size_t)n) return 1;
{calls}
  }}
  return 0;
}}
""")
    return "\n".join(parts)


def affine(row: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(row.size) * 2).astype(np.float32), rng.standard_normal(row.size).astype(np.float32)


@pytest.fixture(scope="module")
def host_maps(tmp_path_factory) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """op name -> per row (sequential map, lanes' map): one g++ compile and one run."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the rows' CUDA fragments are compiled on the host with it")
    names = list(CHANNEL_MAPS)
    folder = tmp_path_factory.mktemp("channel_norms")
    (folder / "maps.cpp").write_text(host_program(names))
    built = subprocess.run([gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Werror", f"-I{TEMPLATES}",
                            "maps.cpp", "-o", "maps", "-lm"], cwd=folder, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    stdin = b"".join(np.array([r.size], np.int32).tobytes() + r.tobytes() + b"".join(a.tobytes() for a in affine(r, i))
                     for i, r in enumerate(rows()))
    run = subprocess.run([str(folder / "maps")], input=stdin, capture_output=True, check=True)
    flat, at = np.frombuffer(run.stdout, np.float32), 0
    out: dict[str, list] = {name: [] for name in names}
    for row in rows():
        for name in names:
            out[name].append((flat[at:at + row.size], flat[at + row.size:at + 2 * row.size]))
            at += 2 * row.size
    assert at == flat.size
    return out


def torch_map(name: str, row: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The op's generated PyTorch form (forward_code) on the row as the channels of one position, in float64."""
    x = torch.from_numpy(row.astype(np.float64)).reshape(1, -1, 1)
    model = SimpleNamespace(w=torch.from_numpy(w.astype(np.float64)).reshape(-1, 1),
                            b=torch.from_numpy(b.astype(np.float64)).reshape(-1, 1))
    value = eval(op_of(name).forward_code("x", None), {"torch": torch, "F": F, "self": model, "x": x})  # noqa: S307
    return value.reshape(-1).numpy()


def test_every_channel_op_has_a_row_and_a_sample():
    """The registry's ops of the channel family (and softmax's) are CHANNEL_MAPS' rows, each with a sample."""
    family = {name for name, cls in REGISTRY.items() if issubclass(cls, ChannelNorm)}
    assert family and family <= set(CHANNEL_MAPS)
    assert set(CHANNEL_MAPS) == set(SAMPLES) and set(CHANNEL_MAPS) - family == {"softmax", "log_softmax"}


@pytest.mark.parametrize("name", list(CHANNEL_MAPS))
def test_map_matches_torch_in_float64(name: str, host_maps):
    """Both foldings, every value: NaN only where torch gives NaN, infinities exactly, else within float32's
    rounding (of the value's magnitude, and for a layer norm's affine of |w| + |b|)."""
    failures = []
    for i, (row, (seq, lanes)) in enumerate(zip(rows(), host_maps[name])):
        w, b = affine(row, i)
        ref = torch_map(name, row, w, b)
        tol = 8 * max(row.size, 4) * float(np.finfo(np.float32).eps)
        finite = np.abs(row[np.isfinite(row)].astype(np.float64))
        scale = 1.0 + (float(finite.max(initial=0.0)) if name == "log_softmax" else 0.0)
        scale += np.abs(w) + np.abs(b) if name == "channel_layer_norm" else 0.0
        for way, got in (("sequential", seq), ("lanes", lanes)):
            got = got.astype(np.float64)
            nan = np.isnan(ref) | np.isnan(got)
            ok = np.where(nan, np.isnan(ref) & np.isnan(got),
                          np.where(np.isinf(ref) | np.isinf(got), got == ref,
                                   np.isclose(got, ref, rtol=tol, atol=tol * scale)))
            if not ok.all():
                failures.append(f"{name} {way} of {row.tolist()[:6]}: cuda {got[:6]}, torch {ref[:6]}")
    assert not failures, "\n".join(failures[:10])


def test_pytorch_forms_are_the_formulas():
    """The generated forms are F.normalize's x / max(||x||, eps) and the by-hand layer norm of ConvNeXt."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, 5, 3, dtype=torch.float64, generator=g) * 3 + 1
    w, b = (torch.randn(7, 1, 1, dtype=torch.float64, generator=g) for _ in range(2))
    model = SimpleNamespace(w=w, b=b)
    env = {"torch": torch, "F": F, "self": model, "x": x}
    got = eval(op_of("channel_layer_norm").forward_code("x", None), env)  # noqa: S307
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    assert torch.allclose(got, w * ((x - u) / torch.sqrt(s + 1e-5)) + b, rtol=1e-12, atol=1e-12)
    got = eval(op_of("normalize").forward_code("x", None), env)  # noqa: S307
    assert torch.allclose(got, x / x.pow(2).sum(1, keepdim=True).sqrt().clamp_min(1e-3), rtol=1e-12, atol=1e-12)


def _plan(path: Path):
    return make_plan(load_config(path))


@pytest.mark.parametrize("stem, kind, params", [
    ("conv2d_dw7_channel_layernorm_gelu_scale", "channel_layer_norm", ("ln_w", "ln_b", "gamma")),
    ("conv3d_channel_layernorm_weight_relu_avgpool", "channel_layer_norm", ("w",)),
    ("conv2d_normalize_channels_scale_relu", "normalize", ("s",)),
    ("conv1d_normalize_channels_eps_tanh", "normalize", ())])
def test_channel_norm_is_channel_softmax_with_the_chain_after_it(stem: str, kind: str, params: tuple[str, ...]):
    """In the reduce slot of channel_softmax (the cuDNN world's), the maps after it in its final chain, its
    weight and bias among the parameters the kernels read; a pool after it in a later region."""
    plan = _plan(CHAINS / f"{stem}.yaml")
    assert plan.family == "channel_softmax" and plan.channel_map is not None and plan.channel_map.kind == kind
    assert plan.reduce is None and plan.final and plan.impl_stages["cudnn"] == ("channel_softmax",)
    assert plan.param_names == params
    assert [s.op.kind for s in plan.tail] == (["avg_pool"] if "avgpool" in stem else [])


@pytest.mark.parametrize("stem, why", [("conv2d_normalize_p1_relu", "p=1.0 (the kernels take the L2 norm"),
                                       ("conv2d_relu_normalize_last_dim", "over dim 3 (the kernels normalise")])
def test_other_norms_run_in_pytorch_with_the_reason(stem: str, why: str):
    plan = _plan(DATA / f"{stem}.yaml")
    assert plan.channel_map is None and [s.op.kind for s in plan.tail][0] == "normalize"
    assert why in plan.ends
    assert any("PyTorch" in line for line in plan.regions()[1:]), plan.regions()


@pytest.mark.parametrize("stem, key, words", [
    ("bad_layernorm_after_channel_sum", "epilogue[1].op", "needs the (N, 6, spatial) input"),
    ("bad_layernorm_scalar_weight", "epilogue[0].weight", "one value per channel")])
def test_bad_layer_norms_are_refused_by_key(stem: str, key: str, words: str):
    with pytest.raises(ConfigError) as exc:
        load_config(DATA / f"{stem}.yaml")
    assert exc.value.key == key and words in str(exc.value)


def test_render_reads_the_weight_and_bias_as_parameters():
    """The unit folds Welford's moments (channel.cuh, not reduce.cuh) and maps each value with the weight and
    bias read by parameter slot, at the channel of either layout's kernel."""
    plan = _plan(CHAINS / "conv2d_dw7_channel_layernorm_gelu_scale.yaml")
    unit = codegen.render(plan).files["channel_softmax.cu"]
    assert "ft_moments_step(acc[j], x)" in unit and "ft_moments_merge(acc, x)" in unit and "FtLse" not in unit
    assert "fmaf(ft_layer_norm_of(x, acc[j]), __ldg(a.p[0] + c), __ldg(a.p[1] + c))" in unit
    assert "acc[j] = ft_moments_end(acc[j], 1e-06f);" in unit and "acc = ft_moments_end(acc, 1e-06f);" in unit
    assert "__ldg(a.p[0] + c0 + j), __ldg(a.p[1] + c0 + j)" in unit
    normalize = codegen.render(_plan(CHAINS / "conv1d_normalize_channels_eps_tanh.yaml")).files["channel_softmax.cu"]
    assert "ft_l2_normalize_of(x, acc[j])" in normalize and "ft_l2_normalize_end(acc, 0.5f)" in normalize
    assert "a.p[" not in normalize
    softmax = codegen.render(_plan(CHAINS / "conv2d_logsoftmax_channels_maxpool.yaml")).files["channel_softmax.cu"]
    assert " = ft_softmax_end(" not in softmax and "ft_log_softmax_of(x, acc[j])" in softmax  # log_softmax: no finish
    softmax = codegen.render(_plan(CHAINS / "convt2d_softmax_channels_bias_scale_sigmoid.yaml")).files["channel_softmax.cu"]
    assert "acc[j] = ft_softmax_end(acc[j]);" in softmax and "acc = ft_softmax_end(acc);" in softmax  # 1 / s once


@pytest.mark.parametrize("stem", ["convnext_layernorm2d_by_hand", "conv_permute_layernorm_normalize",
                                  "timm_layernorm2d", "swin_patch_embed_channels_last", "sweep4_patch_embed_tokens"])
def test_optimize_replaces_the_forms_and_keeps_the_output(stem: str, tmp_path: Path):
    """fusetune.optimize on the import forms (fake benchmarker): every chain fused, the user's tensors
    the chains' own, and the optimized model's outputs the user's (on the CPU: the chains' eager path)."""
    from conftest import import_file
    from fake_handlers import MACHINE_FIELDS, FakeBench

    from fusetune.optimizer import FusedChain, fused_chains, optimize
    from fusetune.search import Machine

    module = import_file(ROOT / "tests" / "models" / f"{stem}.py")
    torch.manual_seed(0)
    model, inputs = module.Model(*module.get_init_inputs()), tuple(module.get_inputs())
    model.eval()
    opt = optimize(model, inputs, cache_dir=tmp_path, trials=2, benchmarker=FakeBench().factory,
                   machine=Machine(*MACHINE_FIELDS))
    assert len(list(fused_chains(opt))) == len(yaml.safe_load((ROOT / "tests" / "models" / "expected.yaml")
                                                              .read_text())["chains"][stem])
    assert all(isinstance(m, FusedChain) and m.kernel_model is not None for m in fused_chains(opt))
    fresh = tuple(torch.randn_like(x) for x in inputs)
    with torch.no_grad():
        got, want = opt(*fresh), model(*fresh)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    for name, tensor in model.named_parameters():
        assert opt.get_parameter(name) is tensor


@pytest.mark.parametrize("stem", ["swin_patch_embed_channels_last", "sweep4_patch_embed_tokens",
                                  "patch_embed_tokens_near_misses"])
def test_a_norm_over_tokens_channels_is_computed_before_their_views_exactly(stem: str):
    """channel_import.norm_tokens_last: the trace's outputs are the model's bit for bit, laid out alike (a later
    .view() works on them as on the model's); a norm over the tokens' channels reads the NCHW value permuted
    (what the walk takes), and the near misses keep their graph as written."""
    from conftest import import_file

    from fusetune.importer import trace

    module = import_file(ROOT / "tests" / "models" / f"{stem}.py")
    torch.manual_seed(0)
    model, inputs = module.Model(*module.get_init_inputs()).eval(), tuple(module.get_inputs())
    gm = trace(model, inputs)
    with torch.no_grad():
        got, want = gm(*inputs), model(*inputs)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w) and g.stride() == w.stride()
    rewritten = [n.name for n in gm.graph.nodes if n.name.endswith("_nchw")]
    assert len(rewritten) == {"swin_patch_embed_channels_last": 4, "sweep4_patch_embed_tokens": 2}.get(stem, 0)
