"""scripts/gpu-tests-split's dealing of the GPU tests over cards (the part that needs no GPU)."""
from __future__ import annotations

from conftest import import_script


def _split_module():
    return import_script("gpu-tests-split")


FILE = "tests/test_gpu.py::"
NODES = [FILE + "test_seed_end_to_end[convt3d_scale_maxpool_gap_clamp]",
         FILE + "test_inside_kernels_at_seed_shapes[convt3d_scale_maxpool_gap_clamp-direct]",
         FILE + "test_families_beyond_the_seeds[cudnn-conv2d_wide_bneval_relu_maxpool]",
         FILE + "test_families_beyond_the_seeds[gemm_wide-conv2d_wide_bneval_relu_maxpool]",
         FILE + "test_families_beyond_the_seeds[gemm_wide-conv3d_wide_relu_maxpool_long_rows]",
         FILE + "test_fault_injection"]


def test_a_chains_tests_are_one_group():
    split = _split_module()
    groups = [split.group(node) for node in NODES]
    assert groups[:5] == ["convt3d_scale_maxpool_gap_clamp"] * 2 + ["conv2d_wide_bneval_relu_maxpool"] * 2 + [
        "conv3d_wide_relu_maxpool_long_rows"]
    assert groups[5] == NODES[5]  # no parameters: a group of its own


def test_shares_keep_groups_on_one_card_and_balance():
    split = _split_module()
    shares = split.shares(NODES, 2)
    assert sorted(node for share in shares for node in share) == sorted(NODES)  # each test once
    for share in shares:
        for node in share:  # a group's other tests are on the same card
            assert all(other in share for other in NODES if split.group(other) == split.group(node))
    assert sorted(len(share) for share in shares) == [3, 3]
    many = split.shares(NODES, 8)
    assert len(many) == 4 and all(many)  # four groups: four cards get work, none an empty share


def test_cold_search_passes_the_search_options_on_and_names_corpus_chains():
    cold = import_script("cold-search")
    args, options = cold.parse_args(["-k", "conv3d", "--limit-s", "30", "--", "--budget-s", "60", "--trials", "8"])
    assert options == ["--budget-s", "60", "--trials", "8"] and args.limit_s == 30.0
    chosen = cold.select(args)
    assert chosen and all("conv3d" in p.stem and p.is_file() for p in chosen)
    assert len(cold.select(cold.parse_args([])[0])) == len(cold.DEFAULT_CHAINS)
    record = {"name": "c", "shape": [1, 2], "wall_s": 61.0, "exit": 0, "split": ["time: prepare 3.0 s"],
              "search": {"results": [{"status": "tuned", "candidate": {"producer.impl": "gemm"}, "speedup": 2.0,
                                      "counts": {"ok": 5}}]}}
    line = cold.format_line(record, 60.0)
    assert "61.0 s" in line and "gemm" in line and "2.00x" in line and "OVER" in line
    assert "OVER" not in cold.format_line({**record, "wall_s": 59.0}, 60.0)
