"""Search spaces declared beside the templates."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from fusetune.codegen import plan_facts, plan_space
from fusetune.worlds import WORLDS
from fusetune.config import load_config, parse_config
from fusetune.errors import FusetuneError
from fusetune.plan import make_plan
from fusetune.space import PlanSpace, candidate_key, load_family

from conftest import ROOT, SEEDS

FAMILIES = ("stats", "plane_reduce", "window_map", "channel_reduce")


@pytest.mark.parametrize("family", FAMILIES)
def test_load_family(family):
    space = load_family(family)
    assert space.family == family
    assert space.doc
    assert space.params
    for p in space.params:
        assert p.default in p.choices, p.name
        assert len(set(p.choices)) == len(p.choices), p.name
    assert space.default() == {p.name: p.default for p in space.params}
    assert space.size() == math.prod(len(p.choices) for p in space.params)


def test_declared_parameters():
    stats = load_family("stats")
    assert [p.name for p in stats.params] == ["block", "vec", "reduce", "split"]
    assert [p.name for p in stats.compile_params] == ["block", "vec", "reduce"]  # split is a run-time argument
    assert dict((p.name, p.choices) for p in stats.params)["vec"] == (1, 4)
    assert [p.name for p in load_family("window_map").params] == ["block", "ilp"]
    assert load_family("window_map").constraints == ()
    assert [p.name for p in load_family("plane_reduce").compile_params] == ["block", "reduce"]
    assert [p.name for p in load_family("channel_reduce").compile_params] == ["block", "vec", "unroll"]


def test_finalize_is_a_fixed_stage():
    fin = load_family("finalize")
    assert fin.params == () and fin.variants() == [{}] and fin.size() == 1 and fin.variant_index({}) == 0


def _stats_candidate(**values):
    space = PlanSpace(families=(load_family("stats"),))
    candidate = space.default()
    candidate.update({f"stats.{k}": v for k, v in values.items()})
    return space, candidate


@pytest.mark.parametrize("S", [10, 4097, 4098, 4099])
def test_vec4_needs_plane_size_multiple_of_4(S):
    space, candidate = _stats_candidate(vec=4, split=1)
    broken = space.violations(candidate, {"S": S})
    assert len(broken) == 1
    assert broken[0].startswith("stats: ") and "S % vec == 0" in broken[0]


@pytest.mark.parametrize("S", [4, 16, 4096, 4100])
def test_vec4_passes_when_plane_size_is_multiple_of_4(S):
    space, candidate = _stats_candidate(vec=4, split=1)
    assert space.violations(candidate, {"S": S}) == []


def test_vec1_takes_any_plane_size():
    space, candidate = _stats_candidate(vec=1, split=1)
    assert space.violations(candidate, {"S": 4099}) == []


def test_split_constraint():
    # split * block * vec <= 4 * S, or split == 1
    space, candidate = _stats_candidate(vec=4, block=256, split=4)
    assert space.violations(candidate, {"S": 4096}) == []
    broken = space.violations(candidate, {"S": 16})
    assert len(broken) == 1 and "more blocks than a plane has work for" in broken[0]


def test_channel_reduce_vec_constraint():
    space = PlanSpace(families=(load_family("channel_reduce"),))
    candidate = space.default()
    assert candidate["channel_reduce.vec"] == 4
    assert space.violations(candidate, {"S": 9 * 17 * 21}) != []
    assert space.violations(candidate, {"S": 14 * 30 * 30}) == []
    candidate["channel_reduce.vec"] = 2
    assert space.violations(candidate, {"S": 14 * 30 * 30}) == []
    assert space.violations(candidate, {"S": 9 * 17 * 21}) != []


def test_violations_over_several_families():
    space = PlanSpace(families=(load_family("stats"), load_family("plane_reduce")))
    candidate = space.default()
    candidate.update({"stats.vec": 4, "stats.split": 1, "plane_reduce.split": 32, "plane_reduce.block": 512})
    broken = space.violations(candidate, {"S": 10, "P": 10})
    assert [b.split(":")[0] for b in broken] == ["stats", "plane_reduce"]
    assert space.violations(candidate, {"S": 4096, "P": 8192}) == []


@pytest.mark.parametrize("family", [*FAMILIES, "finalize"])
def test_variant_index_round_trips(family):
    space = load_family(family)
    variants = space.variants()
    assert len(variants) == math.prod(len(p.choices) for p in space.compile_params)
    assert len({tuple(sorted(v.items())) for v in variants}) == len(variants)
    for i, v in enumerate(variants):
        assert space.variant_index(v) == i
        # run-time parameters do not pick a variant
        full = {**v, **{p.name: p.choices[-1] for p in space.params if not p.compile_time}}
        assert space.variant_index(full) == i


def test_variant_index_rejects_unknown_values():
    space = load_family("stats")
    with pytest.raises(ValueError):
        space.variant_index({"block": 100, "vec": 4, "reduce": "warp"})


def test_plan_space_of_seeds():
    space = plan_space(make_plan(load_config(SEEDS["groupnorm"])))
    assert [f.family for f in space.families] == ["producer", "stats", "finalize", "window_map", "direct_stats",
                                                  "direct_main", "gemm_stats", "gemm_main", "extrema_map", "gemm_cluster"]
    assert space.names()[:8] == ["producer.impl", "producer.layout", "producer.store", "producer.form", "stats.block",
                                 "stats.vec", "stats.reduce", "stats.split"]
    assert space.default() in list(space.all())
    assert space.stage_values(space.default()) == {
        "producer": {"impl": "cudnn", "layout": "contiguous", "store": "float", "form": "native"},
        "stats": {"block": 256, "vec": 4, "reduce": "warp", "split": 4}, "finalize": {},
        "window_map": {"block": 256, "ilp": 2},
        "direct_stats": {"block": 128, "ct": 4, "reduce": "warp", "split": 16},
        "direct_main": {"block": 256, "ct": 8, "reduce": "warp", "cells": 2, "split": 4},
        "gemm_stats": {"taps": 1, "bregs": 1, "block": 256, "mt": 1, "tw": 32, "th": 8, "split": 4},
        "gemm_main": {"taps": 1, "block": 256, "mt": 1, "tw": 32, "th": 8, "split": 4},
        "extrema_map": {"block": 256, "ilp": 2},
        "gemm_cluster": {"taps": 1, "block": 256, "mt": 1, "tw": 32, "th": 8, "split": 8}}
    # Distinct candidates: cuDNN's (2 layouts x stats x window_map; a plain convolution has no
    # second form) plus the direct kernels' (no layout;
    # direct_main's reduction strategy matters only for a plane reduction, not this window map), plus
    # the tensor-core kernels' (no layout either), with the convolution twice (gemm) or once
    # (gemm_extrema: the statistics pass, then extrema_map; gemm_store: the statistics pass, then cuDNN's
    # main kernel).
    cudnn = 2 * (3 * 2 * 2 * 6) * (3 * 3)
    direct = (2 * 4 * 2 * 4) * (2 * 5 * 3 * 4)  # direct_main: block, ct, cells (infeasible ones too), split
    # (taps, two taps a half k step, matters only where they pack: at 2 bytes, not this float32 chain's 8 channels)
    gemm_main = 2 * 2 * 2 * 3 * 4  # block, mt, tw, th, split
    gemm_stats = gemm_main * 2  # and bregs (every choice enumerated, infeasible ones too)
    gemm = gemm_stats * gemm_main
    gemm_extrema = gemm_stats * (3 * 3)
    # gemm_store: then cuDNN's window_map (its block and ilp), reading the stored output, in float or half (every
    # choice is enumerated; half is infeasible for this chain, see test_half_store_only_for_channel_reduce)
    gemm_store = gemm_stats * (3 * 3) * 2
    # gemm_cluster: one kernel (block, mt, tw, th, split: every choice enumerated, infeasible ones too).
    gemm_cluster = 2 * 2 * 2 * 2 * 4
    # spectral, gemm_wide, gemm_wide_recompute and cudnn_fused: not offered for this chain (their constraints
    # refuse them), so nothing varies under them (cudnn_fused's layout only where it folds): one candidate each.
    spectral = gemm_wide = gemm_wide_recompute = cudnn_fused = 1
    eager = inductor_default = inductor = 1  # PyTorch's own forward, torch.compile's of it: no kernel choices
    assert sum(1 for _ in space.all()) == (cudnn + direct + gemm + gemm_extrema + gemm_store + gemm_cluster + gemm_wide
                                           + gemm_wide_recompute + spectral + cudnn_fused + eager + inductor_default
                                           + inductor)


def test_candidates_are_canonical_where_a_choice_does_not_matter():
    space = plan_space(make_plan(load_config(SEEDS["groupnorm"])))
    default = space.default()
    direct = {**default, "producer.impl": "direct", "producer.layout": "channels_last", "stats.block": 512,
              "window_map.ilp": 4, "direct_main.reduce": "smem", "direct_main.ct": 8}
    canonical = space.canonical(direct)
    # Under the direct kernels, cuDNN's layout and the cuDNN-path stages are at their defaults ...
    assert canonical["producer.layout"] == "contiguous"
    assert canonical["stats.block"] == default["stats.block"] and canonical["window_map.ilp"] == default["window_map.ilp"]
    # ... the window map needs no in-block reduction, and what the direct kernels choose is kept.
    assert canonical["direct_main.reduce"] == "warp" and canonical["direct_main.ct"] == 8
    assert [f.family for f in space.active(canonical)] == ["producer", "finalize", "direct_stats", "direct_main"]
    cudnn = space.canonical({**default, "producer.layout": "channels_last", "direct_stats.ct": 16})
    assert cudnn["producer.layout"] == "channels_last" and cudnn["direct_stats.ct"] == 4  # the default
    assert space.canonical(canonical) == canonical  # idempotent
    # A plan without direct kernels never runs them, whatever is asked: the batch-norm seed offers cuDNN
    # and the statistics from spectra, and a direct candidate breaks the producer's constraint.
    batchnorm = plan_space(make_plan(load_config(SEEDS["batchnorm"])))
    asked = batchnorm.canonical({**batchnorm.default(), "producer.impl": "direct", "producer.layout": "channels_last"})
    assert asked["producer.layout"] == "contiguous"
    assert any("the direct world does not take this region" in v and "weights (constant memory holds" in v
               for v in batchnorm.violations(asked, {"sm": 90, **batchnorm.plan_facts}))
    assert {c["producer.impl"] for c in batchnorm.all()} == set(WORLDS)
    spectral = batchnorm.canonical({**batchnorm.default(), "producer.impl": "spectral", "stats.block": 512})
    assert spectral["stats.block"] == batchnorm.default()["stats.block"]  # cuDNN's statistics pass does not run
    assert [f.family for f in batchnorm.active(spectral)] == ["producer", "finalize", "spectral_stats"]


def test_all_under_producer_choices_is_all_filtered():
    """all({"producer.impl": x}) is the candidates of all() whose (canonical) choice agrees, in the
    same order: what a test of one world enumerates without the others'."""
    space = plan_space(make_plan(load_config(SEEDS["groupnorm"])))
    every = list(space.all())
    for impl in {c["producer.impl"] for c in every}:
        assert list(space.all({"producer.impl": impl})) == [c for c in every if c["producer.impl"] == impl]
    layout = {"producer.impl": "cudnn", "producer.layout": "channels_last"}
    assert list(space.all(layout)) == [c for c in every if all(c[k] == v for k, v in layout.items())]
    # a layout only cuDNN's world has: under the kernels' own worlds it is canonical "contiguous"
    assert {c["producer.impl"] for c in space.all({"producer.layout": "channels_last"})} == {"cudnn"}


def test_constraints_of_inactive_families_are_not_checked():
    plan = make_plan(load_config(SEEDS["groupnorm"]))
    space = plan_space(plan)
    facts = {"N": 3, "C": 64, "D": 1, "H": 35, "W": 43, "S": 1505, "OD": 1, "OH": 8, "OW": 10, "P": 80,
             "direct": 1, "direct_cells": 1, "family": "window_map"}
    direct = space.canonical({**space.default(), "producer.impl": "direct", "direct_main.split": 1,
                              "direct_main.cells": 1, "direct_stats.split": 1})
    assert direct["stats.vec"] == 4 and facts["S"] % 4  # stats' own constraint would fail, but stats does not run
    assert space.violations(direct, facts) == []
    assert space.violations({**direct, "direct_main.ct": 8}, facts) == []
    assert space.violations({**direct, "direct_main.ct": 32}, facts)  # registers: only a channel reduction takes 32
    broken = space.violations({**direct, "direct_stats.split": 64, "direct_stats.block": 256}, facts)
    assert broken and all(b.startswith("direct_stats:") for b in broken)


def test_half_store_only_for_channel_reduce():
    """gemm_store may keep its output in half precision less each plane's pivot only where the chain
    before the norm is affine (the statistics pass then holds y - pivot) and channel_reduce reads it."""
    for seed, offered in (("instancenorm", True), ("groupnorm", False), ("maxpool_gap", False)):
        plan = make_plan(load_config(SEEDS[seed]))
        assert bool(plan_facts(plan)["half_store"]) is offered, seed
    space = plan_space(make_plan(load_config(SEEDS["groupnorm"])))
    half = space.canonical({**space.default(), "producer.impl": "gemm_store", "producer.store": "half"})
    assert half["producer.store"] == "half"
    facts = {"half_store": 0, "gemm_store": 1, "gemm": 1, "sm": 90, "S": 1, "C": 64}
    assert any("half" in v for v in space.violations(half, facts))
    cudnn = space.canonical({**space.default(), "producer.store": "half"})
    assert cudnn["producer.store"] == "float"  # only gemm_store stores its output


def test_candidate_key_is_order_independent():
    a = {"stats.block": 256, "stats.vec": 4}
    b = {"stats.vec": 4, "stats.block": 256}
    assert candidate_key(a) == candidate_key(b) == "stats.block=256,stats.vec=4"
    assert candidate_key({**a, "stats.vec": 1}) != candidate_key(a)


def test_broken_declaration_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSETUNE_TEMPLATE_PATH", str(tmp_path))
    (tmp_path / "bad.yaml").write_text("family: bad\nparams:\n  block: {choices: [1, 2], default: 3}\n")
    with pytest.raises(FusetuneError, match="default 3 is not one of its choices"):
        load_family("bad")
    (tmp_path / "worse.yaml").write_text("family: worse\n")
    with pytest.raises(FusetuneError, match="broken template space declaration"):
        load_family("worse")
    with pytest.raises(FusetuneError, match="no template file missing.yaml"):
        load_family("missing")


def test_reports_show_only_the_choices_that_matter():
    space = plan_space(make_plan(load_config(SEEDS["groupnorm"])))
    cudnn = space.default()
    shown = space.relevant(cudnn)
    assert "producer.layout" in shown and "stats.vec" in shown
    assert not any(k.startswith("direct_") for k in shown)
    direct = space.canonical({**cudnn, "producer.impl": "direct"})
    shown = space.relevant(direct)
    assert "producer.layout" not in shown and not any(k.startswith(("stats.", "window_map.")) for k in shown)
    assert "direct_main.ct" in shown and "direct_main.reduce" not in shown  # a window map combines nothing


def test_spectral_variants_that_would_spill_are_infeasible():
    space = plan_space(make_plan(load_config(SEEDS["batchnorm"])))
    facts = {"sm": 90, "F": 13680, **space.plan_facts}
    spectral = space.canonical({**space.default(), "producer.impl": "spectral"})
    assert space.violations(spectral, facts) == []
    assert space.violations({**spectral, "spectral_stats.nt": 8, "spectral_stats.ct": 8}, facts)
    assert space.violations({**spectral, "spectral_stats.split": 256}, {**facts, "F": 60})  # more blocks than bins
    family = load_family("spectral_stats")
    compiled = [v for v in family.variants() if family.compiles(v, {})]
    assert compiled and all(v["nt"] * v["ct"] <= 32 for v in compiled) and len(compiled) < len(family.variants())


def test_cluster_only_where_a_sample_fits_its_shared_memory():
    """gemm_cluster keeps a whole sample's output in its cluster's shared memory: at conv3d's seed shape
    (16 x 14 x 30 x 30 a sample, 56 boxes of 8 x 32) a cluster of 8 holds it and one of 2 does not; a
    conv2d seed sample (64 x 126 x 126) fits no cluster, its small shape does."""
    from fusetune.search import shape_facts

    def feasible(seed: str, shape: tuple) -> dict:
        spec = load_config(SEEDS[seed])
        space = plan_space(make_plan(spec))
        facts = shape_facts(spec, make_plan(spec), shape, "9.0")
        cluster = [c for c in space.all() if c["producer.impl"] == "gemm_cluster"]
        assert cluster
        return {(c["gemm_cluster.th"], c["gemm_cluster.tw"], c["gemm_cluster.split"]): not space.violations(c, facts)
                for c in cluster}

    conv3d = feasible("instancenorm", (128, 3, 16, 32, 32))
    assert conv3d[(8, 32, 8)] and conv3d[(8, 32, 16)] and not conv3d[(8, 32, 2)]
    assert not any(feasible("groupnorm", (128, 8, 128, 128)).values())
    small = feasible("groupnorm", (3, 8, 37, 45))
    # 35 x 43 outputs: 5 x 3 boxes of 8 x 16 (4 a block of 4 fit), 5 x 2 of 8 x 32 (2 a block: 3 do not fit, and
    # 10 boxes are fewer than 16 blocks)
    assert small[(8, 16, 4)] and small[(8, 32, 8)] and not small[(8, 32, 4)] and not small[(8, 32, 16)]
    spec = load_config(SEEDS["instancenorm"])
    old = {**plan_space(make_plan(spec)).default(), "producer.impl": "gemm_cluster"}
    assert any("compute capability 9.0" in v for v in plan_space(make_plan(spec)).violations(
        old, shape_facts(spec, make_plan(spec), (128, 3, 16, 32, 32), "8.0")))


def test_cluster_variants_compiled_only_where_their_boxes_hold_whole_windows():
    """A pool of stride 16 leaves boxes 8 high without a whole window: those variants are not compiled
    (their kernel would have no window to write), so no default can pick one."""
    raw = yaml.safe_load(SEEDS["groupnorm"].read_text())
    raw["epilogue"] = [{"op": "group_norm", "groups": 16}, {"op": "max_pool", "kernel_size": 16}]
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert ("gemm_cluster" in plan.impl_stages)
    family = load_family("gemm_cluster")
    names = {"C": 64, **plan_space(plan).plan_facts}
    compiled = {(v["th"], v["tw"]) for v in family.variants() if family.compiles(v, names)}
    assert compiled == {(16, 16), (16, 32)}


#: Whole-weights tensor-core families with the taps choice (two taps of the input channels a half k step).
TAPS_FAMILIES = ("gemm_stats", "gemm_main", "gemm_cluster")


@pytest.mark.parametrize("chain", ["conv2d_fp16_cin3_relu_maxpool", "conv3d_bf16_cin3_groupnorm_relu_maxpool"])
def test_two_taps_a_half_k_step_compiled_only_where_they_pack(chain):
    """An image's 3 input channels at a half type (tests/chains: a conv2d in float16, gemm_main alone; a conv3d in
    bfloat16 under a group norm, gemm_stats, gemm_main and gemm_cluster): each family compiles taps 2 in 256-thread
    blocks of one m-tile a warp only, for the same boxes as its taps 1 there (gemm_stats at both bregs), and the
    search varies it. The float32 conv3d seed, 3 channels too, compiles none and holds taps at 1 (its ``when``)."""
    plan = make_plan(load_config(ROOT / "tests" / "chains" / f"{chain}.yaml"))
    space, names = plan_space(plan), {"C": plan.spec.producer.out_channels, **plan_facts(plan)}
    stages = [stage for stage in plan.stages if stage in TAPS_FAMILIES]
    assert stages == (["gemm_main"] if chain.startswith("conv2d") else list(TAPS_FAMILIES))
    for stage in stages:
        family = load_family(stage)
        compiled = [v for v in family.variants() if family.compiles(v, names)]
        packed = [v for v in compiled if v["taps"] == 2]
        boxes = {(v["tw"], v["th"]) for v in compiled if v["taps"] == 1 and v["block"] == 256 and v["mt"] == 1}
        assert packed and all(v["block"] == 256 and v["mt"] == 1 for v in packed), stage
        assert {(v["tw"], v["th"]) for v in packed} == boxes, stage
        assert len(packed) == len(boxes) * (2 if stage == "gemm_stats" else 1), stage
        assert _taps_under_its_world(space, plan, stage) == 2
    seed = make_plan(load_config(SEEDS["instancenorm"]))
    seed_space, seed_names = plan_space(seed), {"C": seed.spec.producer.out_channels, **plan_facts(seed)}
    assert seed.spec.producer.in_channels == 3 and seed_names["gemm_taps"] == 1
    for stage in TAPS_FAMILIES:
        family = load_family(stage)
        assert not [v for v in family.variants() if v["taps"] == 2 and family.compiles(v, seed_names)], stage
        assert _taps_under_its_world(seed_space, seed, stage) == 1


def _taps_under_its_world(space: PlanSpace, plan, stage: str) -> int:
    """A stage's taps in the canonical candidate of the first world running it with taps 2 asked for."""
    impl = next(impl for impl, stages in plan.impl_stages.items() if stage in stages)
    return space.canonical({**space.default(), "producer.impl": impl, f"{stage}.taps": 2})[f"{stage}.taps"]


def test_wide_variants_compiled_and_feasible_at_the_seed():
    """The transposed batch-norm seed's K-tiled variants: every (bm, bn, wm) at one block a multiprocessor,
    at two only 128 x 64 (32 accumulators a thread; 256 x 64 spilled), a row of taps a stage (the weights
    of its 5 x 5 plane of taps do not fit);
    at its shape (rows 36 wide) every compiled one is feasible at some split, none at a split whose
    blocks outnumber a sample's runs of outputs."""
    from fusetune.search import shape_facts
    spec = load_config(SEEDS["batchnorm"])
    plan = make_plan(spec)
    space = plan_space(plan)
    family = load_family("wide_stats")
    names = {"C": 128, **space.plan_facts}
    compiled = {(v["bm"], v["bn"], v["wm"], v["staging"], v["blocks"]) for v in family.variants()
                if family.compiles(v, names)}
    assert compiled == {(bm, bn, wm, "row", 1) for bm in (128, 256) for bn in (64, 128) for wm in (2, 4)} | {
        (128, 64, 2, "row", 2), (128, 64, 4, "row", 2)}
    facts = shape_facts(spec, plan, (16, 64, 16, 32, 32), "9.0")
    wide = [c for c in space.all() if c["producer.impl"] == "gemm_wide"]
    feasible = {(c["wide_stats.bm"], c["wide_stats.bn"], c["wide_stats.wm"], c["wide_stats.staging"],
                 c["wide_stats.blocks"]) for c in wide if not space.violations(c, facts)}
    assert feasible == compiled
    # 5 x 5 x 32 outputs a sample (800): blocks of 256 outputs, 4 a sample and channel tile at most
    small = shape_facts(spec, plan, (2, 64, 1, 1, 28), "9.0")
    assert {c["wide_stats.split"] for c in wide if c["wide_stats.bm"] == 256 and not space.violations(c, small)} == {
        1, 2, 4}
    # rows 5 wide: 256 outputs span 52 rows of 12 staged words (the taps' overhang), over a channel's room
    narrow = shape_facts(spec, plan, (2, 64, 1, 1, 1), "9.0")
    assert all(any("must fit a staged channel" in v for v in space.violations(c, narrow)) for c in wide
               if c["wide_stats.staging"] == "row")
    assert any("sm" in v or "8.0" in v for v in space.violations(
        {**space.default(), "producer.impl": "gemm_wide"}, shape_facts(spec, plan, (16, 64, 16, 32, 32), "7.5")))


def test_wide_variants_of_a_strided_transposed_convolution():
    """A stride-2 transposed convolution (the bench's upsampling layer, 32 -> 64) is split into output
    classes for gemm_wide. With 64 output channels, no 128-channel block is compiled or feasible (half
    its columns would multiply zeros); each class's rows are 32 wide, and every compiled variant is
    feasible at the bench's shape, a plane of 2 x 2 taps a stage (every kh of a kd) as well as a row."""
    from fusetune.search import shape_facts
    spec = load_config(Path(__file__).resolve().parent.parent / "benchmarks" / "configs"
                       / "convt3d_stride2_batchnorm_gap.yaml")
    plan = make_plan(spec)
    assert bool(plan_facts(plan)["wide"]) and "direct" not in plan.impl_stages and "gemm_wide" in plan.impl_stages
    space = plan_space(plan)
    family = load_family("wide_stats")
    names = {"C": 64, **space.plan_facts}
    compiled = {(v["bm"], v["bn"], v["wm"], v["staging"], v["blocks"]) for v in family.variants()
                if family.compiles(v, names)}
    assert compiled == {(bm, 64, wm, staging, 1) for bm in (128, 256) for wm in (2, 4) for staging in ("row", "plane")} | {
        (128, 64, 2, "row", 2), (128, 64, 4, "row", 2), (128, 64, 2, "plane", 2)}
    facts = shape_facts(spec, plan, spec.shapes[0], "9.0")
    wide = [c for c in space.all() if c["producer.impl"] == "gemm_wide"]
    feasible = {(c["wide_stats.bm"], c["wide_stats.bn"], c["wide_stats.wm"], c["wide_stats.staging"],
                 c["wide_stats.blocks"]) for c in wide if not space.violations(c, facts)}
    assert feasible == compiled
    assert all(any("zero weights" in v for v in space.violations(c, facts)) for c in wide if c["wide_stats.bn"] == 128)


def test_choices_written_as_text_are_the_declared_ones():
    """The scripts' --set FAMILY.PARAM=VALUE: the value is the declared choice written so (typed as declared); a
    parameter the space has not, or a value not among its choices, is an error naming it."""
    space = plan_space(make_plan(load_config(SEEDS["groupnorm"])))
    chosen = space.with_choices(space.default(), [("stats.split", "16"), ("producer.impl", "direct")])
    assert chosen["stats.split"] == 16 and isinstance(chosen["stats.split"], int)
    assert chosen["producer.impl"] == "direct" and chosen == {**space.default(), **chosen}
    with pytest.raises(FusetuneError, match="stats.split=3: expected one of 1, 2, 4, 8, 16, 32"):
        space.with_choices(space.default(), [("stats.split", "3")])
    with pytest.raises(FusetuneError, match="stats.splat: no such parameter"):
        space.with_choices(space.default(), [("stats.splat", "4")])
