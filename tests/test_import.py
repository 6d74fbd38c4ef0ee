"""``fusetune import``: the chains found in tests/models/*.py, their configs, and the real check: the
generated reference Model, with the user's weights, computes the user's value at the chain's last node."""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import operator
import re
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from fusetune.cache import usual_mode
from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.derived import Derivation
from fusetune.errors import FusetuneError
from fusetune.importer import (declared_view, example_arguments, find_chains, import_model, import_traced,
                               load_model, match_producer, matching_trace, trace)
from fusetune.plan import make_plan

from conftest import ROOT, SEEDS, import_file

MODELS = Path(__file__).resolve().parent / "models"
#: tests/models/expected.yaml: each model file's chains ("producer -> op -> ..."), and the files that do not import.
EXPECTED_FILE = yaml.safe_load((MODELS / "expected.yaml").read_text())
EXPECTED: dict[str, list[tuple[str, list[str]]]] = {
    stem: [(chain.split(" -> ")[0], chain.split(" -> ")[1:]) for chain in chains]
    for stem, chains in EXPECTED_FILE["chains"].items()}
NOT_IMPORTED: dict[str, str] = EXPECTED_FILE["not_imported"]
#: Every model file but the expected failures: imported, planned, and checked against the model in float64.
STEMS = sorted(p.stem for p in MODELS.glob("*.py") if p.stem not in NOT_IMPORTED)


@pytest.mark.parametrize("stem", sorted(NOT_IMPORTED))
def test_expected_failures_fail_cleanly(stem: str, tmp_path: Path) -> None:
    with pytest.raises(FusetuneError, match=NOT_IMPORTED[stem]):
        import_model(str(MODELS / f"{stem}.py"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _traced(model: torch.nn.Module, inputs) -> torch.fx.GraphModule:
    """The user's model traced as the importer traces it (torch.fx, else torch.export; torch.export's where torch.fx's
    computes other values than the model: matching_trace), on a copy."""
    copied = _deepcopy(model)
    return matching_trace(copied, trace(copied, inputs), inputs)


def _deepcopy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy, sharing what a forward pre-hook computed (weight_norm's module.weight: no graph leaf, which
    copy.deepcopy refuses) as fusetune's copies do."""
    from fusetune.computed_weights import hook_tensors

    return copy.deepcopy(model, hook_tensors(model))


class _Snapshots(torch.fx.Interpreter):
    """Each node's value as it was computed: a copy, so that a later in-place op (``x.relu_()``, ``F.hardsigmoid(b,
    inplace=True)``) outside a chain does not change the value the chain is compared with."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n: torch.fx.Node):
        value = super().run_node(n)
        self.values[n.name] = value.clone() if isinstance(value, torch.Tensor) else value
        return value


def _intermediates(gm: torch.fx.GraphModule, user: torch.nn.Module, inputs) -> dict[str, torch.Tensor]:
    """Every node's value in the traced model, by node name; the trace's output is the user's model's own (a
    copy of it run alike: torch.export's graph, lifted, computes what the model computes)."""
    interpreter = _Snapshots(gm)
    torch.manual_seed(1)  # the same draws for a training-mode dropout in both runs
    out = interpreter.run(*inputs)
    torch.manual_seed(1)
    torch.testing.assert_close(out, _deepcopy(user)(*inputs), rtol=1e-12, atol=1e-12)
    return interpreter.values


def _copy_weights(generated: torch.nn.Module, user: torch.nn.Module, weights: dict[str, str]) -> None:
    """The user's tensors, by the user's attribute paths (a parameter, a buffer, a plain tensor attribute, as
    optimize() binds them), into the generated Model's (producer, parameters, norms); a 0-dim or (1, C, 1, 1)
    parameter through the view optimize() binds (declared_view)."""
    ours = {**dict(generated.named_parameters()), **dict(generated.named_buffers())}
    with torch.no_grad():
        for key, name in weights.items():
            theirs = functools.reduce(getattr, name.split("."), user)
            if ours[key].shape != theirs.shape:
                assert "." not in key and key in dict(generated.named_parameters()), (key, name, theirs.shape)
                theirs = declared_view(theirs, ours[key].shape)
            ours[key].copy_(theirs)


def _derive(generated: torch.nn.Module, user: torch.nn.Module, derived: dict[str, dict],
            values: dict[str, torch.Tensor] | None = None) -> None:
    """The generated Model's derived parameters computed from the user's tensors as they are now, as the fused
    chain computes them at each call (fusetune/derived.py); each equal to the model's own value of its node where
    ``values`` (every node's, from a run of the model) is given."""
    ours = dict(generated.named_parameters())
    with torch.no_grad():
        for key, doc in derived.items():
            how = Derivation.from_json(doc)
            value = how.compute(lambda path: functools.reduce(getattr, path.split("."), user))
            if values is not None and how.node in values:  # (a hook's, fusetune/computed_weights.py: no node's)
                torch.testing.assert_close(value, values[how.node].reshape(how.shape), rtol=0, atol=0)
            ours[key].copy_(value)


@pytest.mark.parametrize("stem, dtypes, note", [
    ("sweep_conv2d_bfloat16_model", ["bfloat16"], "# dtype bfloat16: the convolution's"),
    ("sweep_conv2d_float64_model", ["float32"], "# The model computes in float64; the kernels take float32"),
    ("sweep_conv2d_mixed_dtypes", ["float32", "float16"], ""),  # each chain its convolution's dtype
])
def test_a_config_takes_its_convolutions_dtype_where_the_kernels_have_it(stem: str, dtypes: list[str], note: str,
                                                                          tmp_path: Path) -> None:
    result = import_model(str(MODELS / f"{stem}.py"), tmp_path)
    assert [load_config(w.config).dtype for w in result.written] == dtypes
    assert all(note in w.config.read_text() for w in result.written)


def test_expected_lists_existing_files() -> None:
    assert set(EXPECTED) <= set(STEMS) and set(NOT_IMPORTED) <= {p.stem for p in MODELS.glob("*.py")}


@pytest.mark.parametrize("stem", STEMS)
def test_import_matches_the_model(stem: str, tmp_path: Path) -> None:
    """Every model file imports; its chains are those expected.yaml lists (where it lists the file); each
    config plans, and its generated reference Model, given the user's tensors, computes the user's value."""
    result = import_model(str(MODELS / f"{stem}.py"), tmp_path)
    found = [(w.chain.producer["op"], [e["op"] for e in w.epilogue]) for w in result.written]
    if stem in EXPECTED:
        assert found == EXPECTED[stem]
    doc = json.loads((tmp_path / f"{stem}.map.json").read_text())
    assert [c["config"] for c in doc["chains"]] == [str(w.config) for w in result.written]
    covered = {n for c in doc["chains"] for n in c["nodes"]}
    assert covered.isdisjoint(doc["pytorch"])  # each node in one chain or in PyTorch, with why
    assert all(isinstance(why, str) and why for why in doc["pytorch"].values())
    if not found:
        return
    torch.manual_seed(0)
    loaded = load_model(str(MODELS / f"{stem}.py"))
    _materialize(loaded.model, loaded.inputs)  # in float32, as the generated Model takes the user's tensors
    user = loaded.model.double()
    inputs = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in loaded.inputs]
    gm = _traced(user, inputs)
    values = _intermediates(gm, user, inputs)
    for i, chain in enumerate(doc["chains"]):
        path = tmp_path / f"{stem}_chain{i}.yaml"
        assert chain["config"] == str(path)
        spec = load_config(path)
        assert spec.name == f"{stem}_chain{i}"
        # where ops outside read the convolution's output, the chain returns it too (outputs: [chain, producer])
        assert ("producer_read_by" in chain) == spec.returns_producer
        for name, got, expected in chain_outputs(chain, spec, user, gm, values, tmp_path / f"gen{i}"):
            assert got.shape == expected.shape
            # a model that casts to float32 itself (softmax(dtype=float32)) computes the rest in float32 even in a
            # float64 run; the chain's reference rounds at the cast as it does and goes on in float64
            exact = expected.dtype == torch.float64
            torch.testing.assert_close(got, expected.to(got.dtype), rtol=1e-9 if exact else 2e-5,
                                       atol=1e-10 if exact else 1e-6)


def chain_outputs(chain: dict, spec, user: torch.nn.Module, gm: torch.fx.GraphModule, values: dict,
                  folder: Path) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Each output of an imported chain (the map's entry ``chain``, its config ``spec``) against the user's: the
    chain's generated reference Model with the user's weights, its derived operands computed in float64 as the model
    computes them, run on the model's own float64 values at the convolution's input (and its extra inputs, a
    residual's identity, as the model computes them). (output name, the chain's value, the model's)."""
    folder.mkdir()
    (folder / "model.py").write_text(render(make_plan(spec)).files["model.py"])
    generated = import_file(folder / "model.py").Model()
    _copy_weights(generated, user, chain["weights"])
    generated = generated.double().train(user.training)
    _derive(generated, user, chain["derived"], values)
    x = values[_conv_input(gm, chain["producer"])]
    with torch.no_grad():
        out = generated(x, *(values[node] for node in chain.get("inputs", {}).values()))
    node_of = {"chain": chain["output"], "producer": chain["producer"]}
    outs = out if len(spec.outputs) > 1 else (out,)
    return [(name, got, values[node_of[name]]) for name, got in zip(spec.outputs, outs, strict=True)]


def _materialize(model: torch.nn.Module, inputs) -> None:
    """A lazy module's parameters (nn.LazyConv2d) take their shapes at the first call, and a copy refuses them
    before: the model traced once, in place, as the importer traces it (which runs it: no fake copy of it either)."""
    if any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
           for m in model.modules()):
        trace(model, inputs)


def _conv_input(gm: torch.fx.GraphModule, producer: str) -> str:
    """The name of the node feeding the convolution ``producer`` (positional or ``input=``)."""
    node = next(n for n in gm.graph.nodes if n.name == producer)
    return match_producer(gm, node).input.name


def test_parameters_keep_the_users_names(tmp_path: Path) -> None:
    result = import_model(str(MODELS / "conv2d_groupnorm_scale_clamp.py"), tmp_path)
    spec = load_config(result.written[0].config)
    assert [p.name for p in spec.parameters] == ["scale"]
    assert result.written[0].weights["scale"] == "scale"
    assert result.written[0].weights["group_norm_0.weight"] == "group_norm.weight"
    text = result.written[0].config.read_text()
    assert "trained values come from the model" in text


def test_modes_are_kept(tmp_path: Path) -> None:
    eval_bn = import_model(str(MODELS / "conv1d_batchnorm_eval.py"), tmp_path / "a").written[0].epilogue
    assert eval_bn[0] == {"op": "batch_norm", "eps": 1e-3, "momentum": 0.05, "affine": True, "training": False}
    assert eval_bn[2] == {"op": "dropout", "p": 0.3, "training": False}
    train_bn = import_model(str(MODELS / "convt3d_batchnorm_train_pools.py"), tmp_path / "b").written[0].epilogue
    assert train_bn[0]["training"] is True


def test_stop_reasons_are_named(tmp_path: Path) -> None:
    result = import_model(str(MODELS / "conv2d_stops_ceil_mode.py"), tmp_path)
    assert result.written[0].epilogue[-1] == {"op": "max_pool", "kernel_size": 2, "ceil_mode": True}
    plan = make_plan(load_config(result.written[0].config))  # PyTorch's pool, after the kernels' region
    assert [s.op.kind for s in plan.tail] == ["max_pool"] and "ceil_mode=True (a partial last window)" in plan.ends
    # the convolution's output returned beside the chain: the chain returns it too; read before the chain's last
    # value: the chain cut before that read, said, and no chain where no op of it comes before the read
    shared = import_model(str(MODELS / "conv2d_shared_output.py"), tmp_path)
    assert load_config(shared.written[0].config).outputs == ("chain", "producer")
    near = import_model(str(MODELS / "returns_conv_near_misses.py"), tmp_path)
    assert not load_config(near.written[0].config).returns_producer
    assert load_config(near.written[1].config).outputs == ("chain", "producer")
    assert near.written[1].chain.nodes == ["conv_b", "tanh"] and near.written[1].chain.end_node == "sigmoid_1"
    assert near.pytorch["sigmoid_1"].startswith("ends chain1 (mul reads the convolution's output before sigmoid_1")
    assert "reads chain1's convolution output" in near.pytorch["mul"]
    cut = import_model(str(MODELS / "early_reader_cut_chain.py"), tmp_path)
    assert [w.chain.producer_readers[-1:] for w in cut.written] == [["mean"], ["sum_1"]]
    assert [w.chain.end_node for w in cut.written] == ["mul", "sub"]
    none = import_model(str(MODELS / "early_reader_no_step_kept.py"), tmp_path)
    assert [w.chain.nodes for w in none.written] == [["conv_c", "relu"]]
    assert ("also read by mul, outside the chain and before its last value sigmoid, and before its first op's value "
            "getitem too") in none.pytorch["conv_a"]
    assert ("also read by sub, outside the chain and before its last value sigmoid_1, and before its first op's "
            "value contiguous too") in none.pytorch["conv_b"]
    # x - x.mean(..., keepdim=True), on the convolution's output and on a later value: the mean and the subtraction
    # one op of the chain, a mean centring; nothing of either left in PyTorch
    mean = import_model(str(MODELS / "kb_convt2d_subtract_mean_tanh.py"), tmp_path)
    assert [w.chain.nodes for w in mean.written] == [["conv_transpose", "mean", "sub", "tanh"],
                                                     ["conv_transpose2", "batch_norm", "mean_1", "sub_1"]]
    assert mean.written[0].epilogue[0] == {"op": "sub", "by": {"op": "mean", "dim": [2, 3], "keepdim": True}}
    assert "is a convolution" in mean.written[0].chain.end and set(mean.pytorch) == {"x", "output"}
    dropout = import_model(str(MODELS / "kb_conv3d_groupnorm_min_clamp_dropout.py"), tmp_path)
    assert "training mode with p = 0.2" in dropout.pytorch["dropout"]
    two = import_model(str(MODELS / "kb_conv2d_relu_hardswish_clamp_form.py"), tmp_path)
    assert "is a convolution" in two.written[0].chain.end
    ceil = import_model(str(MODELS / "conv2d_pools_ceil_mode_exact.py"), tmp_path)
    assert [e.get("ceil_mode", False) for w in ceil.written for e in w.epilogue if "pool" in e["op"]] == [
        True, True, True]  # as the user wrote it: the planner decides at the config's shapes, guarded at others
    plans = [make_plan(load_config(w.config)) for w in ceil.written]
    assert [("ceil_adds_no_window" in p.rules, [s.op.kind for s in p.tail]) for p in plans] == [
        (True, []), (True, []), (False, ["max_pool"])]  # kernels where ceil adds no window at the traced size
    # relu(y) in place, then z + y: the add reads the write's result (the same tensor), z + z, mul 2
    inplace = import_model(str(MODELS / "kb_conv2d_inplace_relu_residual.py"), tmp_path)
    assert inplace.written[0].chain.nodes == ["conv1", "relu", "add"]
    assert inplace.written[0].epilogue == [{"op": "relu"}, {"op": "mul", "by": 2.0}]
    channels = import_model(str(MODELS / "kb_conv2d_bias_after_channel_sum.py"), tmp_path)
    assert "the input now has 1 channel (" in channels.pytorch["add"]
    assert "mul" in channels.written[1].chain.nodes and channels.written[1].parameters == {"scale": "scale"}


def test_the_map_names_the_chain_or_the_convolution_an_op_reads(tmp_path: Path) -> None:
    """An op of the vocabulary left in PyTorch says which chain's value it reads and why that chain ended there, or
    which convolution without a chain it reads; sizes multiplied are free."""
    se = import_model(str(MODELS / "sweep_ecapa_se_res2_1d.py"), tmp_path)
    assert ("reads chain1's value, where that chain ends (its value is read by several ops (mean, mul)"
            in se.pytorch["mean"])
    bn = import_model(str(MODELS / "sweep_conv2d_batchnorm_no_running_stats_eval.py"), tmp_path)
    assert "track_running_stats=False" in bn.pytorch["conv"]
    assert "reads the output of conv, a convolution without a chain (see conv)" in bn.pytorch["bn"]
    # through an nn.Identity (a step of no op) the convolution's reason is still the op that stopped its chain
    pos = import_model(str(MODELS / "sweep4_identity_pos_embed_quickgelu.py"), tmp_path)
    assert ("no op of the vocabulary follows the convolution: operator.add: the operand pos has shape [1, 6, 5, 7]"
            in pos.pytorch["embed"])
    sn = import_model(str(MODELS / "sweep4_spectral_norm_buffer_writes.py"), tmp_path)
    assert "F.conv2d's weight is computed in the forward from sn1.u, which the forward writes in place" in sn.pytorch[
        "conv2d"]


def test_shapes_come_from_fake_tensors() -> None:
    """Tracing computes nothing (KernelBench sizes take gigabytes on a CPU): the convolution sees fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensor

    loaded = load_model(str(MODELS / "kb_conv3d_bn_train_two_maxpools_sum.py"))
    seen: list[type] = []
    loaded.model.conv.register_forward_hook(lambda module, args, out: seen.append(type(out)))
    gm = trace(loaded.model, loaded.inputs)
    assert seen and all(issubclass(t, FakeTensor) for t in seen)
    conv = next(n for n in gm.graph.nodes if n.name == "conv")
    assert tuple(conv.meta["tensor_meta"].shape) == (2, 4, 6, 12, 13)


def test_cli_import(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["import", str(MODELS / "two_chains_cat.py"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "chain0 -> " in result.output and "chain1 -> " in result.output
    assert "cat: PyTorch: " in result.output and "not in the vocabulary" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["two_chains_cat.map.json", "two_chains_cat_chain0.yaml",
                                                      "two_chains_cat_chain1.yaml"]


def test_cli_import_eval_takes_the_models_inference_mode(tmp_path: Path) -> None:
    """A module is built in training mode: imported as built, its batch norm is a training one (batch statistics);
    with --eval, as model.eval() runs it (running statistics), the mode a service tunes for."""
    def norms(flags: list[str]) -> list[dict]:
        out = tmp_path / "_".join(["out", *flags])
        result = CliRunner().invoke(main, ["import", str(MODELS / "convt3d_batchnorm_train_pools.py"), "-o", str(out),
                                           *flags])
        assert result.exit_code == 0, result.output
        entries = [e for config in sorted(out.glob("*.yaml")) for e in yaml.safe_load(config.read_text())["epilogue"]]
        return [e for e in entries if e["op"] == "batch_norm"]
    assert [e["training"] for e in norms([])] == [True]
    assert [e["training"] for e in norms(["--eval"])] == [False]


def test_cli_no_chain_is_success(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["import", str(MODELS / "gated_near_misses.py"), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "no chain found" in result.output


@pytest.mark.parametrize("argument, expected", [
    ("missing_model.py", "no such file"),
    ("no_model_class.py", "class Model"),
    ("fusetune.importer:no_such_factory", "not found"),
])
def test_cli_bad_model_argument(argument: str, expected: str, tmp_path: Path) -> None:
    target = str(MODELS / argument) if argument.endswith(".py") else argument
    result = CliRunner().invoke(main, ["import", target, "-o", str(tmp_path / "out"), "--inputs", "2,3,8,8"])
    assert result.exit_code == 2, result.output
    assert expected in result.output and argument.split(":")[0] in result.output
    assert not (tmp_path / "out").exists()


def test_cli_untraceable_model(tmp_path: Path) -> None:
    """Control flow on a tensor's values: neither torch.fx nor torch.export traces it; bad input (exit 2), the
    file and both reasons named, no traceback, nothing written."""
    result = CliRunner().invoke(main, ["import", str(MODELS / "untraceable.py"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "untraceable.py" in result.output and "torch.fx cannot trace" in result.output
    assert "nor can torch.export" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_factory_with_inputs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(MODELS))
    result = CliRunner().invoke(main, ["import", "two_chains_cat:Model", "-o", str(tmp_path), "--inputs", "2,3,10,10"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "Model_chain1.yaml").exists()


def test_resnet18_every_conv_is_a_chain(tmp_path: Path) -> None:
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed (not on CI)")
    result = import_model("torchvision.models:resnet18", tmp_path, [(2, 3, 64, 64)])
    convs = [n.name for n in result.gm.graph.nodes
             if n.op == "call_module" and isinstance(result.gm.get_submodule(n.target), torch.nn.Conv2d)]
    assert len(convs) == 20
    assert sorted(w.chain.producer_node for w in result.written) == sorted(convs)
    assert all(w.epilogue[0]["op"] == "batch_norm" for w in result.written)
    del torchvision


def test_torchvision_stochastic_depth_is_the_identity_in_eval(tmp_path: Path) -> None:
    """torchvision's EfficientNet in eval mode: stochastic_depth (a torch.fx.wrap'ed call of its own) is a dropout,
    the identity, so each residual block's last chain takes the add after it."""
    pytest.importorskip("torchvision", reason="torchvision is not installed (not on CI)")
    loaded = load_model("torchvision.models:efficientnet_b0", [(2, 3, 64, 64)])
    loaded.model.eval()
    result = import_traced(loaded, trace(loaded.model, loaded.inputs), tmp_path)
    depth = [n.name for n in result.gm.graph.nodes if n.op == "call_function"
             and getattr(n.target, "__name__", "") == "stochastic_depth"]
    assert depth and not set(depth) & set(result.pytorch)
    residual = [w for w in result.written if [e["op"] for e in w.epilogue] == ["batch_norm", "dropout", "add"]]
    assert len(residual) == len(depth)


def test_torchvision_frozen_batch_norm_is_a_batch_norm() -> None:
    """torchvision's FrozenBatchNorm2d (the detection backbones'), kept a call of its own by the trace, is an
    eval-mode batch norm of its four buffers: every convolution of a resnet18 built with it starts a chain with it."""
    models = pytest.importorskip("torchvision.models", reason="torchvision is not installed (not on CI)")
    from torchvision.ops.misc import FrozenBatchNorm2d

    model = models.resnet18(weights=None, norm_layer=FrozenBatchNorm2d).eval()
    chains, refused = find_chains(trace(model, [torch.randn(2, 3, 64, 64)]))
    assert len(chains) == 20 and not refused
    assert all(c.steps[0].entries == [{"op": "batch_norm", "eps": 1e-5, "affine": True, "training": False}]
               for c in chains)
    assert chains[0].steps[0].weights["running_var"] == "bn1.running_var"


def test_parameters_of_other_shapes(tmp_path: Path) -> None:
    """(C, 1, 1) and (1, C, 1, 1) parameters are the config's per-channel ones, a 0-dim one a scalar one, under the
    user's names; the map says how the user's shape binds; load_tuned takes the user's tensors by those names."""
    from fusetune.cache import Cache
    from fusetune.deploy import load_tuned

    stem = "kb_conv2d_scale_bias_scalar_views"
    result = import_model(str(MODELS / f"{stem}.py"), tmp_path)
    (written,) = result.written
    assert written.parameters == {"scale": "scale", "bias": "bias", "alpha": "alpha"}
    assert not written.notes["scale"] and "shape [1, 5, 1, 1]" in written.notes["bias"]
    assert "a single value" in written.notes["alpha"] and "a single value" in written.config.read_text()
    user_file = import_file(MODELS / f"{stem}.py")
    torch.manual_seed(3)
    user = user_file.Model(*user_file.get_init_inputs())
    x = torch.randn(*load_config(written.config).shapes[0])
    with warnings.catch_warnings():  # on CPU: the reference, with the user's weights (warned without a GPU)
        warnings.simplefilter("ignore")
        loaded = load_tuned(written.config, Cache(tmp_path / "cache"), weights=user, device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), user(x))


def test_derived_operands_are_computed_from_the_users_tensors(tmp_path: Path) -> None:
    """Operands the forward computes from the model's tensors alone (a batch norm folded by hand, a scale's exp, a
    gate's sigmoid read by both chains) are parameters the map derives from the user's tensors by name, never
    constants of the import (a buffer's arithmetic is traced, not computed at trace time); load_tuned computes them
    from the model it is given, as the model is then."""
    from fusetune.cache import Cache
    from fusetune.deploy import load_tuned

    stem = "kb_conv2d_derived_operands"
    result = import_model(str(MODELS / f"{stem}.py"), tmp_path)
    first, second = result.written
    assert list(first.derived) == ["derived_getitem", "derived_getitem_1", "derived_exp", "derived_view"]
    assert first.derived["derived_getitem"].reads == ("bn.weight", "bn.running_var")
    assert first.derived["derived_exp"].shape == () and first.derived["derived_view"].shape == (7, 1, 1)
    assert "torch.sqrt(operator.add(bn.running_var, 1e-05))" in first.derived["derived_getitem"].describe()
    assert not any(str(n.target).startswith("_tensor_constant") for n in result.gm.graph.nodes)
    assert second.parameters == {"weight": "weight"} and list(second.derived) == ["derived_mul_5", "derived_getitem_3"]
    assert "sigmoid" in result.pytorch and "sigmoid" not in first.chain.nodes + second.chain.nodes  # read by both
    user_file = import_file(MODELS / f"{stem}.py")
    torch.manual_seed(3)
    user = user_file.Model(*user_file.get_init_inputs()).eval()
    x = torch.randn(*load_config(first.config).shapes[0])
    for change in (None, "bn.running_var", "gate"):
        if change is not None:
            with torch.no_grad():
                functools.reduce(getattr, change.split("."), user).mul_(2.5)
        with warnings.catch_warnings():  # on CPU: the reference, with the user's weights (warned without a GPU)
            warnings.simplefilter("ignore")
            loaded = [load_tuned(w.config, Cache(tmp_path / "cache"), weights=user, device="cpu") for w in result.written]
        with torch.no_grad():
            torch.testing.assert_close(torch.cat([m(x) for m in loaded], dim=1), user(x))


def test_derivations_refuse_what_a_replay_would_change() -> None:
    """An operand computed with a random draw, an in-place write or a module call is no derivation: it stays an
    operand the chain refuses (the op stays in PyTorch), never a parameter replayed otherwise than the model."""
    from fusetune.derived import derivation

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.w = torch.nn.Parameter(torch.randn(4))
            self.act = torch.nn.Tanh()

        def forward(self, x):
            a = self.conv(x) * torch.rand_like(self.w)[:, None, None]
            b = a + self.w.clone().add_(1.0)[:, None, None]
            return b * self.act(self.w)[:, None, None] + self.w.exp()[:, None, None]

    gm = trace(Model(), [torch.randn(2, 3, 9, 7)])
    nodes = {n.name: n for n in gm.graph.nodes}
    refused = [derivation(gm, nodes[name], (4, 1, 1), lambda n: True) for name in ("getitem", "getitem_1", "getitem_2")]
    assert refused == [None, None, None]
    assert derivation(gm, nodes["getitem_3"], (4, 1, 1), lambda n: True) is not None
    (chain,), _ = find_chains(gm)
    assert [e["op"] for s in chain.steps for e in s.entries] == [] and "rand_like" not in chain.nodes


@pytest.mark.parametrize("form, pure", [
    (lambda w: F.normalize(w, dim=0), True),  # a name with "normal" in it, not a draw
    (lambda w: F.gumbel_softmax(w, tau=1.0), False),
    (lambda w: F.rrelu(w, training=True), False),
    (lambda w: torch.empty_like(w) * 0 + w, False),  # uninitialised memory
    (lambda w: F.dropout(w, p=0.5, training=True), False),
])
def test_a_derivation_is_a_function_of_the_models_tensors(form, pure: bool) -> None:
    """What a replay recomputes must equal what the forward computed: random draws and uninitialised memory are
    refused by name; ops whose names merely contain such a word are not."""
    from fusetune.derived import derivation

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return self.conv(x) * form(self.w)[:, None, None]

    gm = trace(Model(), [torch.randn(2, 3, 9, 7)])
    operand = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.getitem)
    assert (derivation(gm, operand, (4, 1, 1), lambda n: True) is not None) == pure


@pytest.mark.parametrize("stem", ["kb_conv2d_shape_branch_export", "kb_conv2d_functional_convs_export",
                                  "kb_conv2d_export_prelu_casts_powers"])
def test_torch_export_where_torch_fx_cannot_trace(stem: str, tmp_path: Path) -> None:
    """Control flow on a shape: torch.fx fails, torch.export's graph (lifted to torch.fx's level) gives the chains,
    with its shape guards named in the map as what stays in PyTorch."""
    loaded = load_model(str(MODELS / f"{stem}.py"))
    with pytest.raises(Exception):
        torch.fx.symbolic_trace(loaded.model)
    result = import_model(str(MODELS / f"{stem}.py"), tmp_path)
    assert result.written
    if "_guards_fn" in result.pytorch:  # torch >= 2.9 keeps export's shape guards in its module
        assert "torch.export's check" in result.pytorch["_guards_fn"]
    assert not any(isinstance(n.target, torch._ops.OpOverload) for w in result.written for n in result.gm.graph.nodes
                   if n.name in w.chain.nodes)  # every chain op lifted to the torch level


def test_eval_mode_forms_of_real_models(tmp_path: Path) -> None:
    """Eval-mode batch norm with momentum=None has no momentum in its entry (only training reads it); the dropouts
    are identities; casts that keep the dtype are aliases of the chain's value, one to float16 ends the chain with
    that reason; a read of the input's dtype is named as such, not as an op outside the vocabulary."""
    result = import_model(str(MODELS / "convnet_eval_dropouts_casts.py"), tmp_path)
    first, second, third, fourth, fifth = result.written
    assert fifth.weights["batch_norm_0.running_var"] == "inorm.running_var"  # InstanceNorm2d(track_running_stats)
    assert fourth.epilogue[0]["op"] == "batch_norm" and not fourth.epilogue[0]["training"]  # nn.SyncBatchNorm
    assert first.epilogue[0] == {"op": "batch_norm", "eps": 1e-5, "affine": True, "training": False}
    assert {"type_1", "relu_"} <= set(first.chain.nodes) and {"type_as", "to"} <= set(second.chain.nodes)
    assert "reads it off a tensor outside the chain" in fifth.chain.end  # .to(x.dtype), x the model's input
    assert [e for e in second.epilogue if e["op"] == "dropout"] == [{"op": "dropout", "p": p, "training": False}
                                                                  for p in (0.3, 0.1, 0.1)]
    assert "it casts the value to torch.float16" in third.chain.end and third.chain.end_node == "half"
    assert "reads a tensor's dtype" in result.pytorch["getattr_3"]  # x.dtype, outside every chain
    train = load_model(str(MODELS / "convnet_eval_dropouts_casts.py")).model.train()
    chains, refused = find_chains(trace(train, [torch.randn(2, 3, 11, 9)]))
    reasons = " ".join([r.reason for r in refused] + [c.end for c in chains])
    assert "training mode with momentum=None" in reasons and "dropout in training mode with p = 0.3" in reasons
    assert "SyncBatchNorm in training mode" in reasons and "InstanceNorm in training mode with track_running" in reasons


def test_prelu_binds_the_users_weights(tmp_path: Path) -> None:
    """nn.PReLU(C)'s weight (C,) is a per-channel parameter bound as a (C, 1, 1) view, nn.PReLU()'s (1,) a scalar
    one, F.prelu's parameter by its attribute path: the user's names, in the map and the configs."""
    result = import_model(str(MODELS / "srresnet_prelu.py"), tmp_path)
    assert [w.parameters for w in result.written] == [{"act1_weight": "act1.weight"}, {"act2_weight": "act2.weight"},
                                                      {"slope": "slope"}]
    assert "view of shape [6, 1, 1]" in result.written[0].notes["act1_weight"]
    assert "a single value" in result.written[1].notes["act2_weight"]
    specs = [load_config(w.config) for w in result.written]
    assert [p.shape for s in specs for p in s.parameters] == ["per_channel", "scalar", "per_channel"]


def test_functional_batch_norm_binds_the_running_statistics(tmp_path: Path) -> None:
    """F.batch_norm on a module's own tensors (timm's BatchNormAct2d): its weight, bias and running statistics by the
    user's names; eval mode without a momentum (unread); training mode with it."""
    result = import_model(str(MODELS / "timm_batchnorm_act.py"), tmp_path)
    first = result.written[0]
    assert first.epilogue[0] == {"op": "batch_norm", "eps": 1e-3, "affine": True, "training": False}
    assert {k: v for k, v in first.weights.items() if k.startswith("batch_norm_0.")} == {
        f"batch_norm_0.{n}": f"bn1.{n}" for n in ("weight", "bias", "running_mean", "running_var")}
    train = load_model(str(MODELS / "timm_batchnorm_act.py")).model.train()
    chains, _ = find_chains(trace(train, [torch.randn(2, 3, 19, 17)]))
    assert chains[0].steps[0].entries == [{"op": "batch_norm", "eps": 1e-3, "momentum": 0.1, "affine": True,
                                           "training": True}]


def test_in_place_forms_are_their_ops_only_on_the_chains_value(tmp_path: Path) -> None:
    """y.mul_(s), x.relu_(), F.elu_(x) on the chain's value are its ops; an op reading a tensor after an in-place
    write reads the write's result (b * F.hardsigmoid(b, inplace=True) is the hardsigmoid squared, not hardswish)."""
    result = import_model(str(MODELS / "inplace_and_pow_forms.py"), tmp_path)
    assert {"mul_", "relu_", "elu_"} <= set(result.written[0].chain.nodes)
    assert result.written[1].chain.nodes == ["conv2", "mul", "hardsigmoid", "mul_1"]
    assert result.written[1].epilogue[1:] == [{"op": "hardsigmoid"}, {"op": "pow", "by": 2.0}]
    assert result.written[0].epilogue[4:] == [{"op": "pow", "by": -0.5}, {"op": "pow", "by": 2.0},
                                              {"op": "pow", "by": -1.0}, {"op": "mul", "by": 2.0},
                                              {"op": "pow", "by": -1.0}]


def test_alpha_and_rounding_mode_are_read(tmp_path: Path) -> None:
    """torch.add / torch.sub's alpha folds into a number operand, or a multiply of the chain's value on the right;
    on a tensor operand it ends the chain, named; rounding_mode None is a true division."""
    result = import_model(str(MODELS / "sweep3_kb_add_sub_alpha_rounding_mode.py"), tmp_path)
    first, second, third = (w.epilogue for w in result.written)
    assert first[0] == {"op": "sub", "by": 0.5} and first[1]["op"] == "div"
    assert [(e["op"], e.get("by")) for e in second[:4]] == [("add", 1.0), ("mul", -0.5), ("add", "b"), ("mul", 4.0)]
    assert third == [{"op": "relu"}]
    assert "alpha=2 scales the other operand, a tensor (b)" in result.pytorch["add_2"]


def test_an_operand_computed_after_the_convolution_from_earlier_ones_is_an_input(tmp_path: Path) -> None:
    """A diffusion block's projected time embedding and an FPN's upsampled top-down value are computed after the
    convolution whose chain reads them, from no later convolution: extra inputs (per sample and channel, full);
    the FPN's interpolate reads the lateral's shape, a size of the chain fixed at the traced shape."""
    unet = import_model(str(MODELS / "sweep3_diffusion_resblock_temb_proj.py"), tmp_path / "unet")
    conv_in, temb = (load_config(w.config) for w in unet.written[:2])
    assert temb.input_kinds == (("getitem", "per_sample_channel"),)
    # conv_in's output, read by norm1 (its chain) and by the shortcut after the block: the chain returns it too
    assert conv_in.outputs == ("chain", "producer") and "conv_in" not in unet.pytorch
    fpn = import_model(str(MODELS / "sweep3_fpn_topdown_interpolate.py"), tmp_path / "fpn")
    laterals = [w for w in fpn.written if w.chain.sizes]  # (P6's pool on P5 reads no size)
    assert [w.chain.sizes for w in laterals] == [{"getitem": torch.Size([4, 4])}, {"getitem_1": torch.Size([8, 8])}]
    assert all(w.chain.example_only() for w in laterals)


def test_an_uneven_pad_is_taken_evenly_and_cropped(tmp_path: Path) -> None:
    """A causal F.pad before an unpadded stride-1 convolution: the larger side's padding on both sides, then slices;
    before a stride-2 convolution the pad stays in PyTorch, and the map says why."""
    result = import_model(str(MODELS / "sweep3_causal_pad_conv.py"), tmp_path)
    causal, masked, strided = result.written
    assert causal.chain.producer["padding"] == 2 and causal.epilogue[0] == {"op": "slice", "dim": 2, "end": -2}
    assert masked.epilogue[:2] == [{"op": "slice", "dim": 2, "end": -1}, {"op": "slice", "dim": 3, "end": -1}]
    assert "padding" not in strided.chain.producer
    assert "does not take as its padding" in result.pytorch["pad_2"]
    # timm's Conv2dSame (torch.export's trace): the chain before an uneven pad of a stride-2 convolution ends there, why
    same = import_model(str(MODELS / "sweep4_timm_conv2d_same_conv_forward.py"), tmp_path / "same")
    assert same.written[0].chain.end.endswith("pads a convolution's input, which that convolution does not take as "
                                              "its padding (it takes one of the spatial dims read by it alone: an even "
                                              "pad, or an uneven zero pad before a stride-1 convolution)")


# --------------------------------------------------------------------------------------------------
# A new user's first imports: the convention's rough edges, the files written, an import into a folder again

#: The not_imported files for the loader's and the example's errors, each named with its cause on the command line.
USER_ERRORS = ["get_inputs_not_callable", "get_init_inputs_not_callable", "conv1d_given_4d_input",
               "unbatched_input_then_batchnorm", "not_utf8_latin1_comment"]


@pytest.mark.parametrize("stem", USER_ERRORS)
def test_cli_user_errors_name_the_file_and_exit_2(stem: str, tmp_path: Path) -> None:
    """Each is bad input: exit 2, one line naming the file and what was expected, no traceback, nothing written."""
    result = CliRunner().invoke(main, ["import", str(MODELS / f"{stem}.py"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"{stem}.py" in result.output and "Traceback" not in result.output
    assert re.search(NOT_IMPORTED[stem], result.output.strip().splitlines()[-1])
    assert not (tmp_path / "out").exists()


#: The not_imported files whose failure torch itself logs first (a fake kernel refusing the example's shapes, with
#: torch's traceback), on torch.fx's trace and on torch.export's.
TORCH_LOGGED = ["example_smaller_than_a_pool_window", "example_smaller_than_a_pool_window_export"]


@pytest.mark.parametrize("stem", TORCH_LOGGED)
def test_a_failure_torch_logs_is_said_once_without_its_traceback(stem: str, tmp_path: Path) -> None:
    """The command as a user types it, in a process of its own: torch's logger writes to the stderr it was built
    with, which neither a redirect nor CliRunner reaches. Exit 2, the import's one line, no traceback."""
    done = subprocess.run([sys.executable, "-m", "fusetune", "import", str(MODELS / f"{stem}.py"), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert re.search(NOT_IMPORTED[stem], done.stderr.strip().splitlines()[-1])
    assert not (tmp_path / "out").exists()


def test_one_tensor_from_get_inputs_is_the_one_argument(tmp_path: Path) -> None:
    """get_inputs() returning a bare tensor: the forward's one argument (as optimize takes it), not its samples."""
    loaded = load_model(str(MODELS / "get_inputs_single_tensor.py"))
    assert len(loaded.inputs) == 1 and loaded.inputs[0].shape == (2, 3, 10, 9)
    result = import_model(str(MODELS / "get_inputs_single_tensor.py"), tmp_path)
    assert [w.chain.producer["op"] for w in result.written] == ["conv2d"]
    assert load_config(result.written[0].config).shapes[0] == (2, 3, 10, 9)
    assert example_arguments(loaded.inputs[0]) == (loaded.inputs[0],)
    assert example_arguments(loaded.inputs[0], allow_tensor=False) is None  # get_init_inputs: a list of arguments


def test_a_declared_encoding_is_read_as_python_reads_it(tmp_path: Path) -> None:
    """PEP 263: a Latin-1 file that says so is valid source (the undeclared one is refused: USER_ERRORS)."""
    assert b"\xe9" in (MODELS / "latin1_declared_encoding.py").read_bytes()
    assert len(import_model(str(MODELS / "latin1_declared_encoding.py"), tmp_path).written) == 1


def test_an_unbatched_convolution_stays_in_pytorch_with_the_rank_it_expects(tmp_path: Path) -> None:
    """The forward runs on a 3-D example (PyTorch's Conv2d takes an unbatched sample); the kernels do not: the
    convolution is no chain, its reason the rank and layout expected and the shape got."""
    result = import_model(str(MODELS / "unbatched_conv_runs.py"), tmp_path)
    assert not result.written
    assert ("conv1 (Conv2d) expects a 4-D input [N, C, H, W], got [3, 8, 8] (an unbatched input"
            in result.pytorch["conv1"])


def test_a_convolution_of_another_rank_is_said_without_torchs_unbatched_text(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["import", str(MODELS / "conv1d_given_4d_input.py"), "-o", str(tmp_path)])
    assert result.exit_code == 2 and "unbatched" not in result.output, result.output


def test_configs_and_map_take_the_mode_a_plain_write_would(tmp_path: Path) -> None:
    """mkstemp's 0600 would stay with the renamed config: a colleague or a service account could not read it."""
    result = import_model(str(MODELS / "two_chains_cat.py"), tmp_path / "out")
    plain = tmp_path / "plain.yaml"
    plain.write_text("")
    mode = stat.S_IMODE(plain.stat().st_mode)
    assert mode == usual_mode()
    for path in [w.config for w in result.written] + [result.map_path]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def _import_cli(out: Path, *options: str):
    return CliRunner().invoke(main, ["import", str(MODELS / "two_chains_cat.py"), "-o", str(out), *options])


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_import_again_overwrites_only_what_an_import_wrote(tmp_path: Path) -> None:
    """Into the same folder again: unchanged configs and the map are written again; a config the user edited is
    refused, named, with nothing written (exit 2), until --force overwrites it and says so."""
    out = tmp_path / "out"
    assert _import_cli(out).exit_code == 0
    first = _contents(out)
    again = _import_cli(out)
    assert again.exit_code == 0, again.output
    assert _contents(out) == first
    edited = out / "two_chains_cat_chain1.yaml"
    edited.write_bytes(first[edited.name] + b"# tuned by hand\n")
    before = _contents(out)
    refused = _import_cli(out)
    assert refused.exit_code == 2, refused.output
    assert str(edited) in refused.output and "--force" in refused.output and "nothing was written" in refused.output
    assert _contents(out) == before
    forced = _import_cli(out, "--force")
    assert forced.exit_code == 0, forced.output
    assert f"overwrote {edited}" in forced.output
    assert _contents(out) == first


def test_import_again_overwrites_what_an_earlier_import_wrote_differently(tmp_path: Path) -> None:
    """A config that still holds what the earlier import wrote (its sha256 in the map), though this import writes
    other text (the model or the importer changed since), is overwritten without --force."""
    out = tmp_path / "out"
    assert _import_cli(out).exit_code == 0
    first = _contents(out)
    config, map_path = out / "two_chains_cat_chain0.yaml", out / "two_chains_cat.map.json"
    older = first[config.name].replace(b"# Imported by", b"# Imported (an older version) by")
    config.write_bytes(older)
    doc = json.loads(map_path.read_text())
    assert doc["chains"][0]["sha256"] == hashlib.sha256(first[config.name]).hexdigest()
    doc["chains"][0]["sha256"] = hashlib.sha256(older).hexdigest()
    map_path.write_text(json.dumps(doc))
    result = _import_cli(out)
    assert result.exit_code == 0, result.output
    assert _contents(out) == first and "overwrote" not in result.output


def test_import_refuses_a_config_no_import_recorded(tmp_path: Path) -> None:
    """A file of the config's name where no map records it (the user's own): refused, nothing written."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "two_chains_cat_chain0.yaml").write_text("# mine\n")
    result = _import_cli(out)
    assert result.exit_code == 2 and "two_chains_cat_chain0.yaml" in result.output, result.output
    assert _contents(out) == {"two_chains_cat_chain0.yaml": b"# mine\n"}


def test_import_again_leaves_a_config_of_a_chain_gone_and_says_so(tmp_path: Path) -> None:
    """A config the earlier import wrote that this one does not (the model lost a chain) is kept, named."""
    out = tmp_path / "out"
    assert _import_cli(out).exit_code == 0
    map_path = out / "two_chains_cat.map.json"
    doc = json.loads(map_path.read_text())
    gone = out / "two_chains_cat_chain2.yaml"
    gone.write_bytes((out / "two_chains_cat_chain1.yaml").read_bytes())
    doc["chains"].append({**doc["chains"][1], "config": str(gone), "name": "two_chains_cat_chain2"})
    map_path.write_text(json.dumps(doc))
    result = _import_cli(out)
    assert result.exit_code == 0, result.output
    assert f"left {gone} as it is" in result.output and gone.exists()


def test_a_generated_config_that_does_not_validate_is_never_written(tmp_path: Path) -> None:
    """write_config validates the text before it replaces anything: the error names the config, the old file
    stays, nothing else is left in the folder."""
    from fusetune.errors import FusetuneError
    from fusetune.importer import write_config

    path = tmp_path / "m_chain0.yaml"
    good = (SEEDS["groupnorm"]).read_text()
    write_config(path, good)
    with pytest.raises(FusetuneError, match=f"{path}: the generated config does not validate"):
        write_config(path, good.replace("epilogue:", "epilogeu:", 1))
    assert path.read_text() == good and [p.name for p in tmp_path.iterdir()] == [path.name]
