"""The kernels' tile geometry (fusetune/tiles.py). Tensor cores: boxes of whole cells, the input they
read, padding of K and M, and strides chosen so that a warp's shared-memory accesses do not conflict.
Direct kernels: the inputs a thread's cells read, which it holds in registers where they fit."""
from __future__ import annotations

import itertools

import pytest

from fusetune.config import load_config
from fusetune.dtypes import DTYPES
from fusetune.plan import make_plan
from fusetune.tiles import (BOX_HEIGHTS, BOX_WIDTHS, FOOTPRINT_MAX, GEMM_TAPS, SMEM_LIMIT, WIDE_PAIR_LIMIT, cin_padded,
                            cluster_boxes, direct_footprint, direct_row_cells, gemm_keeps_b, gemm_max_height,
                            gemm_refusal, gemm_taps, gemm_tile, k_padded, weight_words, wide_axes,
                            wide_brick, wide_depth, wide_folds, wide_folds_aligned, wide_pool_fits, wide_row_words,
                            wide_rows_fit, wide_slab_stride, wide_smem_bytes, wide_stage_words, wide_staged_rows,
                            wide_workspace_words)

from conftest import ROOT, SEEDS

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
    assert cin_padded(3) == 4 and cin_padded(8) == 8 and cin_padded(5) == 8
    assert k_padded(3, (3, 3, 3)) == 112  # 27 taps x 4 channels (one of them zero), then 4 zero-weight columns
    assert k_padded(8, (1, 3, 3)) == 72 and k_padded(4, (1, 1, 3)) == 16
    tile = gemm_tile(_conv(cin=3, cout=16, kernel=(3, 3, 3)), ONE, ONE, 30, 3)
    assert tile.m == 90 and tile.m_tiles == 6
    assert tile.out_stride >= tile.m_tiles * 16


@pytest.mark.parametrize("cout", range(8, 65, 8))
def test_staged_weights_hold_every_b_fragment_once(cout):
    """The staging order of gemm.cuh.j2 (ft_gemm_stage_weights): word ((ks * pairs + jp) * 32 + lane)
    * 4 + e holds column (2 jp + e // 2) * 8 + lane // 4 at row ks * 8 + lane % 4 + 4 (e % 2). Every
    (k, n) of the tile is there exactly once, and what is left over is an odd last n-tile's padding."""
    k_pad, pairs = 72, -(-cout // 16)
    seen = []
    for i in range(weight_words(cout, k_pad)):
        e, lane, rest = i % 4, i // 4 % 32, i // 128
        jp, ks = rest % pairs, rest // pairs
        seen.append(((2 * jp + e // 2) * 8 + lane // 4, ks * 8 + lane % 4 + 4 * (e % 2)))
    real = [(n, k) for n, k in seen if n < cout]
    assert sorted(real) == [(n, k) for n in range(cout) for k in range(k_pad)]
    assert all(cout <= n < 16 * pairs for n, _ in seen if n >= cout)


def test_half_k_steps_are_16_and_channels_come_in_eights():
    """At 2 bytes (FP16/BF16 m16n8k16) a k step is 16 K columns and the channels are padded to 8, so that
    columns 0..7 and 8..15 of a step are each 8 channels of one tap; the float32 geometry is unchanged."""
    assert cin_padded(3, 2) == 8 and cin_padded(8, 2) == 8 and cin_padded(9, 2) == 16
    assert k_padded(3, (3, 3, 3), 2) == 224 and k_padded(8, (1, 3, 3), 2) == 80  # 216 and 72 real columns
    tile = gemm_tile(_conv(cin=3, cout=16, kernel=(3, 3, 3)), ONE, ONE, 30, 3, elem=2)
    assert (tile.k, tile.k_pad, tile.cin_pad, tile.k_step) == (216, 224, 8, 16)
    assert tile.weight_words == weight_words(16, 224, elem=2) == 14 * 1 * 128  # 14 k steps, one pair of n-tiles
    assert gemm_tile(_conv(cin=3, cout=16, kernel=(3, 3, 3)), ONE, ONE, 30, 3).k_step == 8


@pytest.mark.parametrize("cout", range(8, 65, 8))
def test_half_staged_weights_hold_every_b_fragment_once(cout):
    """The 2-byte staging order of gemm.cuh.j2 (ft_gemm_stage_weights at float16 and bfloat16): word ((ks *
    pairs + jp) * 32 + lane) * 4 + e holds column (2 jp + e // 2) * 8 + lane // 4 at rows k and k + 1, k = ks
    * 16 + 2 (lane % 4) + 8 (e % 2): PTX's m16n8k16 B fragment (b0, b1: rows 2t, 2t + 1; b2, b3: 2t + 8,
    2t + 9; column g). Every (k, n) of the tile is there exactly once."""
    k_pad, pairs = 80, -(-cout // 16)
    seen = []
    for i in range(weight_words(cout, k_pad, elem=2)):
        e, lane, rest = i % 4, i // 4 % 32, i // 128
        jp, ks = rest % pairs, rest // pairs
        k = ks * 16 + 2 * (lane % 4) + 8 * (e % 2)
        seen += [((2 * jp + e // 2) * 8 + lane // 4, k + h) for h in range(2)]
    real = [(n, k) for n, k in seen if n < cout]
    assert sorted(real) == [(n, k) for n in range(cout) for k in range(k_pad)]


@pytest.mark.parametrize("name", ["groupnorm", "instancenorm"])
@pytest.mark.parametrize("tw, th", [(16, 4), (32, 8), (32, 16)])
def test_half_a_loads_of_a_warp_take_one_pass_at_the_seeds(name, tw, th):
    """At 2 bytes lane 4g + t reads A row g at its channels 2t and 2t + 1 (two loads): values g * conv
    stride + (2t + e) * channel_stride, two to a 4-byte word. Each load's words fall in distinct banks (lanes
    that read one word share it). Rows and channels start on 16 bytes (8 values), for the 16-byte copies."""
    conv = load_config(SEEDS[name]).producer.geometry()
    tile = gemm_tile(conv, ONE, ONE, tw, th, elem=2)
    assert tile.input_row % 8 == 0 and tile.input[2] <= tile.input_row < tile.input[2] + 8
    assert tile.channel_stride % 8 == 0 and tile.channel_stride >= tile.input[0] * tile.input[1] * tile.input_row
    for e in range(2):
        words = {(g * conv["stride"][2] + (2 * t + e) * tile.channel_stride) // 2 for g in range(8) for t in range(4)}
        assert len({w % 32 for w in words}) == len(words)


def test_two_taps_a_half_k_step_where_few_channels_pack():
    """At 2 bytes with at most 4 input channels (gemm_stats' taps 2) the channels are padded to 4 and each half of
    a k step of 16 holds two taps of 4 channels: the conv3d seed's K is 108 (27 taps x 4) padded to 112, 7 k steps
    where 8 padded channels a tap take 14. Elsewhere one tap a half (float32, or more than 4 channels)."""
    assert gemm_taps(3, 2) == gemm_taps(4, 2) == 2 and gemm_taps(5, 2) == gemm_taps(3, 4) == gemm_taps(3) == 1
    assert cin_padded(3, 2, taps=2) == cin_padded(4, 2, taps=2) == 4 and k_padded(3, (3, 3, 3), 2, taps=2) == 112
    tile = gemm_tile(_conv(cin=3, cout=16, kernel=(3, 3, 3)), ONE, ONE, 32, 8, elem=2, taps=2)
    assert (tile.k, tile.k_pad, tile.cin_pad, tile.k_step) == (108, 112, 4, 16)
    assert tile.weight_words == weight_words(16, 112, elem=2) == 7 * 1 * 128
    assert tile.smem_bytes < gemm_tile(_conv(cin=3, cout=16, kernel=(3, 3, 3)), ONE, ONE, 32, 8, elem=2).smem_bytes
    for cin, elem in ((5, 2), (3, 4)):
        with pytest.raises(ValueError):
            cin_padded(cin, elem, taps=2)
    # Packed, the seed's B fragments fit a lane's registers at 2 bytes (7 k steps x 2 n-tiles x 2: 28 of 48), as at
    # float32 (14 x 2 x 2: 56 of 64) and not in split TF32 (112) or with 8 padded channels a tap (56 of 48).
    conv = _conv(cin=3, cout=16, kernel=(3, 3, 3))
    assert gemm_keeps_b(conv, 2, taps=2) and gemm_keeps_b(conv, 4)
    assert not gemm_keeps_b(conv, 2) and not gemm_keeps_b(conv, 4, terms=2)


@pytest.mark.parametrize("name", ["groupnorm", "instancenorm"])
@pytest.mark.parametrize("tw, th", [(16, 4), (32, 8), (32, 16)])
def test_packed_half_a_loads_of_a_warp_take_one_pass(name, tw, th):
    """With two taps a half k step (3 input channels of the seeds' convolutions, at 2 bytes) lane 4g + t reads A row g
    at channels 2 (t % 2) + e of the half's tap t // 2, most often the next column: values g * conv stride + (2 (t %
    2) + e) * channel_stride + t // 2, two to a word. Each load's words fall in distinct banks."""
    conv = {**load_config(SEEDS[name]).producer.geometry(), "cin": 3}
    _assert_packed_a_loads_take_one_pass(conv, gemm_tile(conv, ONE, ONE, tw, th, elem=2, taps=2))


def _assert_packed_a_loads_take_one_pass(conv: dict, tile) -> None:
    """The staged input's channels 16 bytes apart, each whole, and the two A loads of a warp (e = 0, 1) at
    two taps a half k step in distinct banks."""
    assert tile.channel_stride % 8 == 0 and tile.channel_stride >= tile.input[0] * tile.input[1] * tile.input_row
    for e in range(2):
        words = {(g * conv["stride"][2] + (2 * (t % 2) + e) * tile.channel_stride + t // 2) // 2
                 for g in range(8) for t in range(4)}
        assert len({w % 32 for w in words}) == len(words)


@pytest.mark.parametrize("chain", ["conv2d_fp16_cin3_relu_maxpool", "conv3d_bf16_cin3_groupnorm_relu_maxpool"])
@pytest.mark.parametrize("tw, th", [(16, 4), (32, 8), (32, 16)])
def test_packed_half_main_boxes_hold_whole_windows_and_a_loads_take_one_pass(chain, tw, th):
    """gemm_main's boxes of whole pooling windows packed two taps a half k step (taps 2; the 3-channel half chains of
    the corpus, 2 x 2 max pools after a padded conv2d and a conv3d): the same cells and outputs as at one tap, half
    the k steps (conv2d: 9 taps x 4 channels, K 48 where 9 x 8 take 80; conv3d: 27 x 4, 112 where 27 x 8 take 224)
    and half the staged input channels, and each A load of a warp in distinct banks."""
    plan = make_plan(load_config(ROOT / "tests" / "chains" / f"{chain}.yaml"))
    conv, elem = plan.spec.producer.geometry(), DTYPES[plan.spec.dtype].bytes
    packed, one = (gemm_tile(conv, *plan.pool_window, tw, th, elem, taps=taps) for taps in (2, 1))
    assert (packed.cells, packed.region, packed.input) == (one.cells, one.region, one.input)
    assert packed.cells[1:] == (th // 2, tw // 2) and packed.region[1:] == (th, tw)  # whole 2 x 2 windows
    assert (packed.k_pad, one.k_pad) == ((48, 80) if conv["spatial_dims"] == 2 else (112, 224))
    assert (packed.cin_pad, one.cin_pad, packed.taps) == (4, 8, 2) and packed.smem_bytes < one.smem_bytes
    _assert_packed_a_loads_take_one_pass(conv, packed)


def test_cluster_keeps_more_boxes_with_two_taps_a_half_k_step():
    """A gemm_cluster block keeps the boxes of outputs its shared memory holds beside the weights, two input buffers
    and 21 words of scratch a channel (tiles.cluster_boxes, keyed (th, tw, taps)). Two taps a half k step stage 4
    channels, not 8, and half the k steps of weights: the conv3d seed's convolution at 2 bytes, boxes 16 x 32 (516
    words a channel), keeps (51200 - 1792 - 8 x 2168 - 336) // (16 x 516) = 3 at one tap and (51200 - 896 - 4 x 2160
    - 336) // (16 x 516) = 5 at two, so its seed shape's 28 such boxes a sample fit a cluster of 8 blocks. None at
    taps 2 where the taps do not pack (float32; 5 channels)."""
    conv = load_config(SEEDS["instancenorm"]).producer.geometry()
    half = cluster_boxes(conv, 2)
    assert set(half) == {(th, tw, taps) for th in BOX_HEIGHTS for tw in BOX_WIDTHS for taps in GEMM_TAPS}
    assert (half[(16, 32, 1)], half[(16, 32, 2)]) == (3, 5)
    assert all(half[(th, tw, 2)] >= half[(th, tw, 1)] > 0 for th, tw, _ in half)
    for unpacked, elem in ((conv, 4), ({**conv, "cin": 5}, 2)):
        boxes = cluster_boxes(unpacked, elem)
        assert all(boxes[(th, tw, 2)] == 0 < boxes[(th, tw, 1)] for th, tw, _ in boxes)


@pytest.mark.parametrize("tw, th", [(16, 4), (16, 8), (32, 4), (32, 8), (30, 3)])
def test_output_stores_of_a_warp_hit_32_banks(tw, th):
    """Lane 4g + t stores D rows g (and g + 8) of channels 2t (and 2t + 1): word 2t * stride + g."""
    stride = gemm_tile(_conv(), ONE, ONE, tw, th).out_stride
    banks = {(2 * t * stride + g) % 32 for g in range(8) for t in range(4)}
    assert len(banks) == 32


def test_fits_takes_the_boxes_that_fit_every_window():
    conv = _conv(cin=16)
    windows = [(ONE, ONE), ((1, 4, 4), (1, 4, 4))]
    assert gemm_refusal(conv, windows) is None
    # 16 rows of 64 channels' outputs no longer fit beside the staged input and weights; 8 do.
    assert gemm_tile(conv, (1, 4, 4), (1, 4, 4), 32, 16).smem_bytes > SMEM_LIMIT
    assert gemm_tile(conv, (1, 4, 4), (1, 4, 4), 32, 8).smem_bytes <= SMEM_LIMIT
    assert gemm_max_height(conv, windows) == 8
    assert gemm_max_height(_conv(cin=3, cout=16), windows) == 16
    # A 16 x 16 pooling window makes a 16 x 32 box at any height: no box fits.
    big = gemm_tile(conv, (1, 16, 16), (1, 16, 16), 32, 4)
    assert big.smem_bytes > SMEM_LIMIT
    # gemm_refusal names each reason the kernels do not take a convolution for, and only those
    assert "shared memory" in gemm_refusal(conv, [(ONE, ONE), ((1, 16, 16), (1, 16, 16))])
    assert gemm_refusal({**conv, "transposed": True}, [(ONE, ONE)]) == "a transposed convolution"
    assert "72 output channels" in gemm_refusal({**conv, "cout": 72}, [(ONE, ONE)])
    assert "staged words" in gemm_refusal({**conv, "cin": 240}, [(ONE, ONE)])


@pytest.mark.parametrize("name", ["groupnorm", "instancenorm"])
@pytest.mark.parametrize("tw, th", [(16, 4), (32, 8)])
def test_a_loads_of_a_warp_hit_32_banks_at_the_seeds(name, tw, th):
    """Lane 4g + t reads A row g (consecutive outputs) at its channel t: word g + t * channel_stride.
    Rows and channels start on 16 bytes, for the 16-byte copies that stage them."""
    tile = gemm_tile(load_config(SEEDS[name]).producer.geometry(), ONE, ONE, tw, th)
    assert tile.input_row % 4 == 0 and tile.input[2] <= tile.input_row < tile.input[2] + 4
    assert tile.channel_stride % 4 == 0 and tile.channel_stride >= tile.input[0] * tile.input[1] * tile.input_row
    assert len({(g + t * tile.channel_stride) % 32 for g in range(8) for t in range(4)}) == 32


def test_direct_footprint_of_the_transposed_seed():
    """ConvTranspose3d(3 -> 16, k=3, stride 2, padding 1) under a 2 x 2 x 2 max pool: a window's
    outputs read 2 input positions a dimension (each output parity its own taps), and each further
    window in the row one more along w: 3 x 2 x 2 x (1 + cells) values."""
    conv = load_config(SEEDS["maxpool_gap"]).producer.geometry()
    window = ((2, 2, 2), (2, 2, 2))
    assert [direct_footprint(conv, *window, cells) for cells in (1, 2, 4)] == [24, 36, 60]
    assert direct_row_cells(conv, *window) == 4
    # A cell stride the convolution's stride does not divide: the taps of a window's outputs are not
    # known at compile time, so nothing goes to registers.
    assert direct_footprint(conv, (3, 3, 3), (3, 3, 3), 1) == 0


def test_direct_footprint_of_plain_convolutions():
    """A plain convolution's single output reads its whole kernel: 3 x 3 x 3 x 3 = 81 for the conv3d
    seed, more than FOOTPRINT_MAX, so its threads keep reading taps from memory (one cell a thread)."""
    conv3d = load_config(SEEDS["instancenorm"]).producer.geometry()
    assert direct_footprint(conv3d, ONE, ONE, 1) == 0 and direct_row_cells(conv3d, ONE, ONE) == 1
    small = {"cin": 4, "cout": 8, "kernel": (2, 2, 2), "stride": (1, 1, 1), "padding": (0, 0, 0), "transposed": False}
    # Outputs in a row share inputs: 4 channels x 2 x 2 x (1 + cells).
    assert [direct_footprint(small, ONE, ONE, cells) for cells in (1, 2, 4)] == [32, 48, 0]
    assert direct_row_cells(small, ONE, ONE) == 2
    strided = {**small, "stride": (1, 1, 2), "padding": (0, 0, 1)}
    assert direct_footprint(strided, ONE, ONE, 2) == 4 * 2 * 2 * 4 <= FOOTPRINT_MAX


def _seed_conv(key: str) -> dict:
    return load_config(SEEDS[key]).producer.geometry()


def _contributions_1d(kernel: int, stride: int, padding: int, out_pad: int, size: int, transposed: bool) -> set:
    """(output, input, tap) of every product a 1-D convolution sums, from PyTorch's definition."""
    if transposed:
        out = (size - 1) * stride - 2 * padding + kernel + out_pad
        return {(i * stride - padding + k, i, k) for i in range(size) for k in range(kernel)
                if 0 <= i * stride - padding + k < out}
    out = (size + 2 * padding - kernel) // stride + 1
    return {(o, o * stride - padding + k, k) for o in range(out) for k in range(kernel)
            if 0 <= o * stride - padding + k < size}


@pytest.mark.parametrize("transposed", [True, False])
def test_wide_axis_classes_compute_exactly_the_convolution(transposed):
    """Along an axis, the wide kernels' classes (plain convolutions over the padded input) multiply
    exactly the products the convolution sums, each once, with every output in one class, within
    the padded input's extent, and no zero tap of a transposed convolution's upsampled input."""
    for kernel, stride, padding, out_pad, size in itertools.product((1, 2, 3, 4, 5), (1, 2, 3), (0, 1, 2, 4),
                                                                    (0, 1, 2), (1, 2, 5, 8)):
        if out_pad >= stride or (out_pad and not transposed):
            continue
        want = _contributions_1d(kernel, stride, padding, out_pad, size, transposed)
        out = ((size - 1) * stride - 2 * padding + kernel + out_pad if transposed
               else (size + 2 * padding - kernel) // stride + 1)
        if out < 1:
            continue
        axis = wide_axes({"kernel": (1, 1, kernel), "stride": (1, 1, stride), "padding": (0, 0, padding),
                          "transposed": transposed})[2]
        got, outputs = [], []
        for r in range(axis.classes):
            for q in range(axis.size(r, out)):
                outputs.append(axis.output(r, q))
                for m in range(axis.taps(r)):
                    padded = q * axis.step + axis.offset(r) + m
                    assert 0 <= padded < axis.extent(out) or r not in axis.live(out)
                    if 0 <= padded - axis.lead < size:
                        tap = r + stride * (axis.taps(r) - 1 - m) if transposed else m
                        got.append((axis.output(r, q), padded - axis.lead, tap))
        case = (kernel, stride, padding, out_pad, size)
        assert sorted(outputs) == list(range(out)), case
        assert len(got) == len(set(got)) and set(got) == want, case
        assert axis.max_taps == (-(-kernel // stride) if transposed else kernel)


def test_wide_workspace_holds_every_class_s_weights():
    seed = _seed_conv("batchnorm")  # ConvTranspose3d(64 -> 128, k 5), stride 1: one class, its forward form
    assert [(a.classes, a.lead, a.offset(0)) for a in wide_axes(seed)] == [(1, 4, 0)] * 3
    # packed weights: every tap, 64 input channels in chunks of 16, 128 output channels in tiles of 64 or 128
    assert wide_workspace_words(seed) == 125 * 64 * 128
    assert wide_workspace_words({**seed, "cin": 20, "cout": 72}) == 125 * 32 * 128
    # stride 2, k 3: 8 classes of at most 2 x 2 x 2 taps (zeros past a class's own)
    assert wide_workspace_words({**seed, "kernel": (3, 3, 3), "stride": (2, 2, 2)}) == 8 * 8 * 64 * 128


@pytest.mark.parametrize("bm", [128, 256])
@pytest.mark.parametrize("stride, kw, padding", [(1, 5, 4), (2, 3, 1), (1, 1, 0), (3, 7, 2), (3, 2, 0)])
@pytest.mark.parametrize("transposed", [False, True])
def test_wide_rows_fit_is_the_worst_run_of_outputs(bm, stride, kw, padding, transposed):
    """wide_rows_fit (the constraint's and the launcher's check) against every run of bm consecutive
    outputs of every class's rows (the output's, or a transposed convolution's parity classes): the
    rows it spans times a padded row's words fit a channel's capacity, and a row is at most a 16-byte
    unit per thread."""
    conv = {"cin": 16, "cout": 64, "kernel": (1, 1, kw), "stride": (1, 1, stride), "padding": (0, 0, padding),
            "transposed": transposed}
    axis = wide_axes(conv)[2]
    cap = wide_slab_stride(conv, bm)
    assert cap % 4 == 0 and cap >= bm
    for width in range(1, 300):
        worst = max([1] + [max((p0 + bm - 1) // q - p0 // q + 1 for p0 in range(q))
                           for q in (axis.size(r, width) for r in axis.live(width))])
        row = wide_row_words(conv, width)
        assert row % 4 == 0 and axis.extent(width) <= row < axis.extent(width) + 4
        if not transposed:
            assert axis.extent(width) == (width - 1) * stride + kw
        assert wide_rows_fit(conv, bm, 7, width) == (worst * row <= cap and row <= 1024), width
    assert wide_rows_fit(conv, bm, 36, 36)  # the seed's output rows, for every bm


@pytest.mark.parametrize("staging", ["row", "plane"])
@pytest.mark.parametrize("window", [((2, 2, 2), (2, 2, 2)), ((1, 3, 3), (1, 2, 2)), ((1, 2, 3), (1, 3, 1)),
                                    ((3, 3, 3), (3, 3, 3))])
def test_wide_brick_is_the_largest_brick_of_whole_windows_that_fits(staging, window):
    """wide_main's box where the chain pools (tiles.wide_brick, the kernel's ft_wide_brick): whole
    windows, as many along w as fit, then whole pooled rows, then planes; its outputs within bm and the
    rows it stages within a staged channel. One more window along the axis it grew last does not fit,
    and where one window does not fit, wide_rows_fit refuses the variant."""
    conv = {"cin": 32, "cout": 96, "kernel": (3, 3, 3), "stride": (1, 1, 1), "padding": (1, 1, 1), "transposed": False}
    (kd, kh, kw), (sd, sh, sw) = window
    axis_h = wide_axes(conv)[1]
    for bm in (128, 256):
        cap = wide_slab_stride(conv, bm, staging)
        for pooled, width in [((3, 5, 7), 16), ((4, 9, 31), 64), ((2, 2, 200), 400), ((5, 40, 3), 9), ((1, 1, 1), 600)]:
            row = wide_row_words(conv, width)

            def fits(pd: int, ph: int, pw: int) -> bool:
                nd, nh, nw = (pd - 1) * sd + kd, (ph - 1) * sh + kh, (pw - 1) * sw + kw
                rows = nd * ((nh - 1) * axis_h.step + axis_h.max_taps) if staging == "plane" else nd * nh
                return nd * nh * nw <= bm and rows * row <= cap

            pd, ph, pw = wide_brick(conv, bm, staging, window, pooled, width)
            assert wide_rows_fit(conv, bm, 1, width, staging, window) == (pw > 0 and row <= 1024)
            if pw == 0:
                assert not fits(1, 1, 1)
                continue
            assert fits(pd, ph, pw) and pd <= pooled[0] and ph <= pooled[1] and pw <= pooled[2]
            if pw < pooled[2]:
                assert (pd, ph) == (1, 1) and not fits(1, 1, pw + 1)
            elif ph < pooled[1]:
                assert pd == 1 and not fits(1, ph + 1, pw)
            elif pd < pooled[0]:
                assert not fits(pd + 1, ph, pw)
    # the seed-like case: 2 x 2 x 2 windows of a 32-wide output, 256 outputs a box: two pooled rows of 16
    assert wide_brick(conv, 256, "row", ((2, 2, 2), (2, 2, 2)), (8, 16, 16), 32) == (1, 2, 16)


def test_wide_brick_folds_a_strided_transposed_convolutions_classes():
    """After a stride-2 transposed convolution (the bench's 32 -> 64, k 4) every 2 x 2 x 2 window holds
    one output of each of 8 classes: a brick's class box takes at most ceil(n / 2) of n outputs along
    each axis, so a brick holds bm windows (the fold's bound too): whole pooled rows of 32, 4 of them
    at bm 128 and 8 at 256. The windows' running values (bm x bn words) stay in shared memory beside
    the stages: at 256 x 128 they take 128 KB, and no variant of that tile pools (wide_pool_fits)."""
    conv = {"cin": 32, "cout": 64, "kernel": (4, 4, 4), "stride": (2, 2, 2), "padding": (1, 1, 1), "transposed": True}
    window = ((2, 2, 2), (2, 2, 2))
    assert wide_folds(conv) and not wide_folds({**conv, "stride": (1, 1, 1)})
    # one output of each class a window: the pool's window and stride are the classes' stride on every axis
    assert wide_folds_aligned(conv, window)
    assert not wide_folds_aligned(conv, ((3, 3, 3), (2, 2, 2))) and not wide_folds_aligned(conv, ((2, 2, 2), (1, 1, 1)))
    mixed = {**conv, "stride": (1, 3, 2)}
    assert not wide_folds_aligned(mixed, window) and wide_folds_aligned(mixed, ((1, 3, 2), (1, 3, 2)))
    assert not wide_folds_aligned({**conv, "stride": (1, 1, 1)}, ((1, 1, 1), (1, 1, 1)))  # no classes to fold
    for bm, rows in ((128, 4), (256, 8)):
        for staging in ("row", "plane"):
            assert wide_brick(conv, bm, staging, window, (16, 32, 32), 64) == (1, rows, 32)
    assert wide_depth(conv, 256, 128, 1, "row") == 3 and wide_depth(conv, 256, 128, 1, "row", fold=True) == 0
    assert not any(wide_pool_fits(conv, 256, 128, wm, 1, staging) for wm in (2, 4) for staging in ("row", "plane"))
    assert wide_depth(conv, 128, 128, 1, "plane", fold=True) == 2 and wide_pool_fits(conv, 128, 128, 2, 1, "plane")
    # stride 3 along w under windows of 2: a class takes at most ceil(n / 3) of n outputs, so at bm 128
    # the fold's bound stops the brick (128 windows, 86 outputs a class); at 256, the pooled row's end
    thirds = {**conv, "kernel": (1, 1, 4), "stride": (1, 1, 3), "padding": (0, 0, 1)}
    assert wide_brick(thirds, 128, "row", ((1, 1, 2), (1, 1, 2)), (1, 1, 200), 400) == (1, 1, 128)
    assert wide_brick(thirds, 256, "row", ((1, 1, 2), (1, 1, 2)), (1, 1, 200), 400) == (1, 1, 200)


def test_wide_pool_fits_the_stages_buffers():
    """wide_main pools a box through the stages' buffers, bn / passes channels at a time (passes at most
    a warp's n-tiles): even a convolution with the smallest stages (3 input channels, one tap) pools at
    every variant that compiles, and so does the bench's 32 -> 128 convolution; one stage alone would
    not hold a 128-output box of 64 channels where each warp holds two n-tiles."""
    tiny = {"cin": 3, "cout": 4, "kernel": (1, 1, 1), "stride": (1, 1, 1), "padding": (0, 0, 0), "transposed": False}
    vgg = {"cin": 32, "cout": 128, "kernel": (1, 3, 3), "stride": (1, 1, 1), "padding": (0, 1, 1), "transposed": False}
    for conv in (tiny, vgg):
        for bm, bn, wm, blocks, staging in itertools.product((128, 256), (64, 128), (2, 4), (1, 2), ("row", "plane")):
            if wide_depth(conv, bm, bn, blocks, staging):
                assert wide_pool_fits(conv, bm, bn, wm, blocks, staging), (conv["cin"], bm, bn, wm, blocks, staging)
    assert wide_stage_words(tiny, 128, 64, "row") < 32 * (128 + 4)


def _plane_stage_rows(axis_h, axis_w, rh: int, rw: int, bm: int, height: int, width: int) -> int:
    """The most padded rows a plane stage stages for any box of class (rh, rw), as ft_wide_box counts
    them: each depth's run of output rows, STEP along h apart, plus the last one's overhang (its live
    taps kh0 .. kh0 + nkh - 1, all of the class's at most)."""
    qh, qw = axis_h.size(rh, height), axis_w.size(rw, width)
    most = 0
    for depth_rows in (1, 2, 3):  # the class's outputs over a few depths
        outputs = depth_rows * qh * qw
        for p0 in range(0, outputs, bm):
            first, last = p0 // qw, (min(p0 + bm, outputs) - 1) // qw
            runs: dict[int, int] = {}
            for row in range(first, last + 1):
                runs[row // qh] = runs.get(row // qh, 0) + 1
            most = max(most, sum((n - 1) * axis_h.step + axis_h.taps(rh) for n in runs.values()))
    return most


@pytest.mark.parametrize("bm", [128, 256])
def test_wide_plane_stage_rows_bound_every_box(bm):
    """wide_staged_rows for a plane stage (the constraint's and the launcher's bound on a staged
    channel's rows) is at least what any box of any class stages."""
    for kernel, stride, padding, transposed in [(3, 1, 1, False), (4, 2, 1, True), (3, 2, 1, True), (5, 1, 0, True),
                                                (3, 2, 0, False)]:
        conv = {"kernel": (1, kernel, kernel), "stride": (1, stride, stride), "padding": (0, padding, padding),
                "transposed": transposed}
        _, axis_h, axis_w = wide_axes(conv)
        for height, width in [(1, 1), (2, 3), (5, 7), (9, 36), (17, 64), (40, 5)]:
            bound = wide_staged_rows(conv, bm, height, width, "plane")
            worst = max([0] + [_plane_stage_rows(axis_h, axis_w, rh, rw, bm, height, width)
                               for rh in axis_h.live(height) for rw in axis_w.live(width)])
            assert worst <= bound, (conv, height, width)
            assert wide_staged_rows(conv, bm, height, width, "row") <= bound


def test_wide_pipeline_depth_within_the_shared_memory():
    seed = _seed_conv("batchnorm")
    assert wide_depth(seed, 256, 128) == 2 and wide_smem_bytes(seed, 256, 128, 3) > SMEM_LIMIT
    assert wide_depth(seed, 128, 64) == 3 and wide_smem_bytes(seed, 128, 64, 3) <= SMEM_LIMIT
    # two blocks a multiprocessor: each within half of it
    assert wide_depth(seed, 256, 64, 2) == 2 and wide_smem_bytes(seed, 256, 64, 2) <= WIDE_PAIR_LIMIT
    assert wide_depth(seed, 128, 128, 2) == 0
    # 11 taps a row of 16 channels by 128: even two stages of weights (2 x 88 KB) and input do not fit
    assert wide_depth({**seed, "kernel": (1, 11, 11)}, 256, 128) == 0
    # a plane stage holds the weights of every kh: not 5 x 5 x 16 x 64 (100 KB) twice, but the 2 x 2 taps
    # of a stride-2, k 4 transposed convolution's classes at three stages
    assert all(wide_depth(seed, bm, bn, 1, "plane") == 0 for bm in (128, 256) for bn in (64, 128))
    upsample = {**seed, "cin": 32, "cout": 64, "kernel": (4, 4, 4), "stride": (2, 2, 2), "padding": (1, 1, 1)}
    assert wide_depth(upsample, 256, 64, 1, "plane") == 3


@pytest.mark.parametrize("conv", [_conv(cin=3, cout=16), _conv(cin=5, cout=24, kernel=(2, 3, 2), stride=(1, 2, 1))],
                         ids=["conv2d", "conv3d_strided"])
def test_half_mma_fragments_compute_the_convolution(conv):
    """The index algebra of gemm.cuh.j2 at 2 bytes, step by step on the CPU: the staged input box
    (ft_gemm_prefetch_input's layout), each lane's A registers (ft_gemm_tiles: rows g and g + 8 at
    ft_gemm_m_offset, its channels 2t and 2t + 1 at ft_gemm_k_offset of columns 0 and 8 of the step, two
    values a register), its B registers (ft_gemm_stage_weights' words, ft_gemm_load_b), multiplied as PTX
    defines mma.m16n8k16 (A rows g, g + 8 at columns 2t, 2t + 1 and 2t + 8, 2t + 9; B rows 2t, 2t + 1 and
    2t + 8, 2t + 9 at column g; D rows g, g + 8 at columns 2t, 2t + 1): every output of the box is the
    convolution's."""
    import random

    rng = random.Random(0)
    tile = gemm_tile(conv, ONE, ONE, 16, 4, elem=2)
    (kd, kh, kw), (sd, sh, sw) = conv["kernel"], conv["stride"]
    cin, cout, cinp, gk = conv["cin"], conv["cout"], tile.cin_pad, tile.k
    tid, tih, tiw = tile.input
    rd, rh, rw = tile.region
    x = [[[[rng.uniform(-1, 1) for _ in range(tiw)] for _ in range(tih)] for _ in range(tid)] for _ in range(cin)]
    w = [[[[[rng.uniform(-1, 1) for _ in range(kw)] for _ in range(kh)] for _ in range(kd)] for _ in range(cin)]
         for _ in range(cout)]
    cs, row = tile.channel_stride, tile.input_row
    xs = [0.0] * (cinp * cs)  # one buffer; padding channels zero
    for ci, d, h, c in itertools.product(range(cin), range(tid), range(tih), range(tiw)):
        xs[ci * cs + (d * tih + h) * row + c] = x[ci][d][h][c]

    def k_offset(k0):
        tap = k0 // cinp
        return 0 if k0 >= gk else (k0 % cinp) * cs + ((tap // (kh * kw)) * tih + tap // kw % kh) * row + tap % kw

    def m_offset(m):
        if m >= tile.m:
            return 0
        t = m // rw
        return (t // rh * sd * tih + t % rh * sh) * row + m % rw * sw

    def weight(n, k):  # B[k][n], zero for padding (ft_gemm_stage_weights' `real`)
        tap, ci = k // cinp, k % cinp
        if n >= cout or ci >= cin or k >= gk:
            return 0.0
        return w[n][ci][tap // (kh * kw)][tap // kw % kh][tap % kw]

    pairs, gnt = -(-cout // 16), cout // 8
    words = []  # each word: its (low, high) values
    for i in range(tile.weight_words):
        e, lane, rest = i % 4, i // 4 % 32, i // 128
        jp, ks = rest % pairs, rest // pairs
        n, k = (2 * jp + e // 2) * 8 + lane // 4, ks * 16 + 2 * (lane % 4) + 8 * (e % 2)
        words.append((weight(n, k), weight(n, k + 1)))
    for mt in range(tile.m_tiles):
        for j in range(gnt):
            acc = {lane: [0.0] * 4 for lane in range(32)}
            for ks in range(tile.k_pad // 16):
                a_mat = [[None] * 16 for _ in range(16)]
                b_mat = [[None] * 8 for _ in range(16)]
                lo, hi = k_offset(ks * 16), k_offset(ks * 16 + 8)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    rows = [m_offset(mt * 16 + g) + 2 * t * cs, m_offset(mt * 16 + g + 8) + 2 * t * cs]
                    regs = [(xs[p], xs[p + cs]) for p in (rows[0] + lo, rows[1] + lo, rows[0] + hi, rows[1] + hi)]
                    for r, (low, high) in enumerate(regs):  # PTX: a0..a7, two a register, low first
                        for half, value in enumerate((low, high)):
                            i = 2 * r + half
                            a_mat[g + 8 * (i % 4 >= 2)][2 * t + (i & 1) + 8 * (i >= 4)] = value
                    vec = ((ks * pairs + j // 2) * 32 + lane) * 4  # ft_gemm_load_b: the uint4 of n-tile pair j // 2
                    for r in range(2):
                        for half, value in enumerate(words[vec + 2 * (j % 2) + r]):
                            i = 2 * r + half
                            b_mat[2 * t + (i & 1) + 8 * (i >= 2)][g] = value
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    for c in range(4):
                        m, n = g + 8 * (c >= 2), 2 * t + c % 2
                        acc[lane][c] += sum(a_mat[m][k] * b_mat[k][n] for k in range(16))
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for c in range(4):
                    m, n = mt * 16 + g + 8 * (c >= 2), j * 8 + 2 * t + c % 2
                    if m >= tile.m:
                        continue
                    od, oh, ow = m // (rh * rw), m // rw % rh, m % rw
                    want = sum(x[ci][od * sd + a][oh * sh + b][ow * sw + c2] * w[n][ci][a][b][c2]
                               for ci in range(cin) for a in range(kd) for b in range(kh) for c2 in range(kw))
                    assert acc[lane][c] == pytest.approx(want, abs=1e-9), (mt, j, lane, c)


@pytest.mark.parametrize("cin", [19, 37])
def test_wide_half_mma_fragments_compute_the_convolution(cin):
    """The K-tiled kernels' index algebra at 2 bytes (wide.cuh.j2), step by step on the CPU, for one m-tile of 16
    consecutive outputs along w and a pair of n-tiles, over every stage of input channels (cc) and tap kw: the
    padded input a channel pair to a word (ft_wide_pad_kernel: plane p holds channels 2p, 2p + 1, the lower in
    the low half; zero past cin), the packed weights (ft_wide_pack_kernel: word ((ks * NP + jp) * 32 + lane) * 4 +
    e at plane k = ks * 8 + t + 4 (e % 2), tap k // FT_WCK, channels 2 (cc * FT_WCK + k % FT_WCK) + 0, 1), each
    lane's A words (ft_wide_multiply: plane t of the k step's 8 at aoff = t * CS + its output's column, + kw,
    and 4 planes on), multiplied as PTX defines mma.m16n8k16: every output is the convolution's. An odd cin
    leaves the last pair half padding; at 37 a stage takes 32 channels in two k steps a tap."""
    import random

    from fusetune.tiles import WIDE_CHUNKS, wide_channel_chunk, wide_cin_padded, wide_planes

    rng = random.Random(1)
    taps, cout, width = 3, 16, 16
    ck = wide_channel_chunk(cin, 2)
    assert ck == (WIDE_CHUNKS[2][1] if cin >= WIDE_CHUNKS[2][1] else WIDE_CHUNKS[2][0])
    wck, cinp = wide_planes(ck, 2), wide_planes(wide_cin_padded(cin, 2), 2)  # FT_WCK, FT_WCINP: planes
    assert wck % 8 == 0 and cinp % wck == 0 and 2 * cinp >= cin
    halves, wks, cs = wck // 8, taps * wck // 8, width + taps + 5  # HALVES, FT_WKS; CS: any stride past a row
    x = [[rng.uniform(-1, 1) for _ in range(width + taps - 1)] for _ in range(cin)]
    w = [[[rng.uniform(-1, 1) for _ in range(taps)] for _ in range(cin)] for _ in range(cout)]

    def pad_word(plane, col):  # ft_wide_pad_kernel: (low, high)
        return tuple(x[2 * plane + h][col] if 2 * plane + h < cin else 0.0 for h in range(2))

    def pack_word(cc, i):  # ft_wide_pack_kernel at 2 bytes, one row of taps, bn = 16 (NP = 1)
        e, lane, rest = i % 4, i // 4 % 32, i // 128
        jp, ks = rest % 1, rest // 1
        c, k = (2 * jp + e // 2) * 8 + lane // 4, ks * 8 + lane % 4 + 4 * (e % 2)
        kw, ci = k // wck, 2 * (cc * wck + k % wck)
        return tuple(w[c][ci + h][kw] if c < cout and kw < taps and ci + h < cin else 0.0 for h in range(2))

    acc = {lane: [[0.0] * 4 for _ in range(2)] for lane in range(32)}
    for cc in range(cinp // wck):  # a stage: FT_WCK planes of the padded input, staged CS words apart
        xs = [None] * (wck * cs)
        for p, col in itertools.product(range(wck), range(width + taps - 1)):
            xs[p * cs + col] = pad_word(cc * wck + p, col)
        packed = [pack_word(cc, i) for i in range(wks * 128)]
        for kw in range(taps):
            for half in range(halves):
                ks = kw * halves + half
                lo = half * 8 * cs + kw
                hi = lo + 4 * cs
                a_mat = [[None] * 16 for _ in range(16)]
                b_mat = [[None] * 8 for _ in range(16)]
                bmats = [b_mat, [[None] * 8 for _ in range(16)]]
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    aoff = [t * cs + g, t * cs + g + 8]  # rows g and g + 8: outputs at those columns
                    regs = [xs[aoff[0] + lo], xs[aoff[1] + lo], xs[aoff[0] + hi], xs[aoff[1] + hi]]
                    for r, pair in enumerate(regs):  # PTX: a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3
                        for h, value in enumerate(pair):
                            a_mat[g + 8 * (r % 2)][2 * t + h + 8 * (r // 2)] = value
                    v = packed[(ks * 1 + 0) * 128 + lane * 4:(ks * 1 + 0) * 128 + lane * 4 + 4]  # the uint4
                    for j in range(2):
                        for r in range(2):  # b0 (rows 2t, 2t + 1), b1 (rows 2t + 8, 2t + 9) of n-tile j
                            for h, value in enumerate(v[2 * j + r]):
                                bmats[j][2 * t + h + 8 * r][g] = value
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    for j in range(2):
                        for c in range(4):
                            m, n = g + 8 * (c >= 2), 2 * t + c % 2
                            acc[lane][j][c] += sum(a_mat[m][k] * bmats[j][k][n] for k in range(16))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for j, c in itertools.product(range(2), range(4)):
            m, n = g + 8 * (c >= 2), j * 8 + 2 * t + c % 2
            want = sum(x[ci][m + kw] * w[n][ci][kw] for ci in range(cin) for kw in range(taps))
            assert acc[lane][j][c] == pytest.approx(want, abs=1e-9), (lane, j, c)
