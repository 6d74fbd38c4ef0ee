"""A second input tensor of the model (``inputs: [identity]``, ``{op: add, by: identity}``): ResNet's
``relu(bn(conv(x)) + identity)`` and KernelBench's ``forward(self, x, add_input)``.

The kernels read it at the index where they store each element (plan.INPUT_SLOTS: the post chain where nothing
reduces after it, the final chain after a reduction), as ``a.extra[ft_o]``; a world whose output stage does not
(facts.INPUT_STAGES) refuses the region, and a norm, pool or reduction after such an op ends the region. The chains:
the corpus's (tests/chains/) and one per output stage beside it (tests/second_input/). The kernels on a GPU:
tests/test_gpu_second_input.py.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import load_config, parse_config
from fusetune.pipeline import later_segments
from fusetune.plan import make_plan
from fusetune.worlds import WORLDS, facts, refusals
from fusetune.worlds.facts import INPUT_STAGES, OUTPUT_STAGES, input_refusal

from conftest import ROOT, import_file

NVCC = shutil.which("nvcc")
CORPUS = ROOT / "tests" / "chains"
MORE = ROOT / "tests" / "second_input"
#: Each chain, its folder, the input its region 0 reads (None: a later region reads it), and the worlds of kernels
#: region 0 offers (beside the reference's own forwards).
CHAINS = [
    (CORPUS, "conv2d_nobias_batchnorm_eval_add_input_relu", "identity", {"cudnn", "direct", "gemm", "cudnn_fused"}),
    (MORE, "conv2d_groupnorm_maxpool_mul_input_relu", "gate",
     {"cudnn", "direct", "gemm", "gemm_extrema", "gemm_store", "gemm_cluster"}),
    (MORE, "conv2d_instancenorm_max_channels_add_input_relu", "floor",
     {"cudnn", "direct", "gemm", "gemm_store", "gemm_cluster"}),
    (MORE, "conv2d_instancenorm_mean_spatial_add_input_relu", "bias_map", {"cudnn", "direct", "gemm"}),
    (MORE, "conv2d_relu_maxpool_groupnorm_add_input_relu", None, {"cudnn", "direct", "gemm"}),
    (MORE, "conv2d_relu_mean_spatial_add_input_sigmoid", "shift", {"cudnn", "direct", "gemm"}),
    (MORE, "conv2d_softmax_channels_mul_input", "weights", {"cudnn"}),
    (MORE, "conv2d_wide96_relu_add_input_hardswish", "skip", {"cudnn", "gemm_wide"}),
    (MORE, "conv2d_wide96_nobias_batchnorm_eval_add_input_relu", "identity", {"cudnn", "gemm_wide", "cudnn_fused"}),
    (MORE, "conv2d_wide96_batchnorm_maxpool_mul_input_relu_half", "gate",
     {"cudnn", "gemm_wide", "gemm_wide_recompute"}),
    (MORE, "conv2d_wide96_relu_sum_channels_sub_input_tanh", "offset", {"cudnn", "gemm_wide"}),
    (MORE, "conv3d_relu_sum_channels_sub_input_tanh", "offset", {"cudnn", "direct", "gemm"}),
]
IDS = [c[1] for c in CHAINS]


def _spec(folder, stem: str):
    return load_config(folder / f"{stem}.yaml")


def _plan(folder, stem: str):
    return make_plan(_spec(folder, stem))


def _raw(stem: str, **changes) -> dict:
    folder = next(f for f, s, _, _ in CHAINS if s == stem)
    return {**yaml.safe_load((folder / f"{stem}.yaml").read_text()), **changes}


def test_the_more_folder_holds_exactly_the_listed_chains():
    assert sorted(p.stem for p in MORE.glob("*.yaml")) == sorted(s for f, s, _, _ in CHAINS if f == MORE)


# ------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------

def test_the_config_declares_the_input_and_the_ops_read_it():
    spec = _spec(CORPUS, "conv2d_nobias_batchnorm_eval_add_input_relu")
    assert spec.inputs == ("identity",)
    add = spec.epilogue[1]
    assert add.reads_input() == "identity" and add.forward_code("x", None) == "(x + identity)"
    assert not add.monotone() and not add.increasing()  # it varies inside a window, as the producer's value does
    assert spec.input_shapes((2, 16, 17, 21)) == [(2, 16, 17, 21)]  # the chain's shape where it is read
    assert spec.canonical()["inputs"] == ["identity"] and spec.canonical()["epilogue"][1]["input"] == "identity"
    other = load_config(CORPUS / "conv2d_batchnorm_relu_add_producer.yaml")  # the keys of chains without one stay
    assert "inputs" not in other.canonical() and "input" not in other.canonical()["epilogue"][2]


def test_an_input_read_twice_and_after_a_reduction_has_the_shape_there():
    raw = _raw("conv2d_nobias_batchnorm_eval_add_input_relu")
    raw["epilogue"] = raw["epilogue"] + [{"op": "maximum", "by": "identity"}]
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert [op.reads_input() for op in plan.post] == ["identity", None, "identity"] and not plan.tail
    spec = _spec(MORE, "conv3d_relu_sum_channels_sub_input_tanh")
    assert spec.input_shapes((2, 3, 7, 9, 11)) == [(2, 5, 7, 9)]


def test_an_input_changes_the_problem():
    raw = _raw("conv2d_nobias_batchnorm_eval_add_input_relu")
    plain = {**raw, "inputs": [], "epilogue": [raw["epilogue"][0], {"op": "add", "by": 1.0}, raw["epilogue"][2]]}
    assert parse_config(raw, "a.yaml").digest() != parse_config(plain, "b.yaml").digest()


# ------------------------------------------------------------------------------------------------------
# Plan: where the kernels read it, which worlds, and why not
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("folder, stem, extra, worlds", CHAINS, ids=IDS)
def test_region_zero_reads_the_input_where_it_stores(folder, stem, extra, worlds):
    plan = _plan(folder, stem)
    assert plan.extra == extra
    assert {impl for impl in plan.impl_stages if not WORLDS[impl].runs_reference} == worlds
    if extra is not None:
        assert all(step.op.role == "view" for step in plan.tail), plan.regions()
        readers = [op for op in (*plan.post, *plan.final) if op.reads_input()]
        assert readers and not any(op.reads_input() for op in (*plan.pre, *plan.mid))
        assert (plan.reduce is None and plan.channel_map is None) == bool([op for op in plan.post if op.reads_input()])


#: wide_main's store paths that read the input, each by a chain of MORE: the unpooled map (gemm_wide), the pooled
#: map (gemm_wide_recompute, after the statistics pass) and the channel reduction's final chain (gemm_wide).
WIDE_MAIN_READERS = {
    "conv2d_wide96_nobias_batchnorm_eval_add_input_relu": ("gemm_wide", "window_map", False),
    "conv2d_wide96_batchnorm_maxpool_mul_input_relu_half": ("gemm_wide_recompute", "window_map", True),
    "conv2d_wide96_relu_sum_channels_sub_input_tanh": ("gemm_wide", "channel_reduce", False),
}


def test_every_output_stage_reads_it_and_is_exercised_and_a_stage_that_does_not_is_refused(monkeypatch):
    stages = {stage for folder, stem, extra, _ in CHAINS if extra for run in _plan(folder, stem).impl_stages.values()
              for stage in run}
    assert set(INPUT_STAGES) <= stages
    assert set(OUTPUT_STAGES) <= set(INPUT_STAGES)
    for stem, (world, family, pooled) in WIDE_MAIN_READERS.items():
        plan = _plan(MORE, stem)
        assert plan.family == family and (plan.pool is not None) == pooled and refusals(plan).get(world) is None
        assert plan.impl_stages[world][-1] == "wide_main"
    plan = _plan(MORE, "conv2d_wide96_relu_add_input_hardswish")
    assert input_refusal(plan, ("wide_main",)) is None and input_refusal(plan, ("window_map",)) is None
    # an output stage that does not read it (here as if wide_main did not) refuses the world, with the reason
    monkeypatch.setattr(facts, "INPUT_STAGES", tuple(s for s in INPUT_STAGES if s != "wide_main"))
    why = refusals(plan)["gemm_wide"]
    assert "wide_main does not read it" in why and "'skip'" in why
    assert input_refusal(_plan(CORPUS, "conv2d_batchnorm_relu_add_producer"), ("wide_main",)) is None  # reads none


def test_a_later_region_reads_the_input():
    plan = _plan(MORE, "conv2d_relu_maxpool_groupnorm_add_input_relu")
    (segment,) = later_segments(plan)
    assert segment.kernels and segment.extra_inputs == ("residual",)
    assert segment.spec.inputs == ("residual",) and make_plan(segment.spec).extra == "residual"
    assert segment.spec.input_shapes(segment.spec.shapes[0]) == [segment.spec.shapes[0]]


#: Ops after an op that reads the input: the kernels never store what a norm, a pool or a reduction reads.
@pytest.mark.parametrize("after, role, name", [
    ({"op": "max_pool", "kernel_size": 2}, "pool", "max_pool"),
    ({"op": "sum", "dim": 1}, "reduce", "sum"),  # by the config's name, not the kernels' reduce
    ({"op": "instance_norm"}, "norm", "instance_norm"),
])
def test_a_norm_pool_or_reduction_after_the_reader_ends_the_region_and_the_plan_says_why(after, role, name):
    raw = _raw("conv2d_nobias_batchnorm_eval_add_input_relu")
    raw = {**raw, "epilogue": [raw["epilogue"][0], raw["epilogue"][1], after]}
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert [step.op.kind for step in plan.head] == ["batch_norm", "add"] and plan.extra == "identity"
    assert plan.ends.startswith(f"x.yaml: epilogue[2] ({name}): a {role} after epilogue[1] (add), "
                                "which reads input 'identity'")
    assert any("epilogue[2]" in line for line in plan.regions())


def test_two_inputs_in_one_region_the_second_runs_after_it():
    raw = _raw("conv2d_nobias_batchnorm_eval_add_input_relu", inputs=["identity", "gate"])
    raw["epilogue"] = raw["epilogue"] + [{"op": "mul", "by": "gate"}]
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert plan.extra == "identity" and [step.op.kind for step in plan.tail] == ["mul"]
    assert "the kernels read one extra input a region" in plan.ends
    (segment,) = later_segments(plan)  # the second reads it in a region of its own
    assert segment.kernels and segment.extra_inputs == ("gate",)


def test_a_view_before_the_reader_is_not_moved_past_it():
    """x.sum(1, keepdim=True) + input: the view that restores the dim stays before the add (the input has the
    chain's shape there, not the kernels' output's), so the add runs after region 0."""
    raw = _raw("conv3d_relu_sum_channels_sub_input_tanh")
    raw["epilogue"][1] = {"op": "sum", "dim": 1, "keepdim": True}
    plan = make_plan(parse_config(raw, "x.yaml"))
    assert plan.extra is None and [step.op.kind for step in plan.tail][:2] == ["unsqueeze", "sub"]


def test_cli_plan_shows_the_input_in_region_zero():
    out = CliRunner().invoke(main, ["plan", str(CORPUS / "conv2d_nobias_batchnorm_eval_add_input_relu.yaml")])
    assert out.exit_code == 0, out.output
    assert "post=add,relu" in out.output and "extra=identity" in out.output
    assert ("region 0 (fused kernels): conv2d -> epilogue[0] (batch_norm), epilogue[1] (add), epilogue[2] (relu)"
            in out.output)
    out = CliRunner().invoke(main, ["plan", "--json", str(CORPUS / "conv2d_nobias_batchnorm_eval_add_input_relu.yaml")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    doc = doc[0] if isinstance(doc, list) else doc
    assert doc["inputs"] == ["identity"] and doc["kernel_input"] == "identity"


# ------------------------------------------------------------------------------------------------------
# Rendering: every store site passes its index; the generated model takes the input
# ------------------------------------------------------------------------------------------------------

#: Where each output stage hands its chain the stored index (both layouts of the cuDNN world's kernels).
STORES = {
    "window_map": (r"a\.out\[o\] = ft_post\(v, c, a, o\);", r"ft_post\(v\[j\], c0 \+ j, a, o \* VEC \+ j\)"),
    "extrema_map": (r"a\.out\[o\] = ft_post\(ft_max_nan\(.*\), c, a, o\);",),
    "plane_reduce": (r"a\.out\[plane\] = ft_final\(acc\.x, plane % a\.C, a, plane\);",),
    "channel_reduce": (r"ft_final\(.*, 0, a, n \* S \+ s \+ j\)",
                       r"a\.out\[pos\[u\]\] = ft_final\(.*, 0, a, pos\[u\]\)"),
    "channel_softmax": (r"ft_final\(.*, c, a, plane \* S \+ s \+ j\)",
                        r"ft_final\(.*, c0 \+ j, a, pos \* C \+ c0 \+ j\)"),
    "finalize": (r"a\.out\[idx\] = ft_final\(.*, c, a, idx\);",),
    "direct_main": (r"a\.out\[(.+)\] = ft_(post|final)\(.*, a, \1\);",),
    "gemm_main": (r"a\.out\[(.+)\] = ft_(post|final)\(.*, a, \1\);",),
    "gemm_cluster": (r"a\.out\[(.+)\] = ft_(post|final)\(.*, a, \1\);",),
    # the unpooled map hands its chain the index, the pooled map and the channel reduction their stores'
    "wide_main": (r"ft_wide_chain<BN>\(.*, a, o\);|= ft_post\(pool\(cp, k\), c, a, .+\);|"
                  r"a\.out\[o\] = ft_final\(r, 0, a, o\);",),
}
#: wide_main's store of each path that reads the input (WIDE_MAIN_READERS): the index the unpooled map hands
#: ft_wide_chain (its sample's, its channel's, the position clamped in bounds), the pooled map's own store, the
#: channel reduction's (one channel tile) and its combine kernel's (several).
WIDE_STORES = {
    "conv2d_wide96_nobias_batchnorm_eval_add_input_relu": (
        r"const int64_t sample = \(int64_t\)n \* FT_COUT \* volume;",
        r"const int64_t o = sample \+ \(cc \* volume \+ max\(where\[i\]\[h\], 0\)\);",
        r"ft_wide_chain<BN>\(acc\[i\]\[j\]\[2 \* h \+ e\], cc, cl, ab, a, o\);",
        r"if \(where\[i\]\[h\] >= 0 && c < FT_COUT\) out\[c \* volume \+ where\[i\]\[h\]\] = v;"),
    "conv2d_wide96_batchnorm_maxpool_mul_input_relu_half": (
        r"out\[\(\(\(int64_t\)c \* OD \+ od\) \* OH \+ oh\) \* OW \+ ow\] = ft_post\(pool\(cp, k\), c, a, "
        r"\(\(\(\(int64_t\)n \* FT_COUT \+ c\) \* OD \+ od\) \* OH \+ oh\) \* OW \+ ow\);",),
    "conv2d_wide96_relu_sum_channels_sub_input_tanh": (
        r"const int64_t o = \(int64_t\)n \* volume \+ ft_wide_output\(box\.k, p, H, W\);\n(.*\n){4}"
        r"\s*a\.out\[o\] = ft_final\(r, 0, a, o\);",
        r"for \(int64_t o = .*\n(.*\n){3}\s*a\.out\[o\] = ft_final\(r, 0, a, o\);"),
}


@pytest.mark.parametrize("folder, stem, extra, worlds", [c for c in CHAINS if c[2]], ids=[c[1] for c in CHAINS if c[2]])
def test_every_output_stage_reads_the_input_at_its_store(folder, stem, extra, worlds):
    plan = _plan(folder, stem)
    files = render(plan).files
    chain = "post" if any(op.reads_input() for op in plan.post) else "final"
    for stage in set(plan.stages) & set(INPUT_STAGES):
        if stage == "finalize" and plan.family is not None:
            continue  # finalize stores the output only where it computes it from the statistics
        units = [text for name, text in files.items() if (name == f"{stage}.cu" or name.startswith(f"{stage}_"))
                 and "__global__" in text]
        assert units, stage
        for text in units:
            assert f"float ft_{chain}(float v, int64_t c, const FtArgs& a, int64_t ft_o)" in text, stage
            assert "__ldg(a.extra + ft_o)" in text, stage
            for store in STORES[stage]:
                assert re.search(store, text), (stage, store)


@pytest.mark.parametrize("stem", sorted(WIDE_STORES))
def test_wide_main_reads_the_input_where_each_path_stores(stem):
    """Each of wide_main's store paths (WIDE_MAIN_READERS) reads the input at the index it stores at; a unit of
    another variant is the same code at other tile sizes (its first one here)."""
    text = render(_plan(MORE, stem)).files["wide_main_0.cu"]
    for store in WIDE_STORES[stem]:
        assert re.search(store, text), (stem, store)


def test_a_chain_without_an_input_keeps_its_chains_as_they_were():
    files = render(_plan(CORPUS, "conv2d_batchnorm_relu_add_producer")).files
    assert "float ft_post(float v, int64_t c, const FtArgs& a) {" in files["window_map.cu"]
    assert "a.extra" not in files["window_map.cu"] and "a.out[o] = ft_post(v, c, a);" in files["window_map.cu"]


@pytest.mark.parametrize("folder, stem, extra, worlds", CHAINS, ids=IDS)
def test_the_generated_models_take_the_input_after_x(folder, stem, extra, worlds, tmp_path):
    """Model and ModelNew take the input as a forward argument; the reference in float64 is the chain written out
    in PyTorch; the module holds no table of the inputs' shapes (the evaluation's job carries them)."""
    import inspect

    import torch

    plan = _plan(folder, stem)
    generated = import_file(render(plan).write(tmp_path / "module") / "model.py")
    name = plan.spec.inputs[0]
    for cls in (generated.Model, generated.ModelNew):
        assert list(inspect.signature(cls.forward).parameters) == ["self", "x", name]
    assert generated.INPUTS == [name] and generated.KERNEL_INPUT == extra
    shape = plan.spec.shapes[0]
    assert not hasattr(generated, "INPUT_SHAPES")
    torch.manual_seed(0)
    model = generated.Model().double()
    x = torch.rand(shape, dtype=torch.float64)
    other = torch.randn(plan.spec.input_shapes(tuple(shape))[0], dtype=torch.float64)
    with torch.no_grad():
        want = model(x, other)
        v = model.producer(x)
        for step in plan.head + plan.tail:  # the chain as PyTorch runs it, the input bound by its name
            attr = step.attr
            v = eval(step.op.forward_code("x", attr), {"self": model, "x": v, name: other,  # noqa: S307
                                                     "torch": torch, "F": torch.nn.functional})
    assert want.shape == v.shape == tuple(plan.spec.output_shape(shape))
    torch.testing.assert_close(want, v, rtol=0, atol=0)


def test_model_new_puts_the_input_in_the_outputs_layout_and_checks_it(tmp_path):
    import torch

    plan = _plan(CORPUS, "conv2d_nobias_batchnorm_eval_add_input_relu")
    generated = import_file(render(plan).write(tmp_path / "module") / "model.py")
    out = torch.empty(2, 16, 5, 7)
    same = torch.randn(2, 16, 5, 7)
    assert generated._as_output(same, out) is same  # already the output's layout: no copy
    last = torch.randn(2, 16, 5, 7).contiguous(memory_format=torch.channels_last)
    moved = generated._as_output(last, out)
    assert moved.is_contiguous() and torch.equal(moved, last)
    out_last = torch.empty(2, 16, 5, 7).contiguous(memory_format=torch.channels_last)
    assert generated._as_output(last, out_last) is last
    assert generated._as_output(same, out_last).is_contiguous(memory_format=torch.channels_last)
    assert generated._as_output(None, out) is None
    with pytest.raises(ValueError, match=r"input 'identity' has shape \(2, 16, 5, 6\); expected the chain's there, "
                                         r"\(2, 16, 5, 7\)"):
        generated._as_output(torch.randn(2, 16, 5, 6), out)
    x = torch.randn(2, 16, 9, 9)
    with pytest.raises(ValueError, match="input 'identity': expected torch.float32, got torch.float64"):
        generated._check_extra("identity", x.double(), x)
    with pytest.raises(TypeError, match="input 'identity': expected a torch.Tensor, got list"):
        generated._check_extra("identity", [1.0], x)
    generated._check_extra("identity", x, x)


# ------------------------------------------------------------------------------------------------------
# nvcc: one unit of each template that reads the input
# ------------------------------------------------------------------------------------------------------

#: One unit a template, compiled for sm_90 without spills (CI time: the heavy per-variant stages once each, their
#: first variant); the corpus chain's common header is tests/test_chains.py's.
UNITS = [
    ("conv2d_nobias_batchnorm_eval_add_input_relu", "window_map.cu"),
    ("conv2d_groupnorm_maxpool_mul_input_relu", "direct_main_0.cu"),
    ("conv2d_groupnorm_maxpool_mul_input_relu", "extrema_map.cu"),
    ("conv2d_groupnorm_maxpool_mul_input_relu", "gemm_main_0.cu"),
    ("conv2d_instancenorm_max_channels_add_input_relu", "gemm_cluster_0.cu"),
    ("conv2d_instancenorm_max_channels_add_input_relu", "channel_reduce.cu"),
    ("conv2d_instancenorm_mean_spatial_add_input_relu", "finalize.cu"),
    ("conv2d_relu_mean_spatial_add_input_sigmoid", "plane_reduce.cu"),
    ("conv2d_softmax_channels_mul_input", "channel_softmax.cu"),
    ("conv2d_wide96_nobias_batchnorm_eval_add_input_relu", "wide_main_0.cu"),
]
#: Units that spill a few bytes whether the op reads the input or a number (channel_softmax's VEC 4 variants after a
#: softmax over 12 channels and a mul, 4 to 8 bytes): compiled, their spills not checked here.
SPILL_BEFORE = {"channel_softmax.cu"}


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("stem, unit", UNITS, ids=[f"{u[1].split('.')[0]}" for u in UNITS])
def test_the_output_stages_compile_for_sm90_without_spills(stem, unit, tmp_path):
    folder = next(f for f, s, _, _ in CHAINS if s == stem)
    where = render(_plan(folder, stem)).write(tmp_path / stem)
    done = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-c", unit, "-o", unit + ".o"],
                          cwd=where, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    spills = [line for line in log.splitlines() if "spill stores" in line]
    assert spills and (unit in SPILL_BEFORE or all(" 0 bytes spill stores" in line for line in spills)), log[-2000:]


# ------------------------------------------------------------------------------------------------------
# Importer: a model of two inputs
# ------------------------------------------------------------------------------------------------------

def test_a_kernelbench_model_of_two_inputs_imports_with_its_argument_name(tmp_path):
    import json

    from fusetune.importer import import_model

    result = import_model(str(ROOT / "tests" / "models" / "kb_convt2d_add_input_hardswish.py"), tmp_path)
    (written,) = result.written
    assert written.inputs == {"add_input": "add_input"}
    spec = load_config(written.config)
    assert spec.inputs == ("add_input",) and [op.reads_input() for op in spec.epilogue] == \
        ["add_input", None, "add_input", None]
    assert make_plan(spec).extra == "add_input" and not make_plan(spec).tail
    assert "# Inputs: " in written.config.read_text()
    doc = json.loads(result.map_path.read_text())
    assert doc["chains"][0]["inputs"] == {"add_input": "add_input"}
    assert any("reads add_input as input add_input" in line for line in result.lines)


def test_a_residual_block_reads_its_shortcut_and_the_shortcut_chain_stops_before_the_add(tmp_path):
    from fusetune.importer import import_model

    result = import_model(str(ROOT / "tests" / "models" / "resnet_blocks.py"), tmp_path)
    by_producer = {w.chain.producer_node: w for w in result.written}
    block = by_producer["layer2_conv2"]
    assert [e["op"] for e in block.epilogue] == ["batch_norm", "add", "relu"]
    assert list(block.inputs.values()) == ["layer2_down_1"]  # the downsampling shortcut's value
    shortcut = by_producer["layer2_down_0"]
    assert [e["op"] for e in shortcut.epilogue] == ["batch_norm"] and "computed after the convolution" in \
        shortcut.chain.end


@pytest.mark.parametrize("stem, blocks", [("resnet_blocks", 3), ("resnet_basicblock_downsample_after", 2)])
def test_the_optimized_model_calls_the_fused_block_with_its_shortcut(stem, blocks, tmp_path):
    """Each block's add runs in one fused module, called with the other operand: the shortcut (computed before the
    main path's last convolution), or the main path's value where the shortcut's convolution comes last (torchvision's
    order), that value being an earlier chain's fused output."""
    import torch

    from fake_handlers import FakeBench
    from fusetune.optimizer import FusedChain, optimize
    from test_optimize import MACHINE, TRIALS, _model

    model, inputs = _model(stem)
    model.eval()
    opt = optimize(model, inputs, cache_dir=tmp_path, trials=TRIALS, benchmarker=FakeBench().factory,
                   machine=MACHINE)
    calls = [n for n in opt.graph.nodes if n.op == "call_module" and isinstance(opt.get_submodule(n.target),
                                                                                 FusedChain)]
    with_inputs = {n.target: n.args[1] for n in calls if len(n.args) == 2}
    assert len(with_inputs) == blocks  # each block's last convolution, with the add's other operand
    for target, shortcut in with_inputs.items():
        assert len(opt.get_submodule(target).state.spec.inputs) == 1
    # an earlier chain was fused first: the block reads its fused module's output
    assert any(isinstance(opt.get_submodule(s.target), FusedChain) for s in with_inputs.values()
               if s.op == "call_module")
    fresh = tuple(torch.randn_like(x) for x in inputs)
    with torch.no_grad():
        assert torch.equal(opt(*fresh), model(*fresh))


@pytest.mark.parametrize("config", ["tests/fleet/convt3d_small_shapes.yaml",
                                    "tests/chains/conv2d_nobias_batchnorm_eval_add_input_relu.yaml"])
def test_a_chain_keys_its_winners_whatever_its_list_of_shapes(config, tmp_path):
    """The module's sources (part of every cache key) must not depend on the config's list of shapes, or a
    config naming fewer of them (a deploy's) misses the winners of the same problem at the same shape: a
    chain reading an input too (its inputs' shapes travel in the evaluation's job, not in model.py)."""
    import yaml

    from fusetune.codegen import render
    from fusetune.config import load_config
    from fusetune.plan import make_plan

    from conftest import ROOT

    raw = yaml.safe_load((ROOT / config).read_text())
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({**raw, "shapes": raw["shapes"][:1]}, sort_keys=False))
    every = render(make_plan(load_config(ROOT / config)))
    assert len(raw["shapes"]) > 1 and render(make_plan(load_config(one))).source_hash == every.source_hash
