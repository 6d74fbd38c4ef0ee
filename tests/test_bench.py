"""What `fusetune bench` reports without a GPU: the work and bytes it counts, and the table it prints
from saved results (the committed H100 results of the seeds)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fusetune.bench import (PEAK_FLOPS_PER_SM_CLOCK, compute_units, conv_flops, epilogue_bytes, kernel_base_name,
                            kernel_bytes, kernel_rows, spectral_flops, table)
from fusetune.config import load_config, parse_config
from fusetune.plan import make_plan
from fusetune.worlds import WORLDS

from conftest import ROOT, SEEDS

RESULTS = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "h100").glob("*.json"))


@pytest.mark.parametrize("seed, gflop", [
    ("groupnorm", 18.728091648),  # 128 x 64 x 126^2 outputs x 8 x 3^2 taps x 2
    ("instancenorm", 4.180377600),  # 128 x 16 x 14 x 30^2 outputs x 3 x 3^3 x 2
    ("maxpool_gap", 5.435817984),  # transposed: every input (128 x 16 x 32^2) meets 16 x 3^3 taps, x 3 x 2
])
def test_conv_flops_count_useful_work_only(seed, gflop):
    spec = load_config(SEEDS[seed])
    assert conv_flops(spec, spec.shapes[0]) / 1e9 == pytest.approx(gflop, rel=1e-12)


def test_epilogue_bytes_read_the_conv_output_once_per_pass():
    spec = load_config(SEEDS["groupnorm"])
    shape = spec.shapes[0]
    y = 128 * 64 * 126 * 126 * 4
    out = 128 * 64 * 31 * 31 * 4
    assert epilogue_bytes(spec, make_plan(spec), shape) == 2 * y + out  # statistics pass + main pass


def test_peaks_are_hopper_dense_rates_of_each_worlds_units():
    assert PEAK_FLOPS_PER_SM_CLOCK == {"FP32": 256, "TF32": 2048, "TF32x3": 2048 / 3, "FP16": 4096}
    units = {impl: compute_units(impl) for impl, world in WORLDS.items() if world.computes_conv_inside}
    assert units == {"direct": "FP32", "gemm": "TF32", "gemm_extrema": "TF32", "gemm_store": "TF32",
                     "gemm_cluster": "TF32", "gemm_wide": "TF32", "gemm_wide_recompute": "TF32",
                     "spectral": "FP32"}
    half = load_config(ROOT / "benchmarks" / "half" / "conv2d_groupnorm_scale_maxpool_clamp_fp16.yaml")
    ieee = load_config(ROOT / "benchmarks" / "half" / "conv2d_groupnorm_scale_maxpool_clamp_ieee.yaml")
    # FP16 MMAs in the whole-weights kernels and the K-tiled ones; split TF32 under ieee in both
    assert [compute_units(impl, half) for impl in ("gemm_extrema", "gemm_wide", "direct")] == ["FP16", "FP16", "FP32"]
    assert compute_units("gemm_store", ieee) == compute_units("gemm_wide_recompute", ieee) == "TF32x3"


def test_spectral_flops_count_the_products_of_spectra():
    spec = load_config(SEEDS["batchnorm"])
    # output 20 x 36 x 36: 20 x 36 x 19 bins of its half spectrum, each 16 x 64 x 128 complex multiply-adds
    assert spectral_flops(spec, spec.shapes[0]) == 8 * 16 * 64 * 128 * (20 * 36 * 19)
    assert spectral_flops(spec, spec.shapes[0]) < conv_flops(spec, spec.shapes[0]) / 30


@pytest.mark.skipif(not RESULTS, reason="no saved results")
def test_table_of_saved_results_names_each_winner_and_its_measure():
    results = [r for path in RESULTS for r in json.loads(path.read_text())]
    text = table(results)
    lines = text.splitlines()
    footer = next(i for i, line in enumerate(lines) if line.startswith("(ms, median"))
    rows = {line.split()[0]: line for line in lines[1:footer]}
    assert set(rows) == {r["config"] for r in results}
    for r in results:
        row = rows[r["config"]]
        assert f"{r['fusetune_ms']:.3f}" in row
        assert f"{r['speedup_vs_compile_max-autotune-no-cudagraphs']:.2f}x" in row
        if r["impl"] == "cudnn":
            assert f"{100 * r['epilogue_floor_fraction']:.0f}%" in row  # its epilogue against the copy floor
        else:
            kind = compute_units(r["impl"])
            assert f"{100 * r['peak_fraction']:.0f}% {kind}" in row  # its convolution against its units' peak
    assert results[0]["gpu"] in lines[footer]
    for r in results:  # the epilogue's kernels one by one, where the bench profiled them
        for k in r.get("kernels", []):
            assert any(line.strip().startswith(k["kernel"]) and f"{k['ms']:.4f} ms" in line for line in lines)


def test_profiled_kernel_names_and_the_bytes_each_must_move():
    assert kernel_base_name("void ft_stats_kernel<512, 4, 0>(FtArgs)") == "ft_stats_kernel"
    assert kernel_base_name("ft_finalize_kernel(FtArgs)") == "ft_finalize_kernel"
    assert kernel_base_name("void ft_window_map_cl_kernel<256, 2>(FtArgs, FtClGeom)") == "ft_window_map_cl_kernel"
    spec = load_config(SEEDS["groupnorm"])
    plan = make_plan(spec)
    shape = spec.shapes[0]
    y, out = 128 * 64 * 126 * 126 * 4, 128 * 64 * 31 * 31 * 4
    assert kernel_bytes("ft_stats_cl_kernel", plan, shape) == y  # reads the producer output once
    assert kernel_bytes("ft_window_map_kernel", plan, shape) == y + out  # and writes the output
    assert kernel_bytes("ft_finalize_kernel", plan, shape) is None  # per-(sample, channel) values only
    rows = kernel_rows({"ft_finalize_kernel": 0.005, "ft_stats_kernel": 0.2}, plan, shape, bandwidth_gbs=3000.0)
    assert [r["kernel"] for r in rows] == ["ft_stats_kernel", "ft_finalize_kernel"]  # slowest first
    assert rows[0]["floor_ms"] == pytest.approx(y / 3e12 * 1e3)
    assert rows[0]["floor_fraction"] == pytest.approx(rows[0]["floor_ms"] / 0.2)
    assert rows[1]["floor_fraction"] is None and rows[1]["bytes"] is None
    result = {"config": spec.name, "shape": list(shape), "gpu": "G", "copy_gbs": 3000.0, "eager_ms": 2.0,
              "fusetune_ms": 1.0, "speedup_vs_eager": 2.0, "impl": "cudnn", "epilogue_ms": 0.21,
              "epilogue_floor_ms": 0.17, "epilogue_floor_fraction": 0.81, "kernels": rows}
    text = table([result])
    assert "ft_stats_kernel" in text and f"{100 * rows[0]['floor_fraction']:.0f}% of it" in text
    assert "per-channel values only" in text


def test_the_floor_counts_what_the_kernels_write_not_what_pytorch_does_after_them():
    """With a tail in PyTorch (here a softmax over channels after the pool), the kernels write the
    pooled tensor; the floor is theirs, not the whole chain's output."""
    raw = yaml.safe_load(SEEDS["groupnorm"].read_text())
    raw["epilogue"].append({"op": "softmax", "dim": 1})
    raw["epilogue"].append({"op": "amax", "dim": [2, 3]})
    spec = parse_config(raw, "x.yaml")
    plan = make_plan(spec)
    shape = spec.shapes[0]
    y, pooled = 128 * 64 * 126 * 126 * 4, 128 * 64 * 31 * 31 * 4
    assert spec.output_shape(shape) == (128, 64) and plan.fused_output_shape(shape) == (128, 64, 31, 31)
    assert kernel_bytes("ft_window_map_kernel", plan, shape) == y + pooled
    assert epilogue_bytes(spec, plan, shape) == 2 * y + pooled
