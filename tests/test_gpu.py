"""GPU tests: end to end on the seeds, kernel correctness beyond them, fault injection.

Skipped without a CUDA GPU. Run on the device with: pytest -m gpu tests/test_gpu.py (about an
hour on an H100). In parts: -k "gemm_wide-" (one world), -k conv2d_wide_bneval (one chain), with
FUSETUNE_TEST_CACHE=DIR so that parts run one after another share their builds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from fusetune.build import build_many  # noqa: E402
from fusetune.codegen import plan_space, render  # noqa: E402
from fusetune.config import load_config, parse_config  # noqa: E402
from fusetune.evaluate import ERROR_RATIO  # noqa: E402
from fusetune.export import export  # noqa: E402
from fusetune.plan import make_plan  # noqa: E402
from fusetune.worlds import WORLDS  # noqa: E402
from fusetune.runner import GpuBenchmarker  # noqa: E402
from fusetune.search import Machine, tune_shape  # noqa: E402
from fusetune.space import candidate_key  # noqa: E402
from fusetune.worker import Worker  # noqa: E402

from conftest import REFERENCE_WORLDS  # noqa: E402
from export_run import run_export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted((ROOT / "configs").glob("*.yaml"))


def _bench_factory(cache, machine, worker, **kwargs):
    return lambda plan, shape: GpuBenchmarker(plan, shape, cache, machine, worker, echo=print, **kwargs)


@pytest.mark.parametrize("config", SEEDS, ids=lambda p: p.stem)
def test_seed_end_to_end(config, cache, worker, tmp_path):
    """Search every configured shape with a small budget, then export and run the export."""
    spec = load_config(config)
    machine = Machine.detect()
    for shape in spec.shapes:
        result = tune_shape(spec, shape, cache, machine, _bench_factory(cache, machine, worker), trials=3)
        assert result.status == "tuned", result
        assert result.time_ms and result.time_ms > 0
        again = tune_shape(spec, shape, cache, machine, _bench_factory(cache, machine, worker), trials=3)
        assert again.status == "cached" and again.candidate == result.candidate
    # A winner must also run correctly at a shape it was not tuned for (export and deploy use the
    # first shape's winner there): the defaults' 16-byte loads meet planes that are not aligned.
    first = tune_shape(spec, spec.shapes[0], cache, machine, _bench_factory(cache, machine, worker), trials=3)
    plan = make_plan(spec)
    default = plan_space(plan).default()
    other = GpuBenchmarker(plan, spec.shapes[-1], cache, machine, worker, echo=print)
    other.prepare()
    space = plan_space(plan)
    candidates = [first.candidate, default, {**default, "producer.layout": "channels_last"}]
    from fusetune.search import _nearest, shape_facts
    facts = shape_facts(spec, plan, spec.shapes[-1], machine.capability)
    feasible = [c for c in space.all() if not space.violations(c, facts)]
    for impl in set(plan.impl_stages) - {"cudnn"}:
        # The default with the convolution inside, or the feasible candidate nearest to it (ct == C
        # for a direct channel reduction).
        candidates.append(_nearest(space.canonical({**default, "producer.impl": impl}), feasible))
    for candidate in candidates:
        outcome = other.verify(candidate)
        assert outcome["status"] == "ok", (candidate, outcome)
    target = export(spec, list(spec.shapes), cache, tmp_path, machine.gpu)
    record = json.loads((target / "winner.json").read_text())
    assert [s["input_shape"] for s in record["shapes"]] == [list(s) for s in spec.shapes]
    got = run_export(target, spec.shapes[-1], {**os.environ, "FUSETUNE_BUILD_DIR": str(target / "build")})
    assert got["error"] < 1e-2, got
    assert got["float64"] is not None and "float32" in got["float64"], got  # float64 input is refused


# Chains beyond the seeds: other ops, kernel sizes, strides, odd sizes, 2-D and 3-D.
EXTRA = {
    "conv2d_avgpool_relu_mean": {
        "producer": {"op": "conv2d", "in_channels": 5, "out_channels": 12, "kernel_size": [3, 5], "stride": 2,
                     "padding": 1},
        "epilogue": [{"op": "add", "by": "b"}, {"op": "avg_pool", "kernel_size": [3, 2], "stride": [2, 3]},
                     {"op": "relu"}, {"op": "adaptive_avg_pool"}, {"op": "div", "by": 3.0}],
        "parameters": {"b": {"init": "randn"}},
        "shapes": [[3, 5, 29, 41]]},
    "conv3d_bn_eval_clamp_sum": {
        "producer": {"op": "conv3d", "in_channels": 4, "out_channels": 8, "kernel_size": 2},
        "epilogue": [{"op": "batch_norm", "training": False}, {"op": "clamp", "min": -0.5},
                     {"op": "sum", "dim": 1}],
        "shapes": [[2, 4, 7, 9, 11]]},
    "convt3d_groupnorm_minpool": {
        "producer": {"op": "conv_transpose3d", "in_channels": 6, "out_channels": 10, "kernel_size": 3,
                     "stride": 2, "padding": 1, "output_padding": 1},
        "epilogue": [{"op": "mul", "by": -1.5}, {"op": "group_norm", "groups": 5}, {"op": "mul", "by": "s"},
                     {"op": "max_pool", "kernel_size": 3, "stride": 2}, {"op": "relu"}],
        "parameters": {"s": {"init": "randn"}},
        "shapes": [[2, 6, 5, 6, 7]]},
    "conv2d_instancenorm_affine_max_gap": {
        "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 7, "kernel_size": 4, "bias": False},
        "epilogue": [{"op": "instance_norm", "affine": True}, {"op": "max_pool", "kernel_size": 3},
                     {"op": "adaptive_avg_pool"}, {"op": "clamp", "max": 0.3}],
        "shapes": [[5, 3, 33, 35]]},
    "conv3d_bn_train_mean_channels": {
        "producer": {"op": "conv3d", "in_channels": 2, "out_channels": 6, "kernel_size": [1, 3, 3]},
        "epilogue": [{"op": "batch_norm", "momentum": 0.3}, {"op": "relu"}, {"op": "mean", "dim": 1}],
        "shapes": [[3, 2, 5, 13, 17]]},
}
EXTRA["conv2d_min_channels"] = {
    "producer": {"op": "conv2d", "in_channels": 4, "out_channels": 11, "kernel_size": 2, "padding": 2},
    "epilogue": [{"op": "div", "by": 2.0}, {"op": "min", "dim": 1}, {"op": "clamp", "min": -0.2, "max": 0.2}],
    "shapes": [[3, 4, 17, 15]]}
# A large offset before the norm: statistics from raw float sums would cancel catastrophically.
EXTRA["conv2d_offset_groupnorm"] = {
    "producer": {"op": "conv2d", "in_channels": 8, "out_channels": 16, "kernel_size": 3},
    "epilogue": [{"op": "add", "by": 300.0}, {"op": "group_norm", "groups": 4}, {"op": "max_pool", "kernel_size": 2},
                 {"op": "clamp", "min": 0.0, "max": 1.0}],
    "shapes": [[3, 8, 29, 31]]}
# A chain whose batch norm is followed by a spatial sum: computed from the statistics alone.
EXTRA["conv2d_bn_sum_spatial"] = {
    "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 9, "kernel_size": 3},
    "epilogue": [{"op": "mul", "by": 0.7}, {"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
    "shapes": [[4, 3, 19, 23]]}


# Direct kernels (the convolution inside): transposed convolutions whose output parity is known at
# compile time and ones where it is not, padding, odd strides, every main family, stats-only plans.
EXTRA["convt3d_direct_instancenorm_max_channels"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 3, "out_channels": 8, "kernel_size": 3, "stride": 2,
                 "padding": 1, "output_padding": 1},
    "epilogue": [{"op": "instance_norm"}, {"op": "clamp", "min": -0.7, "max": 0.9}, {"op": "max", "dim": 1}],
    "shapes": [[2, 3, 5, 7, 6]]}
EXTRA["convt3d_direct_stride3_maxpool_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 4, "out_channels": 8, "kernel_size": [2, 3, 4],
                 "stride": [2, 1, 3], "padding": [0, 1, 1]},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "max_pool", "kernel_size": 3, "stride": 2},
                 {"op": "adaptive_avg_pool"}, {"op": "add", "by": 0.25}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 4, 5, 9, 4]]}
# Several pooling windows a thread (direct_main.cells), with a row's last group running past its end:
# the window's ends both ways (a scale of either sign) and the largest alone (a rising chain).
EXTRA["convt3d_direct_rows_negscale_maxpool"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 4, "out_channels": 6, "kernel_size": 3, "stride": 2,
                 "padding": 1},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "max_pool", "kernel_size": 2},
                 {"op": "clamp", "min": -0.5, "max": 0.5}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 4, 5, 7, 10]]}
EXTRA["convt3d_direct_rows_rising_maxpool_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 3, "out_channels": 8, "kernel_size": 3, "stride": 2,
                 "padding": 1},
    "epilogue": [{"op": "add", "by": 0.3}, {"op": "mul", "by": 0.5}, {"op": "max_pool", "kernel_size": 2},
                 {"op": "adaptive_avg_pool"}],
    "shapes": [[2, 3, 5, 6, 11]]}
EXTRA["conv2d_direct_stride_bn_mean"] = {
    "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 8, "kernel_size": 3, "stride": 2, "padding": 1},
    "epilogue": [{"op": "mul", "by": 0.7}, {"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
    "shapes": [[5, 3, 21, 18]]}
EXTRA["conv3d_direct_padded_groupnorm_avgpool"] = {
    "producer": {"op": "conv3d", "in_channels": 3, "out_channels": 12, "kernel_size": [3, 1, 2], "padding": [1, 0, 1]},
    "epilogue": [{"op": "group_norm", "groups": 3}, {"op": "avg_pool", "kernel_size": 2}, {"op": "relu"}],
    "shapes": [[2, 3, 7, 9, 11]]}

# A stride-1 transposed convolution, which cuDNN may also run as the plain convolution it equals
# (producer.form): padding below k - 1 on two axes, none on the third; batch norm over 3 samples.
EXTRA["convt3d_forward_form_bn_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 6, "out_channels": 10, "kernel_size": [3, 2, 3],
                 "padding": [1, 0, 2]},
    "epilogue": [{"op": "mul", "by": -1.5}, {"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
    "shapes": [[3, 6, 4, 5, 7]]}

# Batch norm over more samples than the finalize kernel's block (128 threads stride over the batch),
# without a main pass and with one.
EXTRA["conv3d_bn_large_batch_gap"] = {
    "producer": {"op": "conv3d", "in_channels": 3, "out_channels": 6, "kernel_size": 2},
    "epilogue": [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
    "shapes": [[130, 3, 3, 4, 4]]}
EXTRA["conv2d_bn_large_batch_maxpool"] = {
    "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 4, "kernel_size": 3},
    "epilogue": [{"op": "mul", "by": 0.5}, {"op": "batch_norm"}, {"op": "max_pool", "kernel_size": 2}],
    "shapes": [[131, 3, 7, 8]]}


# Statistics from spectra (spectral_stats): full transposed convolutions (stride 1, no padding), odd and
# even output widths (the half spectrum's Nyquist bin), batches and channel counts that are not
# multiples of a thread's tile, a per-channel scale of either sign and a large offset before the norm,
# group and batch norm, with and without the producer's bias, an op after the mean.
EXTRA["convt3d_spectral_offset_groupnorm_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 5, "out_channels": 6, "kernel_size": [3, 2, 4]},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "add", "by": 40.0}, {"op": "group_norm", "groups": 3},
                 {"op": "adaptive_avg_pool"}, {"op": "mul", "by": 3.0}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 5, 4, 7, 6]]}
EXTRA["convt3d_spectral_bn_gap_clamp"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 4, "out_channels": 10, "kernel_size": 3, "bias": False},
    "epilogue": [{"op": "div", "by": -0.5}, {"op": "batch_norm", "momentum": 0.2}, {"op": "adaptive_avg_pool"},
                 {"op": "clamp", "min": -0.3, "max": 0.3}],
    "shapes": [[9, 4, 5, 6, 8]]}

# Tensor-core kernels: channel counts whose weight rows are not a power of two, strides and padding,
# overlapping and 3-D pooling windows, every main family.
EXTRA["conv3d_gemm_stride_pad_maxpool3d_gap"] = {
    "producer": {"op": "conv3d", "in_channels": 5, "out_channels": 24, "kernel_size": [3, 2, 3],
                 "stride": [1, 2, 1], "padding": [1, 0, 2]},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "max_pool", "kernel_size": 2, "stride": [2, 2, 1]},
                 {"op": "adaptive_avg_pool"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 5, 6, 13, 21]]}
EXTRA["conv2d_gemm_instancenorm_min_channels"] = {
    "producer": {"op": "conv2d", "in_channels": 7, "out_channels": 40, "kernel_size": 5, "padding": 2},
    "epilogue": [{"op": "instance_norm"}, {"op": "relu"}, {"op": "min", "dim": 1}],
    "shapes": [[3, 7, 19, 37]]}
EXTRA["conv2d_gemm_groupnorm_overlap_avgpool"] = {
    "producer": {"op": "conv2d", "in_channels": 3, "out_channels": 32, "kernel_size": 3, "stride": 2},
    "epilogue": [{"op": "group_norm", "groups": 8}, {"op": "avg_pool", "kernel_size": 3, "stride": 2},
                 {"op": "clamp", "min": -0.5, "max": 0.5}],
    "shapes": [[2, 3, 45, 67]]}

# The convolution once (gemm_extrema): a per-channel scale of either sign after the norm (so some
# channels take the window's minimum), a strided, padded convolution, windows with gaps between them.
EXTRA["conv2d_gemm_extrema_negative_scale"] = {
    "producer": {"op": "conv2d", "in_channels": 5, "out_channels": 24, "kernel_size": 3, "stride": [1, 2],
                 "padding": 1},
    "epilogue": [{"op": "group_norm", "groups": 6}, {"op": "mul", "by": "s"},
                 {"op": "max_pool", "kernel_size": 2, "stride": [4, 2]}, {"op": "relu"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 5, 37, 61]]}


# One kernel on a thread-block cluster per sample (gemm_cluster): an offset and a scale of either sign
# before a group norm (the sums around a pivot), a 3-D convolution with padding on one axis, windows
# one deep; a chain that is not affine before an instance norm with a learnable map; a producer bias
# kept (group norm does not cancel it). Shapes that are not multiples of the boxes.
EXTRA["conv3d_cluster_offset_groupnorm_avgpool"] = {
    "producer": {"op": "conv3d", "in_channels": 4, "out_channels": 16, "kernel_size": [2, 3, 3], "padding": [0, 1, 0]},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "add", "by": 30.0}, {"op": "group_norm", "groups": 4},
                 {"op": "avg_pool", "kernel_size": [1, 2, 2]}, {"op": "relu"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 4, 5, 17, 37]]}
EXTRA["conv2d_cluster_relu_instancenorm_sum_channels"] = {
    "producer": {"op": "conv2d", "in_channels": 6, "out_channels": 24, "kernel_size": 3},
    "epilogue": [{"op": "relu"}, {"op": "instance_norm", "affine": True}, {"op": "sum", "dim": 1},
                 {"op": "mul", "by": 0.25}],
    "shapes": [[2, 6, 23, 41]]}


# The K-tiled tensor-core kernel (gemm_wide): output channels that are not a multiple of a block's
# (72, 80, 96 against bn 64 and 128), input channels that are not a multiple of a stage's 16 (20, 24,
# 40), a transposed convolution's forward form with padding on two axes, a strided, padded one, a
# chain before the norm that is affine with an offset and one that is not, and each way the chain
# ends (finalize alone, and after the stored output: a map, a plane reduction, a channel reduction);
# input rows of a multiple of 4 (copied 16 bytes at a time, the padding shifted) and not.
EXTRA["convt3d_wide_offset_bn_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 24, "out_channels": 80, "kernel_size": 3,
                 "padding": [1, 0, 2]},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "add", "by": 20.0}, {"op": "batch_norm"},
                 {"op": "adaptive_avg_pool"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 24, 7, 11, 13]]}
EXTRA["conv3d_wide_stride_instancenorm_maxpool"] = {
    "producer": {"op": "conv3d", "in_channels": 20, "out_channels": 72, "kernel_size": 3, "stride": [1, 2, 2],
                 "padding": 1},
    "epilogue": [{"op": "instance_norm", "affine": True}, {"op": "max_pool", "kernel_size": 2},
                 {"op": "clamp", "min": -1.0, "max": 1.0}],
    "shapes": [[2, 20, 6, 17, 23]]}
EXTRA["conv3d_wide_bn_maxpool_gap"] = {
    "producer": {"op": "conv3d", "in_channels": 16, "out_channels": 64, "kernel_size": 3, "bias": False},
    "epilogue": [{"op": "batch_norm"}, {"op": "max_pool", "kernel_size": 2}, {"op": "adaptive_avg_pool"}],
    "shapes": [[2, 16, 6, 10, 35]]}
EXTRA["conv2d_wide_relu_groupnorm_sum_channels"] = {
    "producer": {"op": "conv2d", "in_channels": 40, "out_channels": 96, "kernel_size": 5, "padding": 2},
    "epilogue": [{"op": "relu"}, {"op": "group_norm", "groups": 8}, {"op": "sum", "dim": 1}],
    "shapes": [[3, 40, 29, 36]]}
# Strided transposed convolutions, split by output parity: stride 2 with output padding; strides 2
# and 3 beside 1, a kernel smaller than its stride (classes with no taps: zero before the bias),
# padding past k - 1 (outputs cropped: a class starts inside the input) and different kernels a axis.
EXTRA["convt3d_wide_stride2_bn_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 24, "out_channels": 80, "kernel_size": 3, "stride": 2,
                 "padding": 1, "output_padding": 1},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 24, 5, 7, 9]]}
EXTRA["convt3d_wide_mixed_strides_instancenorm_maxpool"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 32, "out_channels": 72, "kernel_size": [3, 2, 4],
                 "stride": [1, 3, 2], "padding": [3, 0, 1], "output_padding": [0, 2, 1]},
    "epilogue": [{"op": "relu"}, {"op": "instance_norm", "affine": True}, {"op": "max_pool", "kernel_size": 2},
                 {"op": "clamp", "min": -1.0, "max": 1.0}],
    "shapes": [[2, 32, 9, 5, 7]]}
# The K-tiled kernel with the chain on its accumulators (wide_main). Without a norm (gemm_wide): a
# spatial mean after a strided transposed convolution (its classes' boxes in turn) and a chain after
# it; a map of a strided convolution with 100 channels (not a multiple of a block's) and a learnable
# scale; a max over 96 channels (one tile of 128, or two of 64), a kernel of two taps along w, and a
# mean over 160 (several tiles at every bn). After a norm
# (gemm_wide_recompute, beside gemm_wide's stored output): a map after batch norm, and a mean over
# channels after instance norm of mixed strides (conv2d_wide_relu_groupnorm_sum_channels above: a
# sum over channels after group norm).
EXTRA["convt3d_wide_stride2_relu_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 24, "out_channels": 80, "kernel_size": 3, "stride": 2,
                 "padding": 1, "output_padding": 1},
    "epilogue": [{"op": "relu"}, {"op": "adaptive_avg_pool"}, {"op": "add", "by": 0.5}],
    "shapes": [[2, 24, 5, 7, 9]]}
EXTRA["conv3d_wide_stride_scale_clamp"] = {
    "producer": {"op": "conv3d", "in_channels": 20, "out_channels": 100, "kernel_size": 3, "stride": [1, 2, 2],
                 "padding": 1},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "clamp", "min": -0.5, "max": 0.5}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 20, 6, 17, 23]]}
EXTRA["conv3d_wide_relu_max_channels"] = {
    "producer": {"op": "conv3d", "in_channels": 40, "out_channels": 96, "kernel_size": [3, 3, 2]},
    "epilogue": [{"op": "relu"}, {"op": "max", "dim": 1}, {"op": "mul", "by": 2.0}],
    "shapes": [[2, 40, 5, 9, 13]]}
EXTRA["conv2d_wide_scale_mean_160_channels"] = {  # three tiles of 64, two of 128: partials, then their fold
    "producer": {"op": "conv2d", "in_channels": 24, "out_channels": 160, "kernel_size": 3, "padding": 1},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "mean", "dim": 1}, {"op": "relu"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 24, 19, 37]]}
EXTRA["conv3d_wide_bn_relu_map"] = {
    "producer": {"op": "conv3d", "in_channels": 16, "out_channels": 80, "kernel_size": 3, "padding": [0, 1, 1]},
    "epilogue": [{"op": "batch_norm"}, {"op": "relu"}, {"op": "mul", "by": "s"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 16, 5, 9, 21]]}
EXTRA["convt3d_wide_mixed_strides_instancenorm_mean_channels"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 32, "out_channels": 72, "kernel_size": [3, 2, 4],
                 "stride": [1, 3, 2], "padding": [3, 0, 1], "output_padding": [0, 2, 1]},
    "epilogue": [{"op": "instance_norm", "affine": True}, {"op": "relu"}, {"op": "mean", "dim": 1}],
    "shapes": [[2, 32, 9, 5, 7]]}

# wide_main where the chain pools after a convolution of one class (a box is a brick of whole windows,
# pooled through shared memory). Without a norm: a 3-D max pool written, its pooled rows (50 windows)
# longer than a box holds at bm 128 (bricks along w); an overlapping average pool, then a spatial mean;
# a strided convolution whose pool's stride skips outputs. After group norm (gemm_wide_recompute): a
# stride-1 transposed convolution (its forward form) and a window one output deep. The older pooled
# chains above (conv3d_wide_stride_instancenorm_maxpool, conv3d_wide_bn_maxpool_gap) now offer it too.
EXTRA["conv3d_wide_relu_maxpool_long_rows"] = {
    "producer": {"op": "conv3d", "in_channels": 20, "out_channels": 72, "kernel_size": 3, "padding": 1},
    "epilogue": [{"op": "relu"}, {"op": "max_pool", "kernel_size": 2}],
    "shapes": [[2, 20, 5, 9, 101]]}
EXTRA["conv2d_wide_scale_avgpool_overlap_gap"] = {
    "producer": {"op": "conv2d", "in_channels": 24, "out_channels": 80, "kernel_size": 3},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "avg_pool", "kernel_size": 3, "stride": 2}, {"op": "add", "by": 0.1},
                 {"op": "adaptive_avg_pool"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 24, 37, 41]]}
EXTRA["conv2d_wide_stride2_avgpool_skip_relu"] = {
    "producer": {"op": "conv2d", "in_channels": 16, "out_channels": 96, "kernel_size": 5, "stride": 2, "padding": 2},
    "epilogue": [{"op": "avg_pool", "kernel_size": 2, "stride": 3}, {"op": "relu"}],
    "shapes": [[2, 16, 45, 52]]}
EXTRA["convt3d_wide_stride1_groupnorm_maxpool_clamp"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 24, "out_channels": 80, "kernel_size": 3, "padding": 1},
    "epilogue": [{"op": "group_norm", "groups": 8}, {"op": "max_pool", "kernel_size": [1, 2, 2]},
                 {"op": "clamp", "min": -0.5, "max": 0.5}],
    "shapes": [[2, 24, 5, 9, 11]]}
# After eval-mode batch norm (finalize's map from the running statistics, then wide_main, the
# convolution once): bricks of a max pool, and a strided transposed convolution's classes reduced over
# the channels. Verification moves every norm off its identity (evaluate._perturb_norms).
EXTRA["conv2d_wide_bneval_relu_maxpool"] = {
    "producer": {"op": "conv2d", "in_channels": 24, "out_channels": 72, "kernel_size": 3, "padding": 1, "bias": False},
    "epilogue": [{"op": "batch_norm", "training": False}, {"op": "relu"}, {"op": "max_pool", "kernel_size": 2}],
    "shapes": [[2, 24, 19, 23]]}
EXTRA["convt3d_wide_stride2_bneval_min_channels"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 24, "out_channels": 80, "kernel_size": 3, "stride": 2,
                 "padding": 1, "output_padding": 1},
    "epilogue": [{"op": "batch_norm", "training": False}, {"op": "clamp", "min": -0.5}, {"op": "min", "dim": 1}],
    "shapes": [[2, 24, 5, 6, 7]]}
# wide_main where the chain pools after a strided transposed convolution: each class's outputs among a
# brick's windows multiplied in turn and folded into the windows in shared memory. A max pool whose
# windows hold one output of each of the 8 classes, its pooled rows (37 windows) longer than some
# bricks hold, a learnable scale after it; an overlapping average pool (windows of 3 at stride 2:
# each class 1 to 4 times in a window) then a spatial mean; strides 2, 1 and 3 under overlapping max
# windows of 3 at stride 2 (along w, 1 or 2 outputs of a class in a window, or none) and a scale of
# either sign before them. After instance norm of mixed strides (gemm_wide_recompute):
# convt3d_wide_mixed_strides_instancenorm_maxpool above, whose classes (1 x 3 x 2) leave windows
# with none of some.
EXTRA["convt3d_wide_stride2_relu_maxpool_scale"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 24, "out_channels": 40, "kernel_size": 3, "stride": 2,
                 "padding": 1, "output_padding": 1},
    "epilogue": [{"op": "relu"}, {"op": "max_pool", "kernel_size": 2}, {"op": "mul", "by": "s"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 24, 5, 6, 37]]}
EXTRA["convt3d_wide_stride2_avgpool_overlap_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 16, "out_channels": 72, "kernel_size": 4, "stride": 2,
                 "padding": 1},
    "epilogue": [{"op": "avg_pool", "kernel_size": 3, "stride": 2}, {"op": "adaptive_avg_pool"}, {"op": "add", "by": 0.1}],
    "shapes": [[2, 16, 5, 7, 6]]}
EXTRA["convt3d_wide_stride213_maxpool3_gap"] = {
    "producer": {"op": "conv_transpose3d", "in_channels": 16, "out_channels": 72, "kernel_size": [2, 3, 4],
                 "stride": [2, 1, 3], "padding": [0, 1, 1]},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "max_pool", "kernel_size": 3, "stride": 2},
                 {"op": "adaptive_avg_pool"}, {"op": "add", "by": 0.25}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[2, 16, 5, 9, 4]]}

# logsumexp over channels (a two-float accumulator: a running max and a sum of exponentials), in
# channel_reduce contiguous and channels-last (producer.layout), mostly at shapes no vector width divides:
# 18 channels (the channels-last lanes fall back to one channel each), a learnable scale before it and
# keepdim; after group norm, where gemm_store also feeds channel_reduce its output in half precision and
# gemm_main and gemm_cluster reduce it inside; a 3-D chain of 80 channels after instance norm (gemm_wide's
# statistics pass, then channel_reduce); a strided convolution of 16 channels (direct_main, gemm_main).
EXTRA["conv2d_scale_logsumexp_channels_keepdim_relu"] = {
    "producer": {"op": "conv2d", "in_channels": 5, "out_channels": 18, "kernel_size": 3, "padding": 1},
    "epilogue": [{"op": "mul", "by": "s"}, {"op": "logsumexp", "dim": 1, "keepdim": True}, {"op": "relu"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 5, 13, 17]]}
EXTRA["conv2d_groupnorm_logsumexp_channels_add"] = {
    "producer": {"op": "conv2d", "in_channels": 8, "out_channels": 24, "kernel_size": 3},
    "epilogue": [{"op": "group_norm", "num_groups": 4}, {"op": "logsumexp", "dim": 1}, {"op": "add", "by": 0.5}],
    "shapes": [[2, 8, 18, 22]]}  # 16 x 20 positions: the vector path (the others' odd planes take the scalar one)
EXTRA["conv3d_wide_instancenorm_logsumexp_channels"] = {
    "producer": {"op": "conv3d", "in_channels": 16, "out_channels": 80, "kernel_size": 3},
    "epilogue": [{"op": "instance_norm"}, {"op": "leaky_relu", "negative_slope": 0.1}, {"op": "logsumexp", "dim": 1}],
    "shapes": [[2, 16, 5, 7, 9]]}
EXTRA["conv2d_strided_scale_logsumexp_channels"] = {
    "producer": {"op": "conv2d", "in_channels": 6, "out_channels": 16, "kernel_size": 3, "stride": 2, "padding": 1},
    "epilogue": [{"op": "mul", "by": -0.5}, {"op": "logsumexp", "dim": 1}],
    "shapes": [[2, 6, 23, 29]]}
# softmax and log_softmax over channels (channel_softmax: logsumexp's accumulator, then each value), contiguous
# and channels-last: an odd plane and 18 channels with a scale after it; after group norm at a plane the vector
# path takes (gemm_store's stored output too); a 3-D chain of 80 channels after instance norm (gemm_wide).
EXTRA["conv2d_softmax_channels_scale"] = {
    "producer": {"op": "conv2d", "in_channels": 5, "out_channels": 18, "kernel_size": 3, "padding": 1},
    "epilogue": [{"op": "softmax", "dim": 1}, {"op": "mul", "by": "s"}],
    "parameters": {"s": {"init": "randn"}},
    "shapes": [[3, 5, 13, 17]]}
EXTRA["conv2d_groupnorm_log_softmax_channels"] = {
    "producer": {"op": "conv2d", "in_channels": 8, "out_channels": 24, "kernel_size": 3},
    "epilogue": [{"op": "group_norm", "num_groups": 4}, {"op": "relu"}, {"op": "log_softmax", "dim": 1}],
    "shapes": [[2, 8, 18, 22]]}
EXTRA["conv3d_wide_instancenorm_softmax_channels"] = {
    "producer": {"op": "conv3d", "in_channels": 16, "out_channels": 80, "kernel_size": 3},
    "epilogue": [{"op": "instance_norm"}, {"op": "softmax", "dim": 1}],
    "shapes": [[2, 16, 5, 7, 9]]}

SPECS = {name: parse_config({"name": name, **raw}, f"<{name}>") for name, raw in EXTRA.items()}
IMPLS = [impl for impl, world in WORLDS.items() if not world.runs_reference]  # every world with kernels of its own (or cuDNN's)
#: (impl, chain) for every chain whose plan offers the impl: one test each, so a run can take a part
#: of them (-k), and a failure names its chain.
OFFERED = [(impl, name) for impl in IMPLS for name, spec in SPECS.items() if impl in make_plan(spec).impl_stages]


def test_every_world_has_chains_beyond_the_seeds():
    assert {impl for impl, _ in OFFERED} == set(IMPLS)
    # the chains written for a world still reach it (a plan that stopped offering it drops the test)
    assert {("gemm_wide", name) for name in EXTRA if "_wide_" in name} <= set(OFFERED)
    assert {("gemm_wide_recompute", name) for name in ("conv3d_wide_bn_relu_map", "conv3d_wide_bn_maxpool_gap",
            "convt3d_wide_stride1_groupnorm_maxpool_clamp", "convt3d_wide_mixed_strides_instancenorm_maxpool")} <= set(OFFERED)


def _covering(space, facts, impl: str | None = None) -> list:
    """Feasible candidates that between them run every compiled variant and every run-time choice
    of every stage that can run here, in each world the plan offers or in ``impl``'s alone (greedy:
    the sum of the stages' spaces, not their product)."""
    covered, out = set(), []
    for candidate in space.all({"producer.impl": impl} if impl else None):
        if space.violations(candidate, facts):
            continue
        # Keyed by world: a stage shared by two worlds may run other code in each (gemm_stats also
        # writes extremes for gemm_extrema, the convolution output for gemm_store).
        world = candidate.get("producer.impl", "cudnn")
        parts = {(world, f.family, p.name, candidate[f"{f.family}.{p.name}"]) for f in space.active(candidate)
                 for p in f.params if not p.compile_time}
        parts |= {(world, f.family, repr(sorted((p.name, candidate[f"{f.family}.{p.name}"]) for p in f.compile_params)))
                  for f in space.active(candidate)}
        if not parts <= covered:
            covered |= parts
            out.append(candidate)
    return out


def _tf32_refused_where_eager_is_exact(candidate, outcome) -> bool:
    """Verification bounds a candidate's error by a multiple of eager PyTorch's own. At some shapes
    cuDNN picks a convolution without TF32; the tensor-core kernels, TF32 by design, are then rightly
    refused there, which is not a fault of the kernels so long as their error is TF32's: within the
    same multiple of what eager's error would be on input and weights rounded to TF32."""
    return (candidate["producer.impl"].startswith("gemm") and outcome["status"] == "wrong_result"
            and outcome.get("eager_error_rel", 1.0) < outcome.get("tf32_error_rel", 0.0) / 2
            and outcome["error_rel"] <= ERROR_RATIO * outcome["tf32_error_rel"]
            and outcome["error_max"] <= ERROR_RATIO * outcome["tf32_error_max"])


@pytest.mark.parametrize("impl,name", OFFERED, ids=[f"{impl}-{name}" for impl, name in OFFERED])
def test_families_beyond_the_seeds(impl, name, cache, worker):
    """Every compiled variant of every stage of a world verifies on a chain and shape the seeds do not
    cover (the module is built once for all its worlds: the cache is the test module's)."""
    machine = Machine.detect()
    spec = SPECS[name]
    plan = make_plan(spec)
    (built,) = build_many([render(plan)], cache, arch=machine.capability)
    assert built.ok, built.log
    bench = GpuBenchmarker(plan, spec.shapes[0], cache, machine, worker, echo=print)
    bench.prepare()
    space = plan_space(plan)
    from fusetune.search import shape_facts
    facts = shape_facts(spec, plan, spec.shapes[0], machine.capability)
    failures, verified, refused, refusal = [], 0, 0, ""
    started, in_worker = time.perf_counter(), 0.0
    for candidate in _covering(space, facts, impl):
        outcome = bench.verify(candidate)
        verified += 1
        in_worker += outcome.get("verify_s", 0.0)
        if _tf32_refused_where_eager_is_exact(candidate, outcome):
            refused += 1
            refusal = (f"eager's own error here is {outcome['eager_error_rel']:.1e} (no TF32), one kernel's "
                       f"{outcome['error_rel']:.1e}, eager's on TF32-rounded operands {outcome['tf32_error_rel']:.1e}")
        elif outcome["status"] != "ok":
            failures.append((candidate_key(candidate), outcome))
    # Where a test's time goes: the kernels' runs and comparisons in the worker, or around them.
    print(name, plan.describe(), verified, f"{impl} variants verified in {time.perf_counter() - started:.1f} s, "
          f"{in_worker:.1f} s of it verifying in the worker")
    if refused:
        print(f"  {name}: {refused} TF32 candidates refused, as they should be: {refusal}")
    assert verified > 0, (name, impl)
    assert not failures, failures[:5]


@pytest.mark.parametrize("impl", [name for name, world in WORLDS.items() if world.computes_conv_inside])
@pytest.mark.parametrize("config", SEEDS, ids=lambda p: p.stem)
def test_inside_kernels_at_seed_shapes(config, impl, cache, worker):
    """Every variant with the convolution inside the kernels (on CUDA cores: direct; on tensor cores:
    gemm) verifies at the seed's own (large) shape; prints its time beside cuDNN's."""
    spec = load_config(config)
    plan = make_plan(spec)
    if impl not in plan.impl_stages:
        pytest.skip(f"{spec.name}: the plan offers no {impl} kernels")
    machine = Machine.detect()
    from fusetune.search import shape_facts
    shape = spec.shapes[0]
    space = plan_space(plan)
    bench = GpuBenchmarker(plan, shape, cache, machine, worker, echo=print)
    bench.prepare()
    inside = _covering(space, shape_facts(spec, plan, shape, machine.capability), impl)
    if not inside and impl == "gemm_cluster":  # offered by the plan, but a sample's output is too large here
        pytest.skip(f"{spec.name}: a sample's output at {shape} does not fit a cluster's shared memory")
    assert inside
    failures, times = [], {}
    for candidate in inside:
        outcome = bench.evaluate(candidate)
        if outcome["status"] != "ok":
            failures.append((candidate_key(candidate), outcome))
        else:
            times[candidate_key(candidate)] = outcome["time_ms"]
    cudnn = bench.evaluate(space.default())
    best = min(times.items(), key=lambda kv: kv[1]) if times else None
    print(f"{spec.name} {shape}: {len(inside)} {impl} variants, best {best}; cuDNN default {cudnn.get('time_ms')}")
    assert not failures, failures[:3]


def test_fault_injection(cache, monkeypatch):
    """Bad variants (out of bounds, endless loop, no compile, wrong values, bad launch) cost only themselves."""
    monkeypatch.setenv("FUSETUNE_TEMPLATE_PATH", str(ROOT / "tests" / "fault_templates"))
    spec = parse_config({"name": "fault_injection",
                         "producer": {"op": "conv3d", "in_channels": 3, "out_channels": 5, "kernel_size": 3},
                         "epilogue": [{"op": "mul", "by": 0.5}, {"op": "relu"}],
                         "shapes": [[2, 3, 9, 11, 13]]}, "<fault>")
    # The worlds that compute the convolution inside refuse a main family they do not implement: cuDNN's alone.
    plan = dataclasses.replace(make_plan(spec), family="fault_map")
    assert set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}
    machine = Machine.detect()
    with Worker() as worker:
        result = tune_shape(spec, spec.shapes[0], cache, machine,
                            _bench_factory(cache, machine, worker, job_timeout=20), trials=12, plan=plan)
        restarts = worker.restarts
    entry = cache.load(result.key)
    by_fault = {o["candidate"]["fault_map.fault"]: o["status"] for o in entry.outcomes.values()}
    print("outcomes:", by_fault, "worker restarts:", restarts)
    logs = {o["candidate"]["fault_map.fault"]: o.get("log", "")[-3000:] for o in entry.outcomes.values()}
    for fault, log in logs.items():
        print(f"--- {fault}: {log}")
    assert by_fault == {"none": "ok", "oob_write": "crash", "spin": "timeout", "compile_error": "compile_error",
                        "wrong_value": "wrong_result", "launch_error": "launch_error"}, logs
    assert result.status == "tuned" and result.candidate["fault_map.fault"] == "none"
    assert restarts >= 2  # the crash and the hang each cost one worker


def test_bench_profiles_each_epilogue_kernel(cache):
    """`fusetune bench` reports the epilogue's kernels one by one: the profiler sees the statistics
    and finalize kernels of a batch-norm chain under their names, each with its time per forward."""
    from fusetune.bench import kernel_rows, profile_kernels_ms
    from fusetune.build import build_and_load

    spec = load_config(ROOT / "configs" / "convt3d_scale_batchnorm_gap.yaml")
    shape = tuple(spec.shapes[-1])
    generated = build_and_load(render(make_plan(spec)), cache, Machine.detect().capability)
    fused = generated.ModelNew().cuda()
    x = torch.rand(shape, device="cuda")
    with torch.no_grad():
        y = fused.produce(x)
    times = profile_kernels_ms(lambda: fused.epilogue(y), reps=5)
    assert set(times) == {"ft_stats_kernel", "ft_finalize_kernel"}, times
    assert all(0 < ms < 10 for ms in times.values())
    rows = kernel_rows(times, make_plan(spec), shape, bandwidth_gbs=1000.0)
    assert {r["kernel"]: r["bytes"] is None for r in rows} == {"ft_stats_kernel": False, "ft_finalize_kernel": True}


def test_a_shape_beyond_a_kernels_shared_memory_is_refused_by_name(cache):
    """A launcher that cannot take a shape says why (FT_TOO_BIG, described by the binding), not
    "invalid argument": spectral_stats' weights kernel holds its twiddle tables and one row of its
    second stage in 48 KB, which an output 1406 wide with 7 x 7 taps a plane exceeds (the tables and
    first stage alone take 49.6 KB; at 1206 wide one row still fits, and the shape runs)."""
    from fusetune.build import build_and_load

    spec = parse_config({"name": "wide_spectral", "producer": {"op": "conv_transpose3d", "in_channels": 1,
                                                               "out_channels": 2, "kernel_size": [1, 7, 7]},
                         "epilogue": [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
                         "shapes": [[2, 1, 1, 2, 1400]]}, "<wide_spectral>")
    plan = make_plan(spec)
    assert ("spectral" in plan.impl_stages)
    generated = build_and_load(render(plan), cache, Machine.detect().capability)
    fused = generated.ModelNew(variant={"producer": {"impl": "spectral"}}).cuda()
    with pytest.raises(RuntimeError, match="more shared memory"):
        fused(torch.rand(spec.shapes[0], device="cuda"))
