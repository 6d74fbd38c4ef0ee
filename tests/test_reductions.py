"""Every reduction mode of fusetune/ops/reductions.py against PyTorch, on the CPU, and where the modes run.

Each mode's CUDA fragments (identity, step, merge, end, value) are compiled on the host with g++ against the
headers the kernels include (templates/elementwise.cuh, and the mode's own header) and fold rows of float32
values four ways: one value after another (channel_reduce's contiguous path), in chunks merged left to right
and right to left (merge's associativity), and over 8 lanes merged by xor butterflies as the channels-last
path's shuffles do (lanes without values included). Each must give torch's reduction of the row in float64 (var's
and std's with corrections 0, 1 and 2: ARGUMENTS):
NaN where torch gives NaN, infinities exactly. The rows are tests/reductions/rows.yaml's corner cases and
random ones of odd lengths and several scales.

The planner's side: a logsumexp over channels is fused (channel_reduce, and the kernels that compute the
convolution inside and reduce over the channels in one loop), and every world with a stage that does not
compute it (wide_main, plane_reduce) says so; a softmax or log_softmax over channels is channel_softmax,
whose per-value map (ft_softmax_of, ft_log_softmax_of in templates/reduce.cuh) is checked here too.
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fusetune.config import load_config
from fusetune.ops.reduce import KERNEL_MODES, REDUCE_MODES, SPREAD_MODES
from fusetune.ops.reductions import REDUCTIONS, KernelReduction
from fusetune.plan import make_plan
from fusetune.worlds import WORLDS, refusals
from fusetune.worlds.facts import STAGE_REDUCE_MODES

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
CHAINS = ROOT / "tests" / "chains"
#: Lanes of the butterfly (a lane group of the channels-last path) and the chunk length of the merges.
LANES, CHUNK = 8, 3
WAYS = ("sequential", "merged_left", "merged_right", "butterfly")


def rows() -> list[np.ndarray]:
    """The corner cases of tests/reductions/rows.yaml, then random rows: odd lengths up to 97, normal
    values at scales 1, 30 and 1000 (exp overflows float32 at 89), some with NaN or infinities put in."""
    listed = yaml.safe_load((ROOT / "tests" / "reductions" / "rows.yaml").read_text())["rows"]
    out = [np.array(r, np.float32) for r in listed]
    rng = np.random.default_rng(7)
    for n in (2, 5, 17, 31, 48, 97):
        for scale in (1.0, 30.0, 1000.0):
            out.append((rng.standard_normal(n) * scale).astype(np.float32))
        for special in (np.nan, np.inf, -np.inf):
            r = (rng.standard_normal(n) * 10).astype(np.float32)
            r[rng.integers(n)] = special
            out.append(r)
    return out


def host_program(modes: list[KernelReduction]) -> str:
    """A C++ program that reads rows (int32 count, then that many float32 values, until the end of stdin) and
    writes, per row, per mode, the four folds' float32 results, then the row's softmax and log_softmax as
    channel_softmax computes them (logsumexp's fold, softmax's finish, then ft_softmax_of / ft_log_softmax_of of each
    value)."""
    headers = sorted({r.header for r in modes if r.header})
    parts = ['#include "elementwise.cuh"', *(f'#include "{h}"' for h in headers),
             "#include <stdio.h>", "#include <stdint.h>", "#include <vector>", "#include <algorithm>"]
    for i, r in enumerate(modes):
        finish = r.finish("a", "n")
        parts.append(f"""
// {r.mode}
static {r.acc} chunk{i}(const float* x, int lo, int hi) {{
  {r.acc} a = {r.identity};
  for (int k = lo; k < hi; ++k) a = {r.fold_step("a", "x[k]")};
  return a;
}}
static float done{i}({r.acc} a, int n) {{
  {finish}
  (void)n;
  return {r.result("a")};
}}
static void run{i}(const float* x, int n, float* out) {{
  out[0] = done{i}(chunk{i}(x, 0, n), n);
  {r.acc} l = chunk{i}(x, 0, std::min({CHUNK}, n));
  for (int lo = {CHUNK}; lo < n; lo += {CHUNK}) l = {r.fold_merge("l", f"chunk{i}(x, lo, std::min(lo + {CHUNK}, n))")};
  out[1] = done{i}(l, n);
  const int last = (n - 1) / {CHUNK} * {CHUNK};
  {r.acc} rr = chunk{i}(x, last, n);
  for (int lo = last - {CHUNK}; lo >= 0; lo -= {CHUNK}) rr = {r.fold_merge(f"chunk{i}(x, lo, lo + {CHUNK})", "rr")};
  out[2] = done{i}(rr, n);
  {r.acc} lane[{LANES}], next[{LANES}];
  for (int j = 0; j < {LANES}; ++j) {{
    lane[j] = {r.identity};
    for (int k = j; k < n; k += {LANES}) lane[j] = {r.fold_step("lane[j]", "x[k]")};
  }}
  for (int o = {LANES} / 2; o > 0; o >>= 1) {{
    for (int j = 0; j < {LANES}; ++j) next[j] = {r.fold_merge("lane[j]", "lane[j ^ o]")};
    for (int j = 0; j < {LANES}; ++j) lane[j] = next[j];
  }}
  out[3] = done{i}(lane[0], n);
}}""")
    calls = "\n".join(f"    run{i}(x.data(), n, out); fwrite(out, 4, 4, stdout);" for i in range(len(modes)))
    lse = REDUCTIONS["logsumexp"]
    calls += f"""
    {lse.acc} acc = {lse.identity};
    for (int k = 0; k < n; ++k) acc = {lse.fold_step("acc", "x[k]")};
    std::vector<float> sm(n), lsm(n);
    const {lse.acc} finished = ft_softmax_end(acc);  // softmax's finish (fusetune/ops/channel.py's CHANNEL_MAPS)
    for (int k = 0; k < n; ++k) sm[k] = ft_softmax_of(x[k], finished), lsm[k] = ft_log_softmax_of(x[k], acc);
    fwrite(sm.data(), 4, n, stdout);
    fwrite(lsm.data(), 4, n, stdout);"""
    parts.append(f"""
int main() {{
  int32_t n = 0;
  float out[4];
  while (fread(&n, 4, 1, stdin) == 1) {{
    std::vector<float> x(n);
    if (fread(x.data(), 4, n, stdin) != (size_t)n) return 1;
{calls}
  }}
  return 0;
}}
""")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def host_run(tmp_path_factory) -> tuple[dict[str, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """Mode -> its folds' float32 values, shape (rows, 4 ways); and per row its softmax and log_softmax:
    one g++ compile and one run."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the modes' CUDA fragments are compiled on the host with it")
    modes = [bound for _, bound in labelled()]
    folder = tmp_path_factory.mktemp("reductions")
    (folder / "reduce.cpp").write_text(host_program(modes))
    compile_ = subprocess.run([gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Werror",
                               f"-I{TEMPLATES}", "reduce.cpp", "-o", "reduce", "-lm"],
                              cwd=folder, capture_output=True, text=True)
    assert compile_.returncode == 0, compile_.stderr
    stdin = b"".join(np.array([r.size], np.int32).tobytes() + r.tobytes() for r in rows())
    run = subprocess.run([str(folder / "reduce")], input=stdin, capture_output=True, check=True)
    flat, at = np.frombuffer(run.stdout, np.float32), 0
    folds, softmaxes = [], []
    for row in rows():
        folds.append(flat[at:at + len(modes) * len(WAYS)].reshape(len(modes), len(WAYS)))
        at += len(modes) * len(WAYS)
        softmaxes.append((flat[at:at + row.size], flat[at + row.size:at + 2 * row.size]))
        at += 2 * row.size
    assert at == flat.size
    values = np.stack(folds)
    return {label: values[:, i, :] for i, (label, _) in enumerate(labelled())}, softmaxes


@pytest.fixture(scope="module")
def host_values(host_run) -> dict[str, np.ndarray]:
    return host_run[0]


#: The arguments a mode's row is folded with beside its defaults (the labels ``var(correction=0.0)`` and so on):
#: torch.var's and torch.std's corrections 0 (the population's) and 2 (more than a row of one or two values has).
ARGUMENTS: dict[str, list[dict[str, float]]] = {mode: [{"correction": 0.0}, {"correction": 2.0}]
                                               for mode in SPREAD_MODES}


def labelled() -> list[tuple[str, KernelReduction]]:
    """Every row with its defaults (labelled by its mode), then with ARGUMENTS' values (labelled by them too)."""
    out = [(r.mode, r) for r in REDUCTIONS.values()]
    for mode, variants in ARGUMENTS.items():
        for values in variants:
            args = ", ".join(f"{k}={v}" for k, v in values.items())
            out.append((f"{mode}({args})", REDUCTIONS[mode].bind(**values)))
    return out


def torch_value(label: str, row: np.ndarray) -> float:
    """torch's reduction of the row in float64, by the label's mode and arguments (a var's correction)."""
    mode = label.split("(")[0]
    x = torch.from_numpy(row.astype(np.float64))
    fn = {"max": torch.amax, "min": torch.amin}.get(mode) or getattr(torch, mode)
    if mode in SPREAD_MODES:  # (a row of n <= correction values: torch warns, and gives inf or NaN as the row)
        correction = dict(REDUCTIONS[mode].bind(**_values(label)).arguments)["correction"]
        return float(fn(x, dim=0, correction=int(correction)))
    return float(fn(x, dim=0))


def _values(label: str) -> dict[str, float]:
    """The arguments a label names (``var(correction=0.0)``: {"correction": 0.0}), none for a bare mode."""
    if "(" not in label:
        return {}
    return {k: float(v) for k, v in (part.split("=") for part in label[label.index("(") + 1:-1].split(", "))}


def close(label: str, got: float, ref: float, row: np.ndarray) -> bool:
    """float32 ``got`` is float64 ``ref``: NaN only with NaN, infinities exactly, max and min exactly (one
    of the row's values), else within float32's rounding of a sum of the row's magnitudes (a logsumexp's:
    of its log-sum and its max; a var's: of the squared deviations, the var itself). A var or
    std whose squared deviations pass float32's range (rows of 1e30 and more) is +inf in float32, as torch's
    float32 reduction on a GPU gives it."""
    mode = label.split("(")[0]
    if mode in SPREAD_MODES and np.isfinite(ref) and _squares_overflow(row):
        return got == np.inf
    if np.isnan(ref) or np.isnan(got):
        return bool(np.isnan(ref) and np.isnan(got))
    if np.isinf(ref) or np.isinf(got) or mode in ("max", "min"):
        return got == ref
    finite = np.abs(row[np.isfinite(row)].astype(np.float64))
    scale = max(abs(ref), float(finite.sum()) / max(row.size, 1) if finite.size else 0.0, 1.0)
    return abs(got - ref) <= 8 * row.size * np.finfo(np.float32).eps * scale + 1e-30


def test_every_mode_the_planner_fuses_has_a_row():
    assert set(KERNEL_MODES) <= set(REDUCTIONS) <= set(REDUCE_MODES) | set(SPREAD_MODES)
    for stage, modes in STAGE_REDUCE_MODES.items():
        assert set(modes) <= set(REDUCTIONS), stage
    assert STAGE_REDUCE_MODES["channel_reduce"] == tuple(REDUCTIONS)


def _squares_overflow(row: np.ndarray) -> bool:
    """Whether a row's squared deviations from its mean pass float32's largest value."""
    x = row.astype(np.float64)
    return bool(np.max((x - x.mean()) ** 2) > np.finfo(np.float32).max)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")
@pytest.mark.parametrize("mode", [label for label, _ in labelled()])
def test_folds_match_torch(mode: str, host_values: dict[str, np.ndarray]):
    failures = []
    for i, row in enumerate(rows()):
        ref = torch_value(mode, row)
        for w, way in enumerate(WAYS):
            got = float(host_values[mode][i, w])
            if not close(mode, got, ref, row):
                failures.append(f"{mode} {way} of {row.tolist()[:8]}{'...' if row.size > 8 else ''}: "
                                f"cuda {got!r}, torch {ref!r}")
    assert not failures, "\n".join(failures[:10])


def test_logsumexp_corner_cases_are_torchs_exactly(host_values: dict[str, np.ndarray]):
    """-inf for all -inf, +inf with any +inf, NaN with any NaN: in every way of folding."""
    for i, row in enumerate(rows()):
        ref = torch.logsumexp(torch.from_numpy(row.astype(np.float64)), 0).item()
        got = host_values["logsumexp"][i]
        if np.isnan(ref):
            assert np.isnan(got).all(), (row, got)
        elif np.isinf(ref):
            assert (got == ref).all(), (row, got)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_of_each_value_matches_torch(log: bool, host_run):
    """channel_softmax's map of each value from its row's accumulator, NaN and infinities as torch gives."""
    failures = []
    for row, (sm, lsm) in zip(rows(), host_run[1]):
        x = torch.from_numpy(row.astype(np.float64))
        ref = (torch.log_softmax(x, 0) if log else torch.softmax(x, 0)).numpy()
        got = (lsm if log else sm).astype(np.float64)
        nan = np.isnan(ref) | np.isnan(got)
        tol = 8 * row.size * float(np.finfo(np.float32).eps)
        scale = 1.0 + (np.abs(row).max(initial=0.0, where=np.isfinite(row)) if log else 0.0)  # x - m's rounding
        ok = np.where(nan, np.isnan(ref) & np.isnan(got), np.isclose(got, ref, rtol=tol, atol=tol * scale))
        if not ok.all():
            failures.append(f"{'log_' if log else ''}softmax of {row.tolist()[:8]}: cuda {got[:8]}, torch {ref[:8]}")
    assert not failures, "\n".join(failures[:10])


def _plan(stem: str):
    return make_plan(load_config(CHAINS / f"{stem}.yaml"))


def test_logsumexp_over_channels_is_fused():
    """In the cuDNN world's channel_reduce, and in the kernels that compute the convolution inside and reduce
    over the channels in one loop a position (gemm_main here; direct_main for 16 channels)."""
    plan = _plan("conv2d_logsumexp_channels_relu")
    assert plan.reduce is not None and plan.reduce.mode == "logsumexp" and plan.family == "channel_reduce"
    assert [op.kind for op in plan.final] == ["relu"]  # the relu after it runs in the kernel too
    assert all(step.op.role == "view" for step in plan.tail)  # keepdim's unsqueeze alone, free
    assert plan.impl_stages["cudnn"] == ("channel_reduce",) and plan.impl_stages["gemm"] == ("gemm_main",)
    assert _plan("convt3d_scale_logsumexp_channels_relu").impl_stages["direct"] == ("direct_main",)


def test_a_stage_without_the_mode_refuses_its_world_by_name():
    """wide_main (and plane_reduce) do not take logsumexp: their world says so, naming the stage."""
    plan = _plan("convt2d_wide96_outpad_hardswish_amax_channels")
    assert plan.impl_stages["gemm_wide"] == ("wide_main",)
    lse = dataclasses.replace(plan, reduce=dataclasses.replace(plan.reduce, mode="logsumexp"))
    reason = WORLDS["gemm_wide"].refusal(lse)
    assert reason is not None and "logsumexp" in reason and "wide_main" in reason
    assert WORLDS["cudnn"].refusal(lse) is None
    spatial = _plan("conv2d_abs_sqrt_mean_spatial")
    assert spatial.family == "plane_reduce"
    reason = WORLDS["cudnn"].refusal(dataclasses.replace(spatial, reduce=dataclasses.replace(spatial.reduce,
                                                                                             mode="logsumexp")))
    assert reason is not None and "plane_reduce" in reason


@pytest.mark.parametrize("stem", ["conv2d_logsumexp_channels_relu", "convt3d_scale_logsumexp_channels_relu",
                                  "conv2d_wide80_instancenorm_leakyrelu_logsumexp_channels"])
def test_worlds_whose_stages_lack_the_mode_refuse_it_by_name(stem: str):
    """No offered world runs a stage without the mode; a world refused for it names the stage."""
    plan = _plan(stem)
    for name, stages in plan.impl_stages.items():
        for stage in stages:
            assert plan.reduce.mode in STAGE_REDUCE_MODES.get(stage, (plan.reduce.mode,)), (name, stage)
    for name, reason in refusals(plan).items():
        if "logsumexp" in reason:
            assert any(stage in reason for stage in STAGE_REDUCE_MODES), reason
    if stem.startswith("conv2d_wide80"):  # wide_stats, then the cuDNN world's channel_reduce; not wide_main
        assert plan.impl_stages["gemm_wide"] == ("wide_stats", "finalize", "channel_reduce")
        assert "wide_main" in refusals(plan)["gemm_wide_recompute"]


@pytest.mark.parametrize("stem, log", [("conv2d_logsoftmax_channels_maxpool", True),
                                       ("conv1d_grouped_abs_log_softmax_channels", False),
                                       ("convt3d_wide80_outpad_instancenorm_clamp_softmax_channels", False)])
def test_softmax_over_channels_is_channel_softmax(stem: str, log: bool):
    """Fused as the main family channel_softmax, which only the worlds that run the cuDNN world's main
    kernels take; the kernels that compute the convolution inside say they do not implement it."""
    plan = _plan(stem)
    assert plan.family == "channel_softmax" and plan.channel_map is not None and plan.channel_map.log is log
    assert plan.reduce is None
    for name, stages in plan.impl_stages.items():
        assert not stages or stages[-1] == "channel_softmax", (name, stages)
    assert plan.impl_stages["cudnn"][-1] == "channel_softmax"
    for name, reason in refusals(plan).items():
        if WORLDS[name].computes_conv_inside and "channel_softmax" in reason:
            assert "do not implement" in reason or "not a map or a reduction" in reason, reason


def test_other_modes_are_offered_as_before():
    """The check is the mode's: a max over channels still reaches the kernels that compute the convolution."""
    plan = _plan("conv2d_min_channels_tanh_tanh")
    assert plan.reduce.mode == "min"
    inside = [name for name in plan.impl_stages if WORLDS[name].computes_conv_inside]
    assert inside, plan.describe()


def test_var_over_channels_is_fused_with_its_correction():
    """A var over the channels is channel_reduce's (and the kernels' that compute the convolution inside), its
    correction bound into the rendered fragment; a std over (H, W) is a later region on the channels view, the
    same accumulator over H * W values (a spatial var is no fold of plane_reduce's one float)."""
    from fusetune.codegen import render
    from fusetune.pipeline import later_segments

    plan = _plan("conv2d_relu_log_nan_to_num_args_var_channels")
    assert plan.family == "channel_reduce" and plan.reduce.mode == "var" and plan.reduce.correction == 2
    assert plan.reduce.kernel.result("acc") == "ft_var_value(acc, 2.0f)"
    unit = render(plan).cuda_sources["channel_reduce.cu"]
    assert "ft_var_value(acc[j], 2.0f)" in unit and "struct FtSpread" in unit
    assert "gemm_main" in _plan("conv3d_groupnorm_gelu_var_channels_keepdim").impl_stages["gemm"]
    spatial = _plan("conv2d_instancenorm_affine_gelu_std_spatial")
    assert spatial.reduce is None  # region 0 ends before the std: no kernel of region 0 reduces over (H, W) by it
    (region,) = later_segments(spatial)
    later = make_plan(region.spec)
    assert (later.family, later.reduce.mode, later.reduce.correction) == ("channel_reduce", "std", 0)
    assert region.view.form == "channels" and (region.view.first, region.view.last) == (2, 3)


#: A row longer than a float counts: past 2^24 a float count stops (2^24 + 1 rounds back to 2^24), so a var
#: counted in one divides by 2^24 whatever the row's length. SPLIT (odd: the parts' pivots differ) is where the
#: merged folds cut it.
LONG_ROW, SPLIT = 2 ** 24 + 2 ** 22, 2 ** 23 + 1


def long_row_program(r: KernelReduction) -> str:
    """A C++ program that folds the row 1, -1, 1, ... of LONG_ROW values with ``r`` one value after another, and
    as its two parts at SPLIT merged both ways round, and writes the three float32 results."""
    return f"""#include "elementwise.cuh"
#include "{r.header}"
#include <stdio.h>
static {r.acc} part(long lo, long hi) {{
  {r.acc} a = {r.identity};
  for (long k = lo; k < hi; ++k) a = {r.fold_step("a", "(k % 2 ? -1.f : 1.f)")};
  return a;
}}
int main() {{
  const {r.acc} head = part(0, {SPLIT}), tail = part({SPLIT}, {LONG_ROW});
  const {r.acc} folds[3] = {{part(0, {LONG_ROW}), {r.fold_merge("head", "tail")}, {r.fold_merge("tail", "head")}}};
  float out[3];
  for (int i = 0; i < 3; ++i) {{
    {r.acc} a = folds[i];
    {r.finish("a", str(LONG_ROW))}
    out[i] = {r.result("a")};
  }}
  fwrite(out, 4, 3, stdout);
  return 0;
}}
"""


@pytest.mark.parametrize("mode", SPREAD_MODES)
def test_a_spread_counts_a_row_past_a_floats_count(mode: str, tmp_path: Path):
    """var and std of a row of more than 2^24 values divide by its own count (torch's, in float64), folded in
    one run and merged from two parts either way round."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the modes' CUDA fragments are compiled on the host with it")
    (tmp_path / "long.cpp").write_text(long_row_program(REDUCTIONS[mode]))
    compile_ = subprocess.run([gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Werror",
                               f"-I{TEMPLATES}", "long.cpp", "-o", "long", "-lm"],
                              cwd=tmp_path, capture_output=True, text=True)
    assert compile_.returncode == 0, compile_.stderr
    got = np.frombuffer(subprocess.run([str(tmp_path / "long")], capture_output=True, check=True).stdout, np.float32)
    row = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(LONG_ROW // 2)
    correction = int(dict(REDUCTIONS[mode].arguments)["correction"])
    ref = float(getattr(torch, mode)(row, dim=0, correction=correction))
    assert np.allclose(got, ref, rtol=1e-6, atol=0), (got.tolist(), ref)
