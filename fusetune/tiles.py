"""The tile geometry of the kernels that compute the convolution, worked out once in Python.

The direct kernels (CUDA cores) hold a thread's inputs in registers where they fit:
``direct_footprint`` below mirrors direct.cuh.j2's FtFootprint, and the plan offers several
cells a thread only where it does.

The tensor-core (implicit GEMM) kernels:

A block of the ``gemm_*`` kernels computes the convolution over a *box*: a run of cells
(pooling windows, or single outputs) one cell deep, ``tw`` outputs wide and ``th`` high at
most (whole cells, at least one). The box's outputs are the GEMM's M rows, the output
channels its N columns, and (input channel, tap) its K. The input the box reads is staged in
shared memory once, and every (row, k) element of the A operand is a fixed offset into it:
``row offset + k offset``. Everything here is a compile-time constant of the kernels, and the
shared-memory budget decides which convolutions the kernels take at all.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

#: Shared memory the kernels may use per block (bytes): Hopper's opt-in limit is 227 KB.
SMEM_LIMIT = 200 * 1024
#: Largest staged weight tile (words, tiles.weight_words) the kernels take.
MAX_WEIGHT_FLOATS = 16384
#: Most output channels: each block holds a box's whole output (channels x rows) on chip.
MAX_CHANNELS = 64


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Mma:
    """The tensor-core kernels' MMA at an element size: float32 (4 bytes) as TF32 m16n8k8, float16 and
    bfloat16 (2 bytes) as m16n8k16, accumulating in float either way. A lane's A fragment takes K
    columns t and t + 4 of a k step of 8 (TF32), or the pairs 2t, 2t + 1 and 2t + 8, 2t + 9 of one of
    16 (FP16/BF16: two values a register); the input channels are padded to ``channels`` so that those
    columns of one k step are channels of one tap. The staged input's rows and channels start 16 bytes
    apart (``row`` elements) for the 16-byte asynchronous copies."""

    k: int  # the MMA's k: K is padded to it
    channels: int  # the input channels are padded to it
    row: int  # a staged input row is padded to it (elements: 16 bytes)
    elem: int  # bytes of a staged input value


#: Element bytes -> the MMA the tensor-core kernels multiply them with (gemm.cuh.j2).
MMAS: dict[int, Mma] = {4: Mma(k=8, channels=4, row=4, elem=4), 2: Mma(k=16, channels=8, row=8, elem=2)}


def cin_padded(cin: int, elem: int = 4, taps: int = 1) -> int:
    """Input channels rounded up to 4 (8 for 2-byte values). K runs tap-major (k = tap * channels +
    channel), so with whole groups of channels the A column a lane reads is its own channel (lane % 4,
    or the pair 2 * (lane % 4) at 2 bytes) plus a constant per k step: every A load sits at a
    compile-time offset from one pointer. ``taps`` 2 (gemm_taps: 2 bytes, at most 4 channels): the
    channels padded to 4, so each half of a k step of 16 holds two taps of 4 channels; lane 4g + t reads
    the pair 2 * (t % 2) of the half's tap t // 2, its offset one of two constants per k step."""
    if taps > gemm_taps(cin, elem):
        raise ValueError(f"{taps} taps a half k step for {cin} input channels of {elem} bytes (at most "
                         f"{gemm_taps(cin, elem)})")
    return _round_up(cin, MMAS[elem].channels // taps)


#: The taps of the input channels a half k step may hold: the choices of the whole-weights families' ``taps``
#: (gemm_stats.yaml, gemm_main.yaml, gemm_cluster.yaml), which the facts per packing are keyed by.
GEMM_TAPS = (1, 2)


def gemm_taps(cin: int, elem: int = 4) -> int:
    """The most taps a half k step may hold (the gemm families' taps): 2 at 2 bytes for at most 4 input
    channels (where 8 padded channels a tap would leave 5 of 8 K columns zero at 3: packing two taps of 4
    halves the k steps, the MMAs and the A loads), else 1."""
    return 2 if elem == 2 and cin <= MMAS[elem].channels // 2 else 1


def k_padded(cin: int, kernel: Sequence[int], elem: int = 4, taps: int = 1) -> int:
    """K (taps x padded input channels) rounded up to the MMA's k (8, or 16 at 2 bytes); the extra rows
    have zero weights."""
    return _round_up(cin_padded(cin, elem, taps) * math.prod(kernel), MMAS[elem].k)


def gemm_k(conv: dict, elem: int = 4, taps: int = 1) -> dict[str, int]:
    """K of a convolution's implicit GEMM, as the templates take it (codegen's ``gemm``): ``k`` (taps
    x padded channels), ``cin_pad``, ``k_pad`` and the MMA's ``k_step``; ``taps`` a half k step holds
    (cin_padded)."""
    cin_pad = cin_padded(conv["cin"], elem, taps)
    return {"k": cin_pad * math.prod(conv["kernel"]), "cin_pad": cin_pad,
            "k_pad": k_padded(conv["cin"], conv["kernel"], elem, taps), "k_step": MMAS[elem].k}


#: Element bytes -> the registers a warp's lane may hold the B fragments of every k step in (gemm_keeps_b, which
#: gemm.cuh.j2's FtGemmB::CACHED is rendered from): conv3d's 16 channels at float32 (56); fewer at 2 bytes, where a
#: lane's A registers take twice the loads and conv3d's 56 registers of B spilled in gemm_main at two m-tiles a warp
#: (CUDA 13.0).
GEMM_B_REGS: dict[int, int] = {4: 64, 2: 48}


def gemm_keeps_b(conv: dict, elem: int = 4, terms: int = 1, taps: int = 1) -> bool:
    """Whether a warp of the whole-weights kernels keeps the B fragments of every k step in registers (gemm.cuh.j2's
    FtGemmB::CACHED): k steps x n-tiles x the registers a fragment takes (2, or 4 in split TF32) within
    GEMM_B_REGS."""
    k_steps = k_padded(conv["cin"], conv["kernel"], elem, taps) // MMAS[elem].k
    return k_steps * -(-conv["cout"] // 8) * 2 * terms <= GEMM_B_REGS[elem]


def weight_words(cout: int, k_pad: int, elem: int = 4, terms: int = 1) -> int:
    """Words of the staged weights: per k step (of 8, or 16 at 2 bytes: two values a word) and pair of
    n-tiles, four words for each of 32 lanes (the B fragments of both tiles, loaded as one 16-byte
    vector; an odd last tile is padded); ``terms`` times that where each weight is staged as several
    TF32 terms (2: split TF32 under precision ieee, gemm.cuh.j2's FT_GW_TERM)."""
    return terms * (k_pad // MMAS[elem].k * -(-cout // 16) * 128)


@functools.lru_cache(maxsize=None)  # a pure function the facts of every plan ask thousands of times
def channel_stride(volume: int, row_step: int, elem: int = 4, taps: int = 1) -> int:
    """Elements between the staged input's channels: a multiple of 16 bytes (the copies) of at least
    ``volume`` (one channel's box). Lane 4g + t reads A row g at its channel t (4 bytes: word g *
    row_step + t * stride, plus a constant), or at its channels 2t and 2t + 1 (2 bytes: elements g *
    row_step + (2t + e) * stride, two to a word; lanes that read one word share it); with ``taps`` 2
    (cin_padded) at its channels 2 (t % 2) + e of the half's tap t // 2, most often the next column (one
    element on). The stride is the smallest whose words land in the most distinct banks (all where
    possible), so the A loads of a warp take one pass through shared memory, not two."""
    if elem == 4:
        def distinct_banks(stride: int) -> int:
            return len({(g * row_step + t * stride) % 32 for g in range(8) for t in range(4)})
    else:
        per_tap = MMAS[elem].channels // taps  # a lane's pair: channels 2t % per_tap of tap 2t // per_tap

        def distinct_banks(stride: int) -> int:  # the worse of the two loads, e = 0 and e = 1
            return min(len({(g * row_step + (2 * t % per_tap + e) * stride + 2 * t // per_tap) // 2 % 32
                            for g in range(8) for t in range(4)}) for e in range(2))
    step = MMAS[elem].row
    first = _round_up(volume, step)
    return max(range(first, first + 32 * step // 4, step), key=lambda stride: (distinct_banks(stride), -stride))


@dataclasses.dataclass(frozen=True)
class GemmTile:
    cells: tuple[int, int, int]   # cells per box (d, h, w)
    region: tuple[int, int, int]  # convolution outputs the box computes (d, h, w)
    input: tuple[int, int, int]   # the input box they read (d, h, w), per input channel
    input_row: int                # elements a staged input row takes: its width rounded up to 16 bytes
    m: int                        # GEMM rows: region outputs
    m_tiles: int                  # rows in tiles of 16
    out_stride: int               # row stride of the staged outputs (channels x rows): 4 mod 32 words
    k: int                        # taps x input channels (padded to 4; 8 at 2 bytes)
    k_pad: int
    cin_pad: int                  # input channels staged (padded to 4; 8 at 2 bytes)
    k_step: int                   # the MMA's k (8: TF32; 16: FP16/BF16)
    taps: int                     # taps of the input channels a half k step holds (1; 2: cin_padded's packing)
    channel_stride: int           # elements between staged input channels (bank-conflict free A loads)
    weight_words: int             # staged weights (B fragments in lane order)
    smem_bytes: int               # weights + input box (two: double-buffered) + outputs + scratch


def gemm_tile(conv: dict, window: Sequence[int], stride: Sequence[int], tw: int, th: int, elem: int = 4,
              terms: int = 1, taps: int = 1) -> GemmTile:
    """The box of a variant with width ``tw`` and height ``th`` (outputs) over cells of ``window``
    outputs every ``stride`` (the pooling window; 1 for the statistics pass or without a pool), for
    input values of ``elem`` bytes (MMAS: 4, float32; 2, float16 and bfloat16), the weights staged as
    ``terms`` TF32 terms each (weight_words), ``taps`` taps a half k step (cin_padded).

    ``conv`` is codegen's conv geometry (3-D, 2-D padded). A box is one cell deep.
    """
    def fit(limit: int, k: int, s: int) -> int:
        return max(1, (limit - k) // s + 1)
    cells = (1, fit(th, window[1], stride[1]), fit(tw, window[2], stride[2]))
    region = tuple((c - 1) * s + k for c, k, s in zip(cells, window, stride))
    inputs = tuple((r - 1) * s + k for r, s, k in zip(region, conv["stride"], conv["kernel"]))
    m = math.prod(region)
    m_tiles = -(-m // 16)
    out_stride = m_tiles * 16 + (4 - m_tiles * 16 % 32) % 32
    k = gemm_k(conv, elem, taps)
    words = weight_words(conv["cout"], k["k_pad"], elem, terms)
    input_row = _round_up(inputs[2], MMAS[elem].row)
    stride = channel_stride(inputs[0] * inputs[1] * input_row, conv["stride"][2], elem, taps)
    floats = words + 2 * k["cin_pad"] * stride * elem // 4 + conv["cout"] * out_stride + 4 * 256
    return GemmTile(cells=cells, region=region, input=inputs, input_row=input_row, m=m, m_tiles=m_tiles,
                    out_stride=out_stride, **k, taps=taps, channel_stride=stride, weight_words=words,
                    smem_bytes=4 * floats)


#: The box heights the variants take (gemm_*.yaml's th) and the widest box (their largest tw).
BOX_HEIGHTS = (4, 8, 16)
WIDEST_BOX = 32


def gemm_max_height(conv: dict, windows: Sequence[tuple[Sequence[int], Sequence[int]]], elem: int = 4,
                    terms: int = 1) -> int:
    """The tallest box (at the widest) within the shared memory over each (window, stride) of cells,
    0 if none: the variants' constraint ``th <= gemm_th``, so that a convolution whose tallest
    boxes do not fit still takes the others."""
    def fits(th: int) -> bool:
        return all(gemm_tile(conv, w, s, WIDEST_BOX, th, elem, terms).smem_bytes <= SMEM_LIMIT for w, s in windows)
    return max((th for th in BOX_HEIGHTS if fits(th)), default=0)


def gemm_refusal(conv: dict, windows: Sequence[tuple[Sequence[int], Sequence[int]]], elem: int = 4,
                 terms: int = 1) -> str | None:
    """Why the tensor-core kernels do not take a convolution of ``elem``-byte values (weights staged as
    ``terms`` TF32 terms each: weight_words), None where they
    do: not transposed (yet), channels in whole MMA columns of 8 and few enough to keep a box's output
    on chip, weights small enough to stage, and some box over each (window, stride) of cells within the
    shared memory; dilation 1, one group, symmetric padding (producers.geometry_refusal)."""
    from fusetune.producers import geometry_refusal

    refusal = geometry_refusal(conv)
    if refusal is not None:
        return refusal
    if conv["transposed"]:
        return "a transposed convolution"
    if conv["cout"] % 8 != 0 or conv["cout"] > MAX_CHANNELS:
        return f"{conv['cout']} output channels (a multiple of 8 up to {MAX_CHANNELS})"
    words = weight_words(conv["cout"], k_padded(conv["cin"], conv["kernel"], elem), elem, terms)
    if words > MAX_WEIGHT_FLOATS:
        return f"weights of {words} staged words (at most {MAX_WEIGHT_FLOATS})"
    if gemm_max_height(conv, windows, elem, terms) == 0:
        return "no box of outputs (with its pooling windows) within the shared memory"
    return None


#: The box widths of the statistics kernels (gemm_stats.yaml's and gemm_cluster.yaml's tw).
BOX_WIDTHS = (16, WIDEST_BOX)
#: The most threads a gemm_cluster block has (gemm_cluster.yaml's block): its per-warp scratch.
CLUSTER_MAX_BLOCK = 256


def cluster_boxes(conv: dict, elem: int = 4, terms: int = 1) -> dict[tuple[int, int, int], int]:
    """(th, tw, taps) -> how many boxes of single outputs a gemm_cluster block can keep in shared memory
    beside its staged weights, its two input buffers and its per-channel scratch (0 where none, or where
    ``taps`` taps a half k step do not pack: gemm_taps). Two taps a half stage half the input channels and
    k steps, so more boxes fit. Mirrors the launcher's arithmetic in gemm_cluster.cu.j2; the variants'
    constraint compares it with a sample's boxes over the cluster's blocks."""
    out = {}
    for th in BOX_HEIGHTS:
        for tw in BOX_WIDTHS:
            for taps in GEMM_TAPS:
                if taps > gemm_taps(conv["cin"], elem):
                    out[(th, tw, taps)] = 0
                    continue
                tile = gemm_tile(conv, (1, 1, 1), (1, 1, 1), tw, th, elem, terms, taps)
                inputs = 2 * tile.cin_pad * tile.channel_stride * elem // 4  # two buffers, in words
                fixed = tile.weight_words + (2 * CLUSTER_MAX_BLOCK // 32 + 5) * conv["cout"] + inputs
                out[(th, tw, taps)] = max(0, (SMEM_LIMIT // 4 - fixed) // (conv["cout"] * tile.out_stride))
    return out


#: Input values a direct thread may hold in registers (rendered as direct.cuh.j2's FT_FOOTPRINT_MAX).
FOOTPRINT_MAX = 64
#: Cells (pooling windows) a direct_main thread may take in a row: direct_main.yaml's cells.
ROW_CELLS = (1, 2, 4)


def _span(outputs: int, cell_stride: int, stride: int, padding: int, taps: int, transposed: bool) -> int | None:
    """Along one dimension: how many input coordinates ``outputs`` outputs o = c * cell_stride + w
    (w < outputs) read, or None where which taps reach each output is not fixed by w alone (a
    transposed convolution whose stride does not divide the cell stride)."""
    if transposed and cell_stride % stride:
        return None
    offsets = [(w + padding - t) // stride if transposed else w * stride - padding + t
               for w in range(outputs) for t in range(taps) if not transposed or (w + padding - t) % stride == 0]
    return max(offsets) - min(offsets) + 1 if offsets else 0


def direct_footprint(conv: dict, window: Sequence[int], stride: Sequence[int], cells: int) -> int:
    """Input values (channels x positions) that ``cells`` cells in a row (along w) read, each cell a
    window of outputs with the given cell stride; 0 where they do not go to registers (not fixed at
    compile time, or more than FOOTPRINT_MAX)."""
    spans = []
    for dim in range(3):
        outputs, cell_stride = window[dim], stride[dim]
        if dim == 2:
            if _span(outputs, cell_stride, conv["stride"][2], conv["padding"][2], conv["kernel"][2],
                     conv["transposed"]) is None:
                return 0
            outputs, cell_stride = (cells - 1) * cell_stride + outputs, cells * cell_stride
        span = _span(outputs, cell_stride, conv["stride"][dim], conv["padding"][dim], conv["kernel"][dim],
                     conv["transposed"])
        if not span:
            return 0
        spans.append(span)
    values = conv["cin"] * math.prod(spans)
    return values if values <= FOOTPRINT_MAX else 0


def direct_row_cells(conv: dict, window: Sequence[int], stride: Sequence[int]) -> int:
    """The most cells in a row a direct_main thread may take: several only where their inputs fit
    in registers (each weight then feeds one FMA per cell)."""
    return max(r for r in ROW_CELLS if r == 1 or direct_footprint(conv, window, stride, r))


# The K-tiled implicit GEMM for convolutions with many channels (wide_stats.cu.j2).
#
# A block multiplies ``bm`` consecutive output positions of a sample (flat over depth, height and
# width: whole rows, so that no box is mostly past the edge of an odd-sized output) by ``bn``
# output channels, over K = taps x input channels in stages of one row of taps (kd, kh fixed, every
# kw) and ``ck`` input channels: per stage, the weights (packed once per call in the order the lanes
# read them) and the input rows the box's output rows read through that row of taps, both copied
# asynchronously a few stages ahead. Every shape-dependent size is a run-time value except the
# staged input's capacity per channel, which the launcher checks. With ``staging`` "plane", a stage
# takes every row of taps kh of one kd instead: the input rows all of them read are staged once (a
# slab: the rows of neighbouring kh overlap but for one), beside the weights of every kh. That
# copies several times less input where the weights of a plane of taps fit the shared memory.
#
# What it computes is always a plain convolution over the input, zero-padded once a call: the
# producer itself, or for a transposed one, one plain convolution per output *class*. Along an axis
# of stride s, the outputs o with (o + p) % s == r (class r) take only the taps r, r + s, ...: output
# q of the class (o = s * (first + q) - p + r) is the plain stride-1 convolution of the input with
# those taps in reverse order. So no zero tap of the upsampled input is multiplied, and with s = 1
# the one class is the familiar forward form (padding k - 1 - p, the weights flipped).

#: Threads of a wide_stats block (its FT_WBLOCK).
WIDE_BLOCK = 256
#: The variants' ``bm`` (outputs a block multiplies) and ``bn`` (output channels).
WIDE_BM = (128, 256)
WIDE_BN = (64, 128)
#: What a stage takes (wide_stats.yaml's staging): one row of taps (kd, kh), or every kh of one kd.
WIDE_STAGINGS = ("row", "plane")
#: A block's shared memory where two share a multiprocessor (the wide variants' blocks 2): Hopper's
#: 228 KB a multiprocessor, less 1 KB the system reserves per block, halved.
WIDE_PAIR_LIMIT = 113 * 1024


@dataclasses.dataclass(frozen=True)
class WideAxis:
    """One axis (d, h or w) of the convolution as the wide kernels compute it (wide_geometry.h.j2's
    FtWideAxisOf mirrors it): ``classes`` output classes, each a plain convolution of ``taps(r)`` taps
    at ``step`` over the padded input, whose output q reads padded positions ``q * step + offset(r)``
    onwards. The padded input starts ``lead`` zeros before the input."""

    kernel: int
    stride: int
    padding: int
    transposed: bool

    @property
    def classes(self) -> int:
        return self.stride if self.transposed else 1

    @property
    def step(self) -> int:
        """The stride over the input of each class's plain convolution."""
        return 1 if self.transposed else self.stride

    def taps(self, r: int) -> int:
        """Taps of class r: r, r + s, ... below k (none where k <= r)."""
        return (self.kernel - r + self.stride - 1) // self.stride if self.transposed else self.kernel

    @property
    def max_taps(self) -> int:
        return max(self.taps(r) for r in range(self.classes))

    def first(self, r: int) -> int:
        """The first q of class r with an output o = s * q - p + r >= 0 (0 for a plain convolution)."""
        return (self.padding - r + self.stride - 1) // self.stride if self.transposed else 0

    def pad(self, r: int) -> int:
        """Zeros class r's plain convolution reads before the input (negative: it starts inside)."""
        return self.taps(r) - 1 - self.first(r) if self.transposed else self.padding

    @property
    def lead(self) -> int:
        """Zeros before the input in the padded input: the most any class reads."""
        return max(0, *(self.pad(r) for r in range(self.classes)))

    def offset(self, r: int) -> int:
        return self.lead - self.pad(r)

    def size(self, r: int, out: int) -> int:
        """Outputs of class r on an axis ``out`` long."""
        if not self.transposed:
            return out
        return max(0, (out - 1 + self.padding - r) // self.stride - self.first(r) + 1)

    def live(self, out: int) -> list[int]:
        """The classes with outputs and taps (the others are all zero before the bias)."""
        return [r for r in range(self.classes) if self.size(r, out) > 0 and self.taps(r) > 0]

    def extent(self, out: int) -> int:
        """Positions of the padded input along the axis: every one a class reads (at least 1)."""
        return max([1] + [(self.size(r, out) - 1) * self.step + self.offset(r) + self.taps(r) for r in self.live(out)])

    def output(self, r: int, q: int) -> int:
        """The output position of class r's output q."""
        return self.stride * (self.first(r) + q) - self.padding + r if self.transposed else q


def wide_axes(conv: dict) -> tuple[WideAxis, WideAxis, WideAxis]:
    """The (d, h, w) axes of a convolution as the wide kernels compute it."""
    return tuple(WideAxis(k, s, p, conv["transposed"])  # type: ignore[return-value]
                 for k, s, p in zip(conv["kernel"], conv["stride"], conv["padding"]))


#: Element bytes -> the input channels a stage of the K-tiled kernels takes: (few, many), many where the
#: convolution has at least that many. A 4-byte word of the padded input and of the packed weights holds
#: one float32 channel (its K column, a TF32 MMA's k step of 8 taking 8 of them) or a pair of 2-byte ones
#: (FP16/BF16 m16n8k16: a k step of 16 is 8 words too), so twice the channels at 2 bytes make stages of the
#: same words: the same shared memory, depths and A loads (wide_planes).
WIDE_CHUNKS: dict[int, tuple[int, int]] = {4: (8, 16), 2: (16, 32)}


def wide_channel_chunk(cin: int, elem: int = 4) -> int:
    """Input channels a stage takes at ``elem`` bytes a value (WIDE_CHUNKS): at float32 16 (two k steps of 8
    per tap), or 8 for few input channels; at 2 bytes 32 (two k steps of 16), or 16."""
    few, many = WIDE_CHUNKS[elem]
    return many if cin >= many else few


def wide_cin_padded(cin: int, elem: int = 4) -> int:
    """Input channels in whole stages (the padded input's and the packed weights'; zeros past ``cin``)."""
    return _round_up(cin, wide_channel_chunk(cin, elem))


def wide_planes(channels: int, elem: int = 4) -> int:
    """Words a position of ``channels`` input channels takes in the padded input and the packed weights (the
    templates' FT_WCK and FT_WCINP count these planes): one channel a word at float32, a pair at 2 bytes
    (the lower channel in the low half, as an FP16/BF16 MMA fragment register holds two K columns)."""
    return channels * elem // 4


def wide_slab_stride(conv: dict, bm: int, staging: str = "row") -> int:
    """Words a staged input channel may take (its rows one after another), a compile-time constant:
    room for the input the bm outputs' rows read (about bm x the step along w, plus the taps'
    overhang and partial rows) for most shapes (wide_rows_fit says which), at a stride whose A loads
    take one pass through shared memory. A plane stage also holds the rows between output rows (step
    along h) and, at the end of each run of them at one depth (two runs for most shapes), the
    overhang of its rows of taps kh: about as many more rows as a quarter of bm's outputs fill."""
    _, axis_h, axis_w = wide_axes(conv)
    words = bm * 3 // 2 + 64
    if staging == "plane":
        words = axis_h.step * words + 2 * max(0, axis_h.max_taps - axis_h.step) * (bm // 4 + 32)
    return channel_stride(axis_w.step * words, axis_w.step)


def wide_staged_rows(conv: dict, bm: int, height: int, width: int, staging: str) -> int:
    """The most padded input rows a staged channel holds for any bm consecutive outputs of any class
    (wide_geometry.h.j2's ft_wide_staged_rows), at output height and width ``height`` x ``width``.
    The outputs span at most rows = (q - 1 + bm - 1) // q + 1 output rows of a class's rows q wide.
    A "row" stage holds theirs; a "plane" stage, within each run of them at one depth (segs runs at
    most), the rows between them (step apart along h) and the overhang of every kh."""
    _, axis_h, axis_w = wide_axes(conv)
    most = 1
    for q in (axis_w.size(r, width) for r in axis_w.live(width)):
        rows = (q + bm - 2) // q + 1
        if staging == "row":
            most = max(most, rows)
            continue
        for qh in (axis_h.size(r, height) for r in axis_h.live(height)):
            segs = min(rows, (rows + qh - 2) // qh + 1)
            most = max(most, (rows - 1) * axis_h.step + axis_h.max_taps,
                       (rows - segs) * axis_h.step + segs * axis_h.max_taps)
    return most


def wide_rows_fit(conv: dict, bm: int, height: int, width: int, staging: str = "row",
                  window: tuple | None = None) -> bool:
    """Whether the padded input rows any bm consecutive outputs of a class read fit one staged
    channel (wide_staged_rows of wide_row_words each), a row at most one 16-byte unit per thread of
    a block. The variants' constraint and the launcher's check (``height``, ``width``: the output's).
    Where the chain pools (``window``: its kernel and stride), whether a box of one whole window
    does (wide_brick; ``height`` does not matter then: a window's rows are whole padded rows)."""
    row = wide_row_words(conv, width)
    if window is not None:
        return row <= 4 * WIDE_BLOCK and wide_brick(conv, bm, staging, window, (1, 1, 1), width)[2] > 0
    rows = wide_staged_rows(conv, bm, height, width, staging)
    return rows * row <= wide_slab_stride(conv, bm, staging) and row <= 4 * WIDE_BLOCK


def wide_brick(conv: dict, bm: int, staging: str, window: tuple, pooled: Sequence[int], width: int) -> tuple[int, int, int]:
    """The pooling windows (pd, ph, pw) a box of wide_main takes where the chain pools: a brick of
    whole windows, as many along w as fit (a whole pooled row, then rows of them, then planes)
    (wide_geometry.h.j2's ft_wide_brick mirrors it). Each output class computes its own outputs in
    the brick as one box: at most ceil(n / classes) of n consecutive outputs along each axis, so
    those must fit bm outputs and a staged channel; and a strided transposed convolution's windows
    must fit its fold (bm of them: wide_folds). ``window``: the pool's (kernel, stride), 3-D;
    ``pooled``: the pooled output (OD, OH, OW); ``width``: the convolution output's. pw == 0: not
    even one window fits."""
    (kd, kh, kw), (sd, sh, sw) = window
    axis_d, axis_h, axis_w = wide_axes(conv)
    cap, row = wide_slab_stride(conv, bm, staging), wide_row_words(conv, width)

    def fits(pd: int, ph: int, pw: int) -> bool:
        nd, nh, nw = (pd - 1) * sd + kd, (ph - 1) * sh + kh, (pw - 1) * sw + kw
        cd, ch, cw = (-(-n // axis.classes) for n, axis in ((nd, axis_d), (nh, axis_h), (nw, axis_w)))
        rows = cd * ((ch - 1) * axis_h.step + axis_h.max_taps) if staging == "plane" else cd * ch
        return pd * ph * pw <= bm and cd * ch * cw <= bm and rows * row <= cap

    od, oh, ow = pooled
    pd = ph = 1
    pw = 0
    while pw < ow and fits(1, 1, pw + 1):
        pw += 1
    if pw == ow:
        while ph < oh and fits(1, ph + 1, pw):
            ph += 1
        if ph == oh:
            while pd < od and fits(pd + 1, ph, pw):
                pd += 1
    return pd, ph, pw


def wide_folds(conv: dict) -> bool:
    """Whether wide_main, where the chain pools, folds the values into their windows class by class:
    a strided transposed convolution, whose output classes interleave in every window. Each class's
    outputs in a brick are then one box multiplied in turn, and every window's running value (bm
    windows by bn channels at most) stays in shared memory beside the stages until the last class."""
    return any(axis.classes > 1 for axis in wide_axes(conv))


def wide_folds_aligned(conv: dict, window: tuple) -> bool:
    """Whether every pooling window holds exactly one output of each class (wide_folds): the pool's
    window and stride equal the classes' stride along every axis (``window``: its kernel and stride,
    3-D), as a 2 x 2 x 2 pool after a stride-2 upsampling. A class box's m-th output then lies in the
    brick's window m, and wide_main folds its accumulators into the windows as they are."""
    kernel, stride = window
    return wide_folds(conv) and all(k == s == axis.classes for k, s, axis in zip(kernel, stride, wide_axes(conv)))


def wide_row_words(conv: dict, width: int) -> int:
    """Words of a padded input row for outputs ``width`` wide: the columns any class reads through
    any tap, rounded up to 16 bytes (wide_geometry.h.j2's IWP)."""
    return _round_up(wide_axes(conv)[2].extent(width), 4)


def wide_stage_words(conv: dict, bm: int, bn: int, staging: str = "row", elem: int = 4, terms: int = 1) -> int:
    """Words of one pipeline stage: the weights (kw taps, and with "plane" staging every kh, x ck
    channels' planes x bn; ``terms`` TF32 terms each, 2 in split TF32) and the staged input (planes of
    ``elem``-byte values: wide_planes)."""
    planes = wide_planes(wide_channel_chunk(conv["cin"], elem), elem)
    _, axis_h, axis_w = wide_axes(conv)
    rows_of_taps = axis_h.max_taps if staging == "plane" else 1
    return rows_of_taps * axis_w.max_taps * planes * bn * terms + planes * wide_slab_stride(conv, bm, staging)


def wide_pool_fits(conv: dict, bm: int, bn: int, wm: int, blocks: int = 1, staging: str = "row", *, elem: int = 4,
                   terms: int = 1) -> bool:
    """Whether wide_main can pool a box of this variant: its stages fit beside the windows' fold
    where it folds (wide_folds), and its values of bn / passes channels at a time (bm + 4 words a
    channel) fit the stages' buffers (free once every warp is past its MMAs), the passes splitting
    each warp's nt n-tiles evenly (wide_main.cu.j2's ft_wide_pool_passes)."""
    warps_n = WIDE_BLOCK // 32 // (bm // 16 // wm)
    nt = bn // 8 // warps_n
    buffers = (wide_depth(conv, bm, bn, blocks, staging, wide_folds(conv), elem, terms)
               * wide_stage_words(conv, bm, bn, staging, elem, terms))
    return any((bn // passes) * (bm + 4) <= buffers for passes in (1, 2, 4, 8, 16) if passes <= nt)


def wide_table_words(conv: dict, bm: int, staging: str = "row") -> int:
    """Words of a box's row tables: where each staged row comes from (at most a staged channel's
    words / 4 rows: a row is 16 bytes at least), then where each output row's input starts in a
    staged channel (bm + 1 at most), and one to keep what follows 8-byte aligned."""
    return _round_up(wide_slab_stride(conv, bm, staging) // 4, 2) + bm + 2


def wide_smem_bytes(conv: dict, bm: int, bn: int, depth: int, staging: str = "row", fold: bool = False,
                    elem: int = 4, terms: int = 1) -> int:
    """Shared memory of a variant with ``depth`` stages in flight, beside its per-box row tables, the
    channels' pivots and the warps' per-channel sums (template: FtWide::smem_words), and with
    ``fold`` the windows' running values, bm x bn words (wide_main pooling class by class)."""
    warps_m = bm // 32  # at most: m-tiles of 16, at least two a warp
    return 4 * (depth * wide_stage_words(conv, bm, bn, staging, elem, terms) + wide_table_words(conv, bm, staging) + bn
                + 2 * warps_m * bn + (bm * bn if fold else 0))


def wide_depth(conv: dict, bm: int, bn: int, blocks: int = 1, staging: str = "row", fold: bool = False,
               elem: int = 4, terms: int = 1) -> int:
    """Stages in flight: three where they fit in a block's share of the shared memory (``blocks`` a
    multiprocessor; with ``fold``, beside the windows' fold), else two, else 0 (not compiled); for values
    of ``elem`` bytes and weights of ``terms`` TF32 terms (wide_stage_words)."""
    limit = SMEM_LIMIT if blocks == 1 else WIDE_PAIR_LIMIT
    return max((d for d in (3, 2) if wide_smem_bytes(conv, bm, bn, d, staging, fold, elem, terms) <= limit), default=0)


def wide_depths(conv: dict, elem: int = 4, terms: int = 1) -> dict[tuple[int, int, int, str], int]:
    """(bm, bn, blocks, staging) -> wide_depth, for the variants' compile_if and constraints. Memoized on the
    convolution's facts: a plan's facts and constraints ask it hundreds of times for the same convolution."""
    return dict(_wide_depths(tuple(sorted(conv.items())), elem, terms))  # geometry()'s facts: numbers and tuples


@functools.lru_cache(maxsize=4096)
def _wide_depths(conv: tuple, elem: int, terms: int) -> tuple[tuple[tuple[int, int, int, str], int], ...]:
    facts = dict(conv)
    return tuple(((bm, bn, blocks, staging), wide_depth(facts, bm, bn, blocks, staging, False, elem, terms))
                 for bm in WIDE_BM for bn in WIDE_BN for blocks in (1, 2) for staging in WIDE_STAGINGS)


def wide_fits(conv: dict, elem: int = 4, terms: int = 1) -> bool:
    """Whether the wide kernels take a convolution (plain or transposed, any stride): whether some
    variant is within the shared memory; and dilation 1, one group, symmetric padding
    (producers.geometry_refusal)."""
    from fusetune.producers import geometry_refusal

    return geometry_refusal(conv) is None and any(wide_depths(conv, elem, terms).values())


def wide_workspace_words(conv: dict, elem: int = 4, terms: int = 1) -> int:
    """Words of the packed weights of the largest variant: for every class, its (kd, kh) rows of taps
    (as many as the class with the most has, and the most kw; zeros past its own), the input channels
    in whole chunks (their planes: wide_planes) and the output channels in whole tiles of bn; ``terms``
    times that in split TF32 (each row of taps' hi terms, then its lo terms)."""
    axes = wide_axes(conv)
    taps = math.prod(axis.classes * axis.max_taps for axis in axes)
    planes = wide_planes(wide_cin_padded(conv["cin"], elem), elem)
    return terms * max(taps * planes * _round_up(conv["cout"], bn) for bn in WIDE_BN)
