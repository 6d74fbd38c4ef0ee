"""What several worlds read of a region: the chain's shape facts and the fits of the kernel families
that more than one world builds on (the whole-weights tensor-core kernels under gemm, gemm_extrema,
gemm_store and gemm_cluster; the K-tiled ones under gemm_wide and gemm_wide_recompute)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fusetune.dtypes import DTYPES
from fusetune.ops.reduce import KERNEL_MODES
from fusetune.ops.reductions import REDUCTIONS
from fusetune.tiles import BOX_HEIGHTS, WIDE_BN, WIDEST_BOX, gemm_refusal as _gemm_geometry_refusal, wide_fits

if TYPE_CHECKING:
    from fusetune.plan import Plan

#: The stages that compute the convolution inside themselves.
CONV_STAGES = ("direct_stats", "direct_main", "gemm_stats", "gemm_main", "gemm_cluster", "wide_stats", "wide_main")
#: Why the worlds that compute the convolution inside the kernels refuse a padded pool.
PADDED_POOL = "a padded pool (the kernels that compute the convolution pool whole unpadded windows of their boxes)"
#: Why they refuse a dilated max pool (its window's inputs are dilation apart: not a cell of their boxes).
DILATED_POOL = "a dilated pool (the kernels that compute the convolution pool whole undilated windows of their boxes)"
#: Why they refuse an adaptive pool whose windows differ in size at the config's shapes (ops/pool.py's
#: ADAPTIVE_BOUNDS): where they are one window there, they take it as that window (Plan.adaptive_window).
ADAPTIVE_POOL = ("an adaptive pool whose windows differ in size at the config's shapes (the kernels that compute "
                 "the convolution pool fixed windows of their boxes; window_map and plane_reduce, on its output, "
                 "pool PyTorch's windows at any shape)")
#: The stages that pool fixed windows of their boxes (FT_KD.. of common.cuh.j2): a world with one of them takes an
#: adaptive pool only as the one window it is at the config's shapes, exact there only (Plan.at_shapes_worlds).
FIXED_WINDOW_STAGES = ("direct_main", "gemm_main", "gemm_cluster", "extrema_map", "wide_main")
#: The dtypes of the whole-weights tensor-core kernels (gemm_stats, gemm_main, gemm_cluster) and so of the
#: worlds built on them: float32 on TF32 MMAs, float16 and bfloat16 on FP16/BF16 MMAs (m16n8k16), the
#: products accumulated, the statistics and the chain computed in float either way.
GEMM_DTYPES = ("float32", "float16", "bfloat16")
#: The half dtypes the tensor-core kernels (whole-weights and K-tiled) multiply as they are (World.native_mma).
GEMM_NATIVE_MMA = ("float16", "bfloat16")
#: The dtypes of the K-tiled tensor-core kernels (wide_stats, wide_main) and so of gemm_wide and
#: gemm_wide_recompute: float32 on TF32 MMAs (split TF32 under precision ieee); float16 and bfloat16 kept in
#: the dtype in their workspace (the padded input and the packed weights, a channel pair a word) and
#: multiplied on FP16/BF16 MMAs (m16n8k16), accumulating in float; statistics and chain in float either way.
WIDE_DTYPES = ("float32", "float16", "bfloat16")
#: The norms whose statistics lie within one sample, so that one thread-block cluster can hold them.
SAMPLE_SCOPES = ("instance", "group")
#: The main families whose ends the kernels that compute the convolution inside implement (direct_main,
#: gemm_main and wide_main each take these three); another main family (one a test injects, one added
#: later) gets none of them until they learn that family's end.
INSIDE_FAMILIES = ("window_map", "plane_reduce", "channel_reduce")
#: The reduction modes of each kernel family that reduces (how each is computed: fusetune/ops/reductions.py).
#: The kernels that reduce over the channels one thread a position, in one loop, take every mode of that
#: table (channel_reduce, and direct_main, gemm_main and gemm_cluster's channel reductions; a logsumexp over
#: space is never planned, regions.py); wide_main, whose blocks reduce tiles of channels that a second
#: kernel merges through one float a tile, and plane_reduce, the four of one float accumulator. A world
#: with a stage that lacks the region's mode does not take the region (reduce_mode_refusal, World.refusal).
STAGE_REDUCE_MODES: dict[str, tuple[str, ...]] = {
    "channel_reduce": tuple(REDUCTIONS), "direct_main": tuple(REDUCTIONS), "gemm_main": tuple(REDUCTIONS),
    "gemm_cluster": tuple(REDUCTIONS), "plane_reduce": KERNEL_MODES, "wide_main": KERNEL_MODES}
#: The stages that apply a norm's map A*v + B to the chain's values (not the statistics passes, not finalize).
NORM_MAP_STAGES = ("window_map", "plane_reduce", "channel_reduce", "channel_softmax", "extrema_map", "direct_main",
                   "gemm_main", "wide_main", "gemm_cluster")
#: Those that also apply a layer norm's per-element weight and bias after it (Norm.element_affine), indexing
#: them by the value's position in its plane; the others read the map per (sample, channel) plane alone. A
#: world with one of the others does not take such a norm (element_affine_refusal, World.refusal). The main
#: families among them are those a region with such a norm may end in (plan.py; direct_main and gemm_main
#: apply it in those two modes).
ELEMENT_AFFINE_STAGES = ("window_map", "plane_reduce", "direct_main", "gemm_main")
#: Those that have the convolution's output at a value's position where they apply the chain after the norm
#: (the mid chain), so that an op there may read it (``by: producer``): the cuDNN world's main kernels load
#: it, direct_main and gemm_main compute it there, gemm_cluster keeps it in shared memory, and wide_main
#: (gemm_wide_recompute) computes it again. Not extrema_map: it maps a window's largest and smallest values
#: alone. A world
#: with a stage that applies a norm's map and is not here does not take such a chain (producer_refusal).
PRODUCER_STAGES = ("window_map", "plane_reduce", "channel_reduce", "channel_softmax", "direct_main", "gemm_main",
                   "wide_main", "gemm_cluster")
#: The stages that store the region's output, applying its last chain to each element there (ft_post where no
#: reduction follows, ft_final after one; finalize where it computes the output from the statistics).
OUTPUT_STAGES = NORM_MAP_STAGES + ("finalize",)
#: Those that read an extra input (Plan.extra, ``by: NAME`` of ``inputs:``) at each element's stored index
#: (``a.extra[o]`` beside ``a.out[o]``: post_call and final_call in codegen). wide_main among them: its unpooled
#: map hands ft_wide_chain each accumulator's stored index (clamped in bounds where the value is dropped), its
#: pooled map and channel reduction their stores' (plan.INPUT_SLOTS keeps the op off its partials). Every output
#: stage reads it today; a world with an output stage that is not here does not take such a region
#: (input_refusal, World.refusal), so a new output stage must join this list once it reads the input.
INPUT_STAGES = ("window_map", "plane_reduce", "channel_reduce", "channel_softmax", "extrema_map", "finalize",
                "direct_main", "gemm_main", "gemm_cluster", "wide_main")
#: Largest convolution weight (floats) the direct kernels take: they keep it in constant memory (64 KB).
DIRECT_MAX_WEIGHTS = 12288
#: Channel counts a direct channel reduction takes: a thread holds every channel (ct == C), so C must
#: be one of direct_main.yaml's ct choices (and 32 at most: registers).
DIRECT_CHANNEL_REDUCE_TILES = (2, 4, 8, 16, 32)


def stages_of(plan: Plan, stats: str, main: str | None) -> tuple[str, ...]:
    """Launch order of a world of two passes: its statistics pass (where a norm needs one), finalize
    (any norm), its main kernel (where the chain leaves one to run, and the world has one)."""
    stages: list[str] = []
    if plan.needs_stats:
        stages.append(stats)
    if plan.norm is not None:
        stages.append("finalize")
    if plan.family is not None and main is not None:
        stages.append(main)
    return tuple(stages)


def reduce_mode_refusal(plan: Plan, stages: tuple[str, ...]) -> str | None:
    """Why these stages do not compute the region's reduction (STAGE_REDUCE_MODES), None where they do
    or where a main kernel does not reduce (finalize's mean from the statistics included)."""
    if plan.reduce is None or plan.family is None:
        return None
    for stage in stages:
        modes = STAGE_REDUCE_MODES.get(stage, tuple(REDUCTIONS))
        if plan.reduce.mode not in modes:
            return f"a {plan.reduce.mode} reduction ({stage} reduces by {', '.join(modes)})"
    return None


def _lacking(stages: tuple[str, ...], able: tuple[str, ...]) -> str | None:
    """The first of ``stages`` that applies a norm's map and is not among ``able`` (those that also do what
    the region asks of that map), None where every such stage is."""
    return next((stage for stage in stages if stage in NORM_MAP_STAGES and stage not in able), None)


def element_affine_refusal(plan: Plan, stages: tuple[str, ...]) -> str | None:
    """Why these stages do not apply the region's norm, None where they do: a layer norm's per-element
    weight and bias (Norm.element_affine) need a main stage of ELEMENT_AFFINE_STAGES."""
    stage = _lacking(stages, ELEMENT_AFFINE_STAGES) if plan.norm is not None and plan.norm.element_affine else None
    return None if stage is None else (
        f"a {plan.norm.kind}'s per-element affine (elementwise_affine): {stage} applies the norm's map per "
        f"(sample, channel) plane only (by position: {', '.join(ELEMENT_AFFINE_STAGES)})")


def producer_refusal(plan: Plan, stages: tuple[str, ...]) -> str | None:
    """Why these stages do not apply the region's chain after its norm, None where they do: an op there that
    reads the convolution's output (by: producer) needs a main stage of PRODUCER_STAGES."""
    stage = _lacking(stages, PRODUCER_STAGES) if any(op.uses_producer() for op in plan.mid) else None
    return None if stage is None else (
        f"an op after the norm that reads the convolution's output (by: producer): {stage} does not have it at a "
        f"value's position (those that do: {', '.join(PRODUCER_STAGES)})")


def input_refusal(plan: Plan, stages: tuple[str, ...]) -> str | None:
    """Why these stages do not read the region's extra input (Plan.extra) where they store, None where they do
    (or where the region reads none): each output stage must be one of INPUT_STAGES."""
    if getattr(plan, "extra", None) is None:
        return None
    stage = next((s for s in stages if s in OUTPUT_STAGES and s not in INPUT_STAGES), None)
    return None if stage is None else (
        f"an op that reads input '{plan.extra}' (by: {plan.extra}): {stage} does not read it where it stores the "
        f"output (those that do: {', '.join(INPUT_STAGES)})")


def fixed_window_refusal(plan: Plan) -> str | None:
    """Why kernels that pool whole fixed windows of their boxes do not take the region's pool: PADDED_POOL
    where it pads, DILATED_POOL where it dilates, ADAPTIVE_POOL where an adaptive pool's windows differ in size
    at the config's shapes; None where it has none, a fixed unpadded undilated one (an average's
    divisor_override is their divisor: pool.j2's reciprocal), or an adaptive one that is one window there
    (Plan.adaptive_window: exact at those shapes only, Plan.at_shapes_worlds)."""
    if plan.pool_output is not None and plan.adaptive_window is None:
        return ADAPTIVE_POOL
    if any(plan.pool_padding):
        return PADDED_POOL
    return DILATED_POOL if plan.pool_dilation != (1, 1, 1) else None


def unknown_family(plan: Plan, kernels: str) -> str | None:
    """Why kernels that implement INSIDE_FAMILIES' ends do not take the region's main family, None
    where they do (or where finalize computes the output)."""
    if plan.family is None or plan.family in INSIDE_FAMILIES:
        return None
    return f"a chain that ends in {plan.family}, a main family {kernels} do not implement"


def direct_refusal(plan: Plan) -> str | None:
    """Why the direct kernels (CUDA cores) do not take the region, None where they do: whole unpadded
    windows, a main family they implement, weights in constant memory, output channels in pairs, and
    for a channel reduction every channel of a position in one thread's registers; dilation 1, one
    group, symmetric padding (producers.geometry_refusal)."""
    producer = plan.spec.producer
    refusal = fixed_window_refusal(plan) or unknown_family(plan, "the direct kernels") or producer.inside_refusal()
    if refusal is not None:
        return refusal
    weights = producer.in_channels * producer.out_channels * math.prod(producer.kernel_size)
    if weights > DIRECT_MAX_WEIGHTS:
        return f"{weights} weights (constant memory holds {DIRECT_MAX_WEIGHTS})"
    if producer.out_channels % 2 != 0:
        return f"{producer.out_channels} output channels (an even count)"
    if plan.family == "channel_reduce" and producer.out_channels not in DIRECT_CHANNEL_REDUCE_TILES:
        over = ", ".join(map(str, DIRECT_CHANNEL_REDUCE_TILES))
        return f"its channel reduction takes {over} channels, not {producer.out_channels}"
    return None


def gemm_windows(plan: Plan) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """The (window, stride) cells the tensor-core kernels' boxes hold: single outputs (the statistics
    pass), whole pooling windows (the main kernel)."""
    return [((1, 1, 1), (1, 1, 1)), plan.pool_window]


def gemm_elem(plan: Plan) -> int:
    """Bytes of the region's tensor elements: the whole-weights tensor-core kernels stage them as they
    are and multiply them in TF32 (4) or in FP16/BF16 (2), with geometry to match (tiles.MMAS)."""
    return DTYPES[plan.spec.dtype].bytes


#: float32's precision (config.PRECISIONS) -> the TF32 terms each operand of a tensor-core product is taken
#: as: one under tf32 (rounded to TF32), two under ieee (hi + lo, split TF32: three MMAs a product).
TF32_TERMS = {"tf32": 1, "ieee": 2}


def gemm_terms(plan: Plan) -> int:
    """TF32 terms per staged weight of the whole-weights tensor-core kernels (gemm.cuh.j2's FT_GW_TERM):
    2 under precision ieee, else 1 (TF32; the half types multiply as they are)."""
    precision = plan.spec.precision
    return TF32_TERMS.get(precision, 1) if gemm_elem(plan) == 4 else 1


def gemm_refusal(plan: Plan) -> str | None:
    """Why the whole-weights tensor-core kernels (gemm_stats, gemm_main) do not take the region's
    convolution, None where they do (tiles.gemm_refusal: not transposed, channels in tiles of 8 and at
    most 64, weights and boxes within the shared memory); every world that builds on them asks."""
    return (fixed_window_refusal(plan) or unknown_family(plan, "the tensor-core kernels")
            or _gemm_geometry_refusal(plan.spec.producer.geometry(), gemm_windows(plan), gemm_elem(plan),
                                          gemm_terms(plan)))


def windows_in_boxes(plan: Plan) -> bool:
    """Whether the tensor-core kernels' statistics boxes (single outputs, gemm_stats.yaml's th and tw)
    can hold the pooling windows whole: none, or windows one output deep that do not overlap and whose
    stride divides the largest boxes (so that some th and tw are multiples of it)."""
    (kd, kh, kw), (sd, sh, sw) = plan.pool_window
    return kd == sd == 1 and kh <= sh and kw <= sw and max(BOX_HEIGHTS) % sh == 0 and WIDEST_BOX % sw == 0


def pool_at_extremes(plan: Plan) -> bool:
    """Whether a max pool's value is the chain at its window's largest or smallest raw value: the
    chain up to the pool is monotone per channel (a norm's affine map, bias, mul, add, clamp, relu),
    in whichever direction each channel's runs (not a layer norm's per-element affine: one map a
    position). A kernel may then pool the raw values and apply the chain to two values a window
    instead of every output."""
    return (plan.pool is not None and plan.pool.mode == "max"
            and (plan.norm is None or not plan.norm.element_affine)  # its map differs across the window
            and all(op.monotone() for op in (*plan.pre, *plan.mid)))


def pool_increasing(plan: Plan) -> bool:
    """Whether, beyond pool_at_extremes, the chain up to the max pool is non-decreasing in every
    channel whatever its parameters (no norm with a learnable scale, no multiplication by a parameter
    or a negative number): the pool's value is then the chain at the window's largest raw value alone."""
    return (pool_at_extremes(plan) and all(op.increasing() for op in (*plan.pre, *plan.mid))
            and (plan.norm is None or not plan.norm.affine))


def wide_refusal(plan: Plan) -> str | None:
    """Why the K-tiled tensor-core kernels (wide_stats, wide_main) do not take the convolution, None
    where they do: one the whole-weights kernels do not take (more than 64 output channels, weights
    over their shared memory, or a transposed convolution: that one as a plain convolution per output
    parity class). They stage the weights a row or a plane of taps and a few input channels at a
    time, so any channel count goes (tiles.wide_fits: some variant within the shared memory). But not
    where the direct kernels take a convolution of fewer output channels than the narrowest tile of
    them (64): most of every MMA would multiply zero weights, where the direct kernels' products on the
    CUDA cores spend nothing on padding."""
    conv = plan.spec.producer.geometry()
    refusal = plan.spec.producer.inside_refusal()  # dilation, groups, asymmetric padding
    if refusal is not None:
        return refusal
    if gemm_refusal(plan) is None:
        return "the whole-weights tensor-core kernels (gemm) take this convolution"
    if direct_refusal(plan) is None and conv["cout"] < min(WIDE_BN):
        return (f"{conv['cout']} output channels fill less than a tile of {min(WIDE_BN)}, and the direct "
                "kernels take the convolution")
    if not wide_fits(conv, gemm_elem(plan), gemm_terms(plan)):
        return "no variant within the shared memory"
    return None


def wide_main_refusal(plan: Plan) -> str | None:
    """Why wide_main (the K-tiled kernel with the whole chain on its accumulators) does not take the
    region, None where it does: the convolution is one for the K-tiled kernels, and the chain ends in
    a map, a reduction over space, or one over the channels (each block over its tile of them, a small
    kernel over the tiles where there are several). Where the chain pools, a box is a brick of whole
    windows (a strided transposed convolution's output classes, which interleave within every window,
    multiplied one after another and folded into the windows). Its output never goes to memory."""
    refusal = wide_refusal(plan)
    if refusal is not None:
        return refusal
    refusal = fixed_window_refusal(plan)
    if refusal is not None:
        return refusal
    if plan.family not in INSIDE_FAMILIES:
        return f"a chain that ends in {plan.family or 'finalize'}, not a map or a reduction it implements"
    return reduce_mode_refusal(plan, ("wide_main",))


def wide_stats_refusal(plan: Plan) -> str | None:
    """Why wide_stats does not take the norm's statistics, None where it does: a norm needs them, and
    the convolution is one for the K-tiled kernels."""
    if not plan.needs_stats:
        return "no norm needs a statistics pass"
    return wide_refusal(plan)
