"""Lower an op chain to kernel stages.

Every supported chain has the canonical form

    producer -> pre* -> [norm] -> mid* -> [pool] -> post* -> [reduce] -> final*

where the starred groups are elementwise ops. A norm becomes a per-(sample, channel)
affine map ``A*v + B`` computed by a small ``finalize`` kernel from per-plane sums that
the ``stats`` kernel takes in one pass over the producer output. The main kernel family
then depends on what the chain ends with:

  * ``plane_reduce``   a reduction over all spatial dims (optionally after pooling);
  * ``channel_reduce`` a reduction over the channel dim;
  * ``window_map``     neither: a pooled (or same-size) tensor.

Where the convolution is small enough (its weights fit in constant memory), the plan also
offers the producer computed *inside* the kernels (``direct``): ``direct_stats`` takes the
norm's statistics from the convolution as it computes it, and ``direct_main`` recomputes it
tile by tile, applies the chain and pools or reduces on chip, so the convolution output is
never written. Where the channels come in whole tensor-core tiles, the plan also offers the
same two passes as implicit GEMMs on the tensor cores in TF32 (``gemm_stats``, ``gemm_main``:
see fusetune/tiles.py). Where a norm needs those two passes, the tensor cores can also compute the
convolution once: ``gemm_extrema`` (a max pool of a per-channel monotone chain: the statistics
pass also writes each window's extremes, ``extrema_map`` finishes from them) and ``gemm_store``
(the statistics pass writes the convolution output, the cuDNN world's main kernel reads it). Where
the norm's statistics lie within a sample (instance, group), one kernel on a Hopper thread-block
cluster per sample can do it all, the outputs kept on chip across the cluster (``gemm_cluster``). Where
the output is a norm's statistics alone and the producer a full transposed convolution, the plan
also offers them from spectra, the convolution never computed (``spectral``). Where a norm needs
statistics and the convolution has too many channels for those kernels (or is a transposed one,
split by output parity), a K-tiled implicit GEMM on the tensor cores takes the statistics, and
writes the output once for the main kernel where the chain goes on (``gemm_wide``: see
fusetune/tiles.py). The same K-tiled GEMM also runs a whole chain (``wide_main``; where it pools, a box is
whole windows): in the gemm_wide world where the chain
has no norm, and after wide_stats with the convolution computed again, never written
(``gemm_wide_recompute``). The search picks among the worlds (``producer.impl``).

Exact algebra the planner uses:
  * a spatial mean (or sum) right after a norm is the norm's affine map applied to the
    plane's mean, which the statistics pass already has: no main pass at all;
  * instance norm cancels a per-channel constant added before it (the producer's bias,
    through any chain of per-channel mul/div/add), so the convolution runs without bias.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from fusetune.config import ProblemSpec
from fusetune.errors import PlanError
from fusetune.ops import Add, DimReduce, Div, Elementwise, Mul, Norm, Op, Pool, Reduce
from fusetune.ops.reduce import KERNEL_MODES
from fusetune.regions import Step, rewrite
from fusetune.tiles import (BOX_HEIGHTS, WIDE_BN, WIDEST_BOX, direct_row_cells, gemm_fits, gemm_max_height,
                           gemm_refusal, wide_fits)


#: The stages that compute the convolution inside themselves.
CONV_STAGES = ("direct_stats", "direct_main", "gemm_stats", "gemm_main", "gemm_cluster", "wide_stats", "wide_main")
#: Why the worlds that compute the convolution inside the kernels refuse a padded pool.
PADDED_POOL = "a padded pool (the kernels that compute the convolution pool whole unpadded windows of their boxes)"
#: The norms the kernels compute: statistics per (sample, channel) sums (batch, group, instance) or none
#: (eval-mode batch norm's running ones).
KERNEL_SCOPES = ("batch", "group", "instance", "running")
#: The norms whose statistics lie within one sample, so that one thread-block cluster can hold them.
SAMPLE_SCOPES = ("instance", "group")
#: The main families whose ends wide_main implements (its epilogue's three branches); another main
#: family (one a test injects, one added later) gets no wide_main until it learns that family's end.
WIDE_MAIN_FAMILIES = ("window_map", "plane_reduce", "channel_reduce")


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: ProblemSpec
    pre: tuple[Elementwise, ...]
    norm: Norm | None
    mid: tuple[Elementwise, ...]
    pool: Pool | None
    post: tuple[Elementwise, ...]
    reduce: Reduce | None
    final: tuple[Elementwise, ...]
    family: str | None  # main kernel family, or None when finalize computes the output
    drop_bias: bool  # the producer's bias is cancelled exactly by the norm: never applied
    direct: bool = False  # the convolution can also run inside the kernels on CUDA cores (direct_* stages)
    gemm: bool = False  # ... and as implicit GEMMs on the tensor cores (gemm_* stages)
    gemm_th: int = 0  # the tallest box of the gemm kernels within the shared memory (tiles.gemm_max_height)
    direct_cells: int = 1  # the most pooling windows in a row a direct_main thread takes (tiles.direct_row_cells)
    head: tuple[Step, ...] = ()  # the fused region's ops, as rewritten (fusetune/regions.py)
    tail: tuple[Step, ...] = ()  # the ops after it, run in PyTorch inside ModelNew
    ends: str | None = None  # why the fused region ends before the tail (None: no tail)

    @property
    def bias_in_epilogue(self) -> bool:
        """cuDNN applies a bias as a pass of its own; the first kernel adds it for free instead."""
        return self.spec.producer.bias and not self.drop_bias

    @property
    def needs_stats(self) -> bool:
        """A statistics pass over the producer output is needed (not for eval-mode batch norm)."""
        return self.norm is not None and self.norm.scope != "running"

    def _stages(self, stats: str, main: str | None) -> tuple[str, ...]:
        """Launch order: the statistics pass, finalize (any norm), the main kernel."""
        stages: list[str] = []
        if self.needs_stats:
            stages.append(stats)
        if self.norm is not None:
            stages.append("finalize")
        if self.family is not None and main is not None:
            stages.append(main)
        return tuple(stages)

    @property
    def cudnn_stages(self) -> tuple[str, ...]:
        """Kernel families in launch order after a cuDNN convolution."""
        return self._stages("stats", self.family)

    @property
    def direct_stages(self) -> tuple[str, ...]:
        """Kernel families in launch order with the convolution inside them; empty if not offered."""
        return self._stages("direct_stats", "direct_main") if self.direct else ()

    @property
    def gemm_stages(self) -> tuple[str, ...]:
        """Kernel families in launch order with the convolution on the tensor cores; empty if not offered."""
        return self._stages("gemm_stats", "gemm_main") if self.gemm else ()

    @property
    def pool_at_extremes(self) -> bool:
        """Whether a max pool's value is the chain at its window's largest or smallest raw value:
        the chain up to the pool is monotone per channel (a norm's affine map, bias, mul, add, clamp,
        relu), in whichever direction each channel's runs. A kernel may then pool the raw values and
        apply the chain to two values a window instead of every output."""
        return (self.pool is not None and self.pool.mode == "max"
                and all(op.monotone() for op in (*self.pre, *self.mid)))

    @property
    def pool_increasing(self) -> bool:
        """Whether, beyond pool_at_extremes, the chain up to the max pool is non-decreasing in every
        channel whatever its parameters (no norm with a learnable scale, no multiplication by a
        parameter or a negative number): the pool's value is then the chain at the window's largest
        raw value alone."""
        return (self.pool_at_extremes and all(op.increasing() for op in (*self.pre, *self.mid))
                and (self.norm is None or not self.norm.affine))

    @property
    def extrema(self) -> bool:
        """Whether the tensor-core world can compute the convolution once instead of twice: its
        statistics pass also writes each pooling window's largest and smallest raw value, and a small
        kernel (extrema_map) applies the chain to those. Exact where the chain up to a max pool is
        monotone per channel (a norm's affine map, bias, mul, add, clamp, relu: the chain's max over
        a window is at the window's largest or smallest input, whatever the signs) and the windows
        lie whole in the statistics pass's boxes: one output deep, not overlapping."""
        return (self.gemm and self.needs_stats and self.family == "window_map" and self.pool_at_extremes
                and self.windows_in_boxes)

    @property
    def gemm_extrema_stages(self) -> tuple[str, ...]:
        """Stages of the convolution once on the tensor cores (see extrema); empty if not offered."""
        return self._stages("gemm_stats", "extrema_map") if self.extrema else ()

    @property
    def gemm_store_stages(self) -> tuple[str, ...]:
        """The convolution once on the tensor cores, written out: the statistics pass also stores its
        output (no bias, as cuDNN's) and the cuDNN world's main kernel reads it. It trades computing
        the convolution again for writing and reading its output: worth it where that output is
        small against the work. Offered wherever the gemm world needs both passes; empty otherwise."""
        if not (self.gemm and self.needs_stats and self.family is not None):
            return ()
        return self._stages("gemm_stats", self.family)

    @property
    def windows_in_boxes(self) -> bool:
        """Whether the tensor-core kernels' statistics boxes (single outputs, gemm_stats.yaml's th and
        tw) can hold the pooling windows whole: none, or windows one output deep that do not overlap
        and whose stride divides the largest boxes (so that some th and tw are multiples of it)."""
        (kd, kh, kw), (sd, sh, sw) = self.pool_window
        return kd == sd == 1 and kh <= sh and kw <= sw and max(BOX_HEIGHTS) % sh == 0 and WIDEST_BOX % sw == 0

    @property
    def cluster(self) -> bool:
        """Whether one kernel can do it all on a Hopper thread-block cluster (gemm_cluster): the norm's
        statistics lie within a sample (instance or group norm), so a cluster of blocks per sample
        computes the convolution once on the tensor cores, keeps every output in its blocks' shared
        memory, sums the statistics across the cluster through distributed shared memory, and
        applies the chain from there: no second pass of the convolution and no output in memory.
        Offered for a channel reduction, or a map whose pooling windows lie whole in the boxes; a
        shape fits where a sample's output fits the cluster's shared memory (tiles.cluster_boxes)."""
        return (self.gemm and self.needs_stats and self.norm.scope in SAMPLE_SCOPES
                and (self.family == "channel_reduce" or (self.family == "window_map" and self.windows_in_boxes)))

    @property
    def cluster_stages(self) -> tuple[str, ...]:
        """The one stage of gemm_cluster (see cluster); empty if not offered."""
        return ("gemm_cluster",) if self.cluster else ()

    @property
    def spectral(self) -> bool:
        """Whether the statistics can come from spectra instead of the convolution (spectral_stats).

        A transposed convolution with stride 1 and no padding is the full linear convolution of
        its input with its weights, so zero-padded to the output's size, the output's spectrum is
        the product of theirs per channel pair: U[n, c, f] = sum_ci X[n, ci, f] W[ci, c, f]. By
        Parseval's theorem a plane's sum of squares is its spectrum's (over the bin count), and its
        sum is bin 0. Where the chain is an affine pre chain, a norm, and the spatial mean that
        finalize takes from the statistics (family None), those sums are the whole output: the
        product per bin costs N * CIN * C complex multiply-adds (1.8 G for the 64->128 seed, 7.2 G
        real ones, against its 268 G in space) and the output is never computed. Not with dilation or
        groups: spectral_stats builds the weights' spectrum from contiguous taps of every channel pair
        (producers.geometry_refusal)."""
        return (self.spec.producer.is_full_transposed and self.spec.producer.inside_refusal() is None
                and self.needs_stats and self.family is None and self.pre_scale is not None)

    @property
    def spectral_stages(self) -> tuple[str, ...]:
        """Stages of the statistics from spectra (see spectral); empty if not offered."""
        return self._stages("spectral_stats", None) if self.spectral else ()

    @property
    def _wide_conv(self) -> bool:
        """Whether the K-tiled tensor-core kernels take the convolution (see _wide_refusal)."""
        return self._wide_refusal is None

    @property
    def _wide_refusal(self) -> str | None:
        """Why the K-tiled tensor-core kernels do not take the convolution, None where they do: one
        the whole-weights kernels above do not take (more than 64 output channels, weights over their
        shared memory, or a transposed convolution: that one as a plain convolution per output parity
        class). They stage the weights a row or a plane of taps and a few input channels at a time,
        so any channel count goes (tiles.wide_fits: some variant within the shared memory). But not
        where the direct kernels take a convolution of fewer output channels than the narrowest
        tile of them (64): most of every MMA would multiply zero weights (the 3 -> 16 transposed
        seed: 13.5 ms at best, against the direct kernel's 0.33, on an H200)."""
        conv = self.spec.producer.geometry()
        refusal = self.spec.producer.inside_refusal()  # dilation, groups, asymmetric padding
        if refusal is not None:
            return refusal
        if self.gemm:
            return "the whole-weights tensor-core kernels (gemm) take this convolution"
        if self.direct and conv["cout"] < min(WIDE_BN):
            return (f"{conv['cout']} output channels fill less than a tile of {min(WIDE_BN)}, and the direct "
                    "kernels take the convolution")
        if not wide_fits(conv):
            return "no variant within the shared memory"
        return None

    @property
    def wide(self) -> bool:
        """Whether the K-tiled kernel can take the statistics (wide_stats): a norm needs them, and the
        convolution is one for the K-tiled kernels. It computes the convolution once and, where a main
        kernel follows, can write it (no bias) for that kernel to read as cuDNN's."""
        return self.needs_stats and self._wide_conv

    @property
    def wide_main(self) -> bool:
        """Whether the K-tiled kernel can also run the whole chain (wide_main): the convolution is one
        for the K-tiled kernels, and the chain ends in a map, a reduction over space, or one over the
        channels (each block over its tile of them, a small kernel over the tiles where there are
        several). Where the chain pools, a box is a brick of whole windows (a strided transposed
        convolution's output classes, which interleave within every window, multiplied one after
        another and folded into the windows). The convolution output never goes to memory: for a
        chain without statistics, the convolution runs once (after eval-mode batch norm too:
        finalize's map from the running statistics first); after a norm that needs them, it runs
        again (recompute)."""
        return self._wide_main_refusal is None

    @property
    def _wide_main_refusal(self) -> str | None:
        """Why wide_main does not take the chain (see wide_main), None where it does."""
        if self._wide_refusal is not None:
            return self._wide_refusal
        if any(self.pool_padding):
            return PADDED_POOL
        if self.family not in WIDE_MAIN_FAMILIES:
            return f"a chain that ends in {self.family or 'finalize'}, not a map or a reduction it implements"
        return None

    @property
    def unoffered(self) -> dict[str, str]:
        """The worlds that run the convolution inside the kernels and are not offered, each with why:
        what ``fusetune plan`` shows, so that a chain left to cuDNN says what stands in the way."""
        padded = PADDED_POOL if any(self.pool_padding) else None
        why = {"direct": None if self.direct else padded or _direct_refusal(self.spec, self.family),
               "gemm": None if self.gemm else padded or gemm_refusal(self.spec.producer.geometry(), self.gemm_windows),
               "gemm_wide": None if self.wide_stages else self._wide_main_refusal}
        return {impl: reason for impl, reason in why.items() if reason is not None}

    @property
    def wide_kernels(self) -> bool:
        """Whether the module holds any K-tiled kernel (wide_stats or wide_main): then it needs their
        geometry, their workspace and their facts."""
        return self.wide or self.wide_main

    @property
    def wide_stages(self) -> tuple[str, ...]:
        """Stages of the K-tiled world (gemm_wide): where a norm needs statistics, wide_stats (storing
        the convolution for the cuDNN world's main kernel where the chain goes on); else wide_main (after
        finalize for eval-mode batch norm). Empty if not offered."""
        if self.wide:
            return self._stages("wide_stats", self.family)
        return self._stages("wide_stats", "wide_main") if self.wide_main else ()

    @property
    def wide_recompute_stages(self) -> tuple[str, ...]:
        """The K-tiled world computing the convolution twice (gemm_wide_recompute): wide_stats for the
        norm's statistics, then wide_main applies the chain from the convolution computed again, its
        output never written. Offered where a norm needs statistics and wide_main takes the chain."""
        return self._stages("wide_stats", "wide_main") if self.wide and self.wide_main else ()

    @property
    def impl_stages(self) -> dict[str, tuple[str, ...]]:
        """producer.impl -> its stages in launch order, for every impl the plan offers (eager, the
        reference as PyTorch runs it, always, with none)."""
        offered = {"cudnn": self.cudnn_stages, "direct": self.direct_stages, "gemm": self.gemm_stages,
                   "gemm_extrema": self.gemm_extrema_stages, "gemm_store": self.gemm_store_stages,
                   "gemm_cluster": self.cluster_stages, "gemm_wide": self.wide_stages,
                   "gemm_wide_recompute": self.wide_recompute_stages, "spectral": self.spectral_stages}
        offered = {impl: stages for impl, stages in offered.items() if impl == "cudnn" or stages}
        return {**offered, "eager": ()}  # PyTorch's own forward, no kernels: the search's floor

    def conv_passes(self, impl: str) -> int:
        """How many of an impl's stages compute the convolution (0 for cuDNN: it computes it once,
        outside the kernels)."""
        return sum(stage in CONV_STAGES for stage in self.impl_stages.get(impl, ()))

    @property
    def stages(self) -> tuple[str, ...]:
        """Every kernel family of the module (all worlds; finalize serves them all), in a fixed order."""
        ordered: list[str] = []
        for stages in self.impl_stages.values():
            ordered += [s for s in stages if s not in ordered]
        return tuple(ordered)

    @property
    def pre_scale(self) -> tuple[Elementwise, ...] | None:
        """The multiplicative ops of the pre chain where that chain is affine per channel (mul, div and
        add only), else None. Then pre(y) - pre(p) = scale * (y - p): statistics kernels may sum raw
        convolution values around a raw pivot and scale the sums once at the end."""
        if _affine(self.pre):
            return tuple(op for op in self.pre if not isinstance(op, Add))
        return None

    @property
    def half_store(self) -> bool:
        """Whether gemm_store may write its output in half precision, less each plane's pivot
        (producer.store): the pre chain is affine, so the statistics pass's MMAs start from -pivot and
        hold y - pivot, a value of the plane's spread rather than its offset; and the main kernel is
        channel_reduce, the one family that reads it so."""
        return bool(self.gemm_store_stages) and self.pre_scale is not None and self.family == "channel_reduce"

    @property
    def pool_window(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """The pooling window and stride, 3-D (a 2-D one padded with a leading 1); ones without a pool."""
        if self.pool is None:
            return (1, 1, 1), (1, 1, 1)
        pad = (1,) * (3 - self.spec.producer.spatial_dims)
        return pad + tuple(self.pool.kernel_size), pad + tuple(self.pool.stride)

    @property
    def pool_padding(self) -> tuple[int, int, int]:
        """The pool's padding, 3-D (zeros without a pool or without padding). Only the cuDNN world's
        main kernels (window_map, plane_reduce) pool padded windows: the kernels that compute the
        convolution inside them build their boxes of whole unpadded windows, so they refuse it."""
        if self.pool is None or self.pool.padding is None:
            return (0, 0, 0)
        return (0,) * (3 - self.spec.producer.spatial_dims) + tuple(self.pool.padding)

    @property
    def gemm_windows(self) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
        """The (window, stride) cells the tensor-core kernels' boxes hold: single outputs (the
        statistics pass), whole pooling windows (the main kernel)."""
        return [((1, 1, 1), (1, 1, 1)), self.pool_window]

    @property
    def param_names(self) -> tuple[str, ...]:
        """Learnable per-channel parameters the kernels read, in slot order."""
        names: list[str] = []
        for op in (*self.pre, *self.mid, *self.post, *self.final):
            for name in op.params():
                if name not in names:
                    names.append(name)
        return tuple(names)

    def fused_output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape the kernels write for an input shape: the convolution's output through the fused
        region (the whole chain's output where nothing runs after it in PyTorch)."""
        out = self.spec.producer.out_shape(shape)
        for step in self.head:
            out = step.op.out_shape(out)
        return out

    def regions(self) -> list[str]:
        """What runs where, region by region, as ``fusetune plan`` prints it: the fused region (the
        convolution and the ops the kernels take) and, where the chain goes on, what runs in PyTorch
        after it and why the kernels stop there."""
        producer = self.spec.producer.kind
        fused = ", ".join(step.where for step in self.head) or "the convolution alone"
        lines = [f"region 0 (fused kernels): {producer} -> {fused}"]
        if self.tail:
            views = all(step.op.role == "view" for step in self.tail)
            lines.append(f"region 1 (PyTorch{', a view: free' if views else ''}): "
                         + ", ".join(step.where for step in self.tail))
            lines.append(f"  why: {self.ends.split(': ', 1)[-1] if self.ends else ''}")
        return lines

    def describe(self) -> str:
        def names(ops: Sequence[Op]) -> str:
            return ",".join(op.kind for op in ops) or "-"
        direct = f" direct={'+'.join(self.direct_stages)}" if self.direct else ""
        direct += f" gemm={'+'.join(self.gemm_stages)}" if self.gemm else ""
        direct += f" cluster={'+'.join(self.cluster_stages)}" if self.cluster else ""
        direct += f" wide={'+'.join(self.wide_stages)}" if self.wide_stages else ""
        direct += f" wide_recompute={'+'.join(self.wide_recompute_stages)}" if self.wide_recompute_stages else ""
        direct += f" spectral={'+'.join(self.spectral_stages)}" if self.spectral else ""
        return (f"stages={'+'.join(self.cudnn_stages)}{direct} pre={names(self.pre)} "
                f"norm={self.norm.kind if self.norm else '-'} mid={names(self.mid)} "
                f"pool={self.pool.kind if self.pool else '-'} post={names(self.post)} "
                f"reduce={self.reduce.kind if self.reduce else '-'} final={names(self.final)} "
                f"bias={'dropped' if self.drop_bias else 'epilogue' if self.bias_in_epilogue else 'none'}")


#: Learnable per-channel parameters one module can read (FT_MAX_PARAMS in templates/args.h.j2).
MAX_PARAMS = 8
#: Largest convolution weight (floats) the direct kernels take: they keep it in constant memory (64 KB).
DIRECT_MAX_WEIGHTS = 12288
#: Channel counts a direct channel reduction takes: a thread holds every channel (ct == C), so C must
#: be one of direct_main.yaml's ct choices (and 32 at most: registers).
DIRECT_CHANNEL_REDUCE_TILES = (2, 4, 8, 16, 32)
_SLOTS = ("pre", "norm", "mid", "pool", "post", "reduce", "final")
_ROLE_SLOT = {"norm": 1, "pool": 3, "reduce": 5}


def make_plan(spec: ProblemSpec) -> Plan:
    """The fused region and what runs after it in PyTorch. Never raises for a valid config.

    After the exact rewrites (fusetune/regions.py), the longest prefix of the chain that the kernels
    take is the fused region; the rest (``tail``) runs in PyTorch inside the generated ModelNew, and
    ``ends`` says why the region stops where it does. A prefix may be empty: the kernels then compute
    the convolution (and its bias) alone, which is still a region to tune (the worlds that compute it
    inside the kernels may beat cuDNN), and its output is the convolution's, so a later op may read it
    (``by: producer``)."""
    steps = rewrite(spec)
    ends = None
    for cut in range(len(steps), -1, -1):
        head, tail = steps[:cut], steps[cut:]
        try:
            readers = [s for s in tail if s.op.uses_producer()]
            if cut and readers:
                raise PlanError(f"{spec.path}: {readers[0].where} reads the convolution's output (by: producer), "
                                "which the kernels keep only up to the first norm, pool or reduction")
            plan = _plan_region(spec, head)
        except PlanError as exc:
            ends = str(exc)
            continue
        return dataclasses.replace(plan, head=head, tail=tail, ends=_why_tail(spec, head, tail, ends))
    raise AssertionError("the empty region is always planned")  # pragma: no cover


def _why_tail(spec: ProblemSpec, head: tuple[Step, ...], tail: tuple[Step, ...], ends: str | None) -> str | None:
    """Why the kernels stop before the tail: where it starts with views (free), why its first op
    that does work could not join the region."""
    work = [i for i, step in enumerate(tail) if step.op.role != "view"]
    if not work or work[0] == 0:
        return ends
    try:
        _plan_region(spec, head + (tail[work[0]],))
    except PlanError as exc:
        return str(exc)
    return ends


def _plan_region(spec: ProblemSpec, steps: Sequence[Step]) -> Plan:
    """Sort a region's ops into the canonical slots; ``PlanError`` where the kernels cannot take them."""
    groups: dict[str, list[Op]] = {slot: [] for slot in _SLOTS}
    position = 0  # index into _SLOTS of the latest filled slot
    for step in steps:
        op = step.op
        refusal = _kernel_refusal(op)
        if refusal is not None:
            raise PlanError(f"{spec.path}: {step.where}: {refusal}")
        if op.role == "elementwise":
            position = position if _SLOTS[position] in ("pre", "mid", "post", "final") else position + 1
            if op.uses_producer() and _SLOTS[position] != "pre":
                raise PlanError(f"{spec.path}: {step.where} reads the convolution's output (by: producer) after a "
                                "norm, pool or reduction; the kernels have it only before them")
            groups[_SLOTS[position]].append(op)
            continue
        target = _ROLE_SLOT[op.role]
        if target < position or (target == position and groups[_SLOTS[target]]):
            raise PlanError(f"{spec.path}: {step.where}: the kernels fuse chains of the form elementwise* [norm] "
                            f"elementwise* [pool] elementwise* [reduce] elementwise*; a {op.role} cannot come here")
        position = target
        groups[_SLOTS[target]].append(op)
    norm = groups["norm"][0] if groups["norm"] else None
    pool = groups["pool"][0] if groups["pool"] else None
    reduce = groups["reduce"][0] if groups["reduce"] else None
    family = _family(spec, norm, groups["mid"], pool, reduce)
    pre = tuple(groups["pre"])
    plan_params = {name for step in steps if step.op.role == "elementwise" for name in step.op.params()}
    if len(plan_params) > MAX_PARAMS:
        raise PlanError(f"{spec.path}: the chain reads {len(plan_params)} learnable parameters; the kernels take "
                        f"at most {MAX_PARAMS}")
    drop_bias = (spec.producer.bias and norm is not None and norm.scope == "instance"
                 and _affine(pre))
    plan = Plan(spec=spec, pre=pre, norm=norm, mid=tuple(groups["mid"]), pool=pool,
                post=tuple(groups["post"]), reduce=reduce, final=tuple(groups["final"]),
                family=family, drop_bias=drop_bias)
    # A padded pool: the kernels that compute the convolution inside pool whole unpadded windows of
    # their boxes; the cuDNN world's main kernels (and a statistics pass before them) take it.
    unpadded = not any(plan.pool_padding)
    plan = dataclasses.replace(plan, direct=unpadded and _direct_fits(spec, family))
    gemm = unpadded and gemm_fits(spec.producer.geometry(), plan.gemm_windows)
    gemm_th = gemm_max_height(spec.producer.geometry(), plan.gemm_windows) if gemm else 0
    direct_cells = direct_row_cells(spec.producer.geometry(), *plan.pool_window) if plan.direct else 1
    return dataclasses.replace(plan, gemm=gemm, gemm_th=gemm_th, direct_cells=direct_cells)


#: Why the kernels do not take an op of a role, where no kernel family computes that role at all.
_ROLE_REFUSALS = {
    "softmax": "a softmax needs every value of its dim before it writes any; it runs in PyTorch",
    "view": "a view of the kernels' output, free in PyTorch",
    "adaptive": "adaptive pooling to a size other than 1 has windows that depend on the input's size; "
                "it runs in PyTorch",
}


def _kernel_refusal(op: Op) -> str | None:
    """Why no kernel family takes this op wherever it stands, None where one may."""
    if op.role in _ROLE_REFUSALS:
        return _ROLE_REFUSALS[op.role]
    if isinstance(op, Norm) and op.scope not in KERNEL_SCOPES:
        return f"the kernels' norms are per channel ({', '.join(KERNEL_SCOPES)}); a {op.kind} runs in PyTorch"
    if isinstance(op, Reduce) and op.mode not in KERNEL_MODES:
        return f"the kernels reduce by {', '.join(KERNEL_MODES)}; {op.mode} runs in PyTorch"
    if isinstance(op, DimReduce) and op.dims != (1,) and op.dims != (op.dim,):
        return (f"the kernels reduce over the channel dim or over every spatial dim, not dims {list(op.dims)}; "
                "it runs in PyTorch")
    return None


def _affine(ops: Sequence[Op]) -> bool:
    """Whether a chain of elementwise ops is an affine map per channel (mul, div and add by numbers or
    per-channel parameters; not by the convolution's own output)."""
    return all(isinstance(op, (Mul, Div, Add)) and not op.uses_producer() for op in ops)


def _direct_fits(spec: ProblemSpec, family: str | None) -> bool:
    return _direct_refusal(spec, family) is None


def _direct_refusal(spec: ProblemSpec, family: str | None) -> str | None:
    """Why the direct kernels do not take this producer, None where they do: weights in constant
    memory, output channels in pairs, and for a channel reduction every channel of a position in one
    thread's registers; dilation 1, one group, symmetric padding (producers.geometry_refusal)."""
    producer = spec.producer
    refusal = producer.inside_refusal()
    if refusal is not None:
        return refusal
    weights = producer.in_channels * producer.out_channels * math.prod(producer.kernel_size)
    if weights > DIRECT_MAX_WEIGHTS:
        return f"{weights} weights (constant memory holds {DIRECT_MAX_WEIGHTS})"
    if producer.out_channels % 2 != 0:
        return f"{producer.out_channels} output channels (an even count)"
    if family == "channel_reduce" and producer.out_channels not in DIRECT_CHANNEL_REDUCE_TILES:
        return f"a reduction over {producer.out_channels} channels (one of {DIRECT_CHANNEL_REDUCE_TILES})"
    return None


def _family(spec: ProblemSpec, norm: Norm | None, mid: list[Op], pool: Pool | None,
            reduce: Reduce | None) -> str | None:
    if reduce is None:
        return "window_map"
    if reduce.over == "spatial":
        if norm is not None and norm.scope != "running" and not mid and pool is None and reduce.mode in ("mean", "sum"):
            return None  # finalize applies the norm to the plane means it already has
        return "plane_reduce"
    if reduce.dim == 1:
        if pool is not None:
            raise PlanError(f"{spec.path}: the kernels do not reduce over channels after a pool; the reduction "
                            "runs in PyTorch")
        return "channel_reduce"
    raise PlanError(f"{spec.path}: the kernels reduce over the channel dim or over every spatial dim, not over "
                    f"dim {reduce.dim}; the reduction runs in PyTorch")
