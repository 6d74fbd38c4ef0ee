"""The tile geometry of the tensor-core (implicit GEMM) kernels, worked out once in Python.

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
import math
from typing import Sequence

#: Shared memory the kernels may use per block (bytes): Hopper's opt-in limit is 227 KB.
SMEM_LIMIT = 200 * 1024
#: Largest weight tile (floats, K padded times the padded channel stride) the kernels stage.
MAX_WEIGHT_FLOATS = 16384
#: Most output channels: each block holds a box's whole output (channels x rows) on chip.
MAX_CHANNELS = 64


def weight_stride(cout: int) -> int:
    """Row stride of the staged weights (K x channels): 8 mod 32 words, so the B-fragment reads
    of a warp (lane = 4 * column + k) fall in 32 different banks."""
    return cout + (8 - cout % 32) % 32


def k_padded(cin: int, kernel: Sequence[int]) -> int:
    """K (input channels x taps) rounded up to the MMA's k of 8; the extra rows have zero weights."""
    return -(-cin * math.prod(kernel) // 8) * 8


@dataclasses.dataclass(frozen=True)
class GemmTile:
    cells: tuple[int, int, int]   # cells per box (d, h, w)
    region: tuple[int, int, int]  # convolution outputs the box computes (d, h, w)
    input: tuple[int, int, int]   # the input box they read (d, h, w), per input channel
    m: int                        # GEMM rows: region outputs
    m_tiles: int                  # rows in tiles of 16
    out_stride: int               # row stride of the staged outputs (channels x rows): 4 mod 32 words
    k: int                        # input channels x taps
    k_pad: int
    w_stride: int                 # row stride of the staged weights
    smem_bytes: int               # weights + input box (two: double-buffered) + outputs + scratch


def gemm_tile(conv: dict, window: Sequence[int], stride: Sequence[int], tw: int, th: int) -> GemmTile:
    """The box of a variant with width ``tw`` and height ``th`` (outputs) over cells of ``window``
    outputs every ``stride`` (the pooling window; 1 for the statistics pass or without a pool).

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
    k = conv["cin"] * math.prod(conv["kernel"])
    k_pad = k_padded(conv["cin"], conv["kernel"])
    w_stride = weight_stride(conv["cout"])
    floats = k_pad * w_stride + 2 * conv["cin"] * math.prod(inputs) + conv["cout"] * out_stride + 4 * 256
    return GemmTile(cells=cells, region=region, input=inputs, m=m, m_tiles=m_tiles, out_stride=out_stride,
                    k=k, k_pad=k_pad, w_stride=w_stride, smem_bytes=4 * floats)


#: The largest box a variant may ask for (gemm_*.yaml's tw and th): it bounds the shared memory.
LARGEST_BOX = (32, 8)


def gemm_fits(conv: dict, windows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> bool:
    """Whether the tensor-core kernels take a convolution: not transposed (yet), channels in whole
    MMA columns of 8 and few enough to keep a box's output on chip, weights small enough to stage,
    and the largest box over each (window, stride) of cells within the shared memory."""
    if conv["transposed"] or conv["cout"] % 8 != 0 or conv["cout"] > MAX_CHANNELS:
        return False
    if k_padded(conv["cin"], conv["kernel"]) * weight_stride(conv["cout"]) > MAX_WEIGHT_FLOATS:
        return False
    return all(gemm_tile(conv, window, stride, *LARGEST_BOX).smem_bytes <= SMEM_LIMIT for window, stride in windows)
