"""The tensor-core kernels' tile geometry (fusetune/tiles.py): boxes of whole cells, the input they
read, padding of K and M, and strides chosen so that a warp's shared-memory accesses do not conflict."""
from __future__ import annotations

import pytest

from fusetune.config import load_config
from fusetune.tiles import SMEM_LIMIT, gemm_fits, gemm_tile, k_padded, weight_stride

from conftest import SEEDS

ONE = (1, 1, 1)


def _conv(cin=8, cout=64, kernel=(1, 3, 3), stride=(1, 1, 1)):
    return {"cin": cin, "cout": cout, "kernel": kernel, "stride": stride, "transposed": False}


def test_seed_conv2d_main_box_holds_whole_pooling_windows():
    tile = gemm_tile(load_config(SEEDS["groupnorm"]).producer.geometry(), (1, 4, 4), (1, 4, 4), 32, 4)
    assert tile.cells == (1, 1, 8) and tile.region == (1, 4, 32)
    assert tile.input == (1, 6, 34)  # a 3 x 3 kernel reads one more row and column on each far side
    assert (tile.m, tile.m_tiles, tile.k, tile.k_pad) == (128, 8, 72, 72)


def test_statistics_box_is_single_outputs():
    tile = gemm_tile(_conv(), ONE, ONE, 16, 8)
    assert tile.cells == tile.region == (1, 8, 16)
    assert tile.input == (1, 10, 18)


def test_strided_convolution_and_overlapping_3d_windows():
    tile = gemm_tile(_conv(cin=5, cout=24, kernel=(3, 2, 3), stride=(1, 2, 1)), (2, 2, 2), (2, 2, 1), 32, 8)
    assert tile.cells == (1, 4, 31)  # windows of 2 every 2 rows, every column: 31 fit in 32
    assert tile.region == (2, 8, 32)
    assert tile.input == (4, 16, 34)  # (region - 1) * conv stride + kernel
    assert tile.m == 512 and tile.m_tiles == 32


def test_a_window_larger_than_the_box_still_makes_one_cell():
    tile = gemm_tile(_conv(), (1, 8, 8), (1, 8, 8), 16, 4)
    assert tile.cells == (1, 1, 2) and tile.region == (1, 8, 16)


def test_k_and_m_are_padded_to_whole_mma_tiles():
    assert k_padded(3, (3, 3, 3)) == 88  # 81 taps x channels, 7 zero-weight columns
    tile = gemm_tile(_conv(cin=3, cout=16, kernel=(3, 3, 3)), ONE, ONE, 30, 3)
    assert tile.m == 90 and tile.m_tiles == 6
    assert tile.out_stride >= tile.m_tiles * 16


@pytest.mark.parametrize("cout", range(8, 65, 8))
def test_weight_reads_of_a_warp_hit_32_banks(cout):
    """Lane 4g + t reads B at row t (and t + 4), column g: word t * stride + g."""
    stride = weight_stride(cout)
    assert stride >= cout
    banks = {(t * stride + g) % 32 for g in range(8) for t in range(4)}
    assert len(banks) == 32


@pytest.mark.parametrize("tw, th", [(16, 4), (16, 8), (32, 4), (32, 8), (30, 3)])
def test_output_stores_of_a_warp_hit_32_banks(tw, th):
    """Lane 4g + t stores D rows g (and g + 8) of channels 2t (and 2t + 1): word 2t * stride + g."""
    stride = gemm_tile(_conv(), ONE, ONE, tw, th).out_stride
    banks = {(2 * t * stride + g) % 32 for g in range(8) for t in range(4)}
    assert len(banks) == 32


def test_fits_takes_the_largest_box_of_every_window():
    conv = _conv(cin=16)
    assert gemm_fits(conv, [(ONE, ONE), ((1, 4, 4), (1, 4, 4))])
    # A 16 x 16 pooling window makes a 16 x 32 box: its outputs (64 channels) no longer fit beside the rest.
    big = gemm_tile(conv, (1, 16, 16), (1, 16, 16), 32, 8)
    assert big.smem_bytes > SMEM_LIMIT
    assert not gemm_fits(conv, [(ONE, ONE), ((1, 16, 16), (1, 16, 16))])
    assert not gemm_fits({**conv, "transposed": True}, [(ONE, ONE)])
