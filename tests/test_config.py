"""The seed configs load, shapes flow through the chain, and the digest keys exactly the problem."""
from __future__ import annotations

import copy

import pytest
import yaml

from fusetune.config import ProblemSpec, SearchSettings, load_config, parse_config
from fusetune.dtypes import ALIASES, DTYPES, alias_of
from fusetune.errors import ConfigError
from fusetune.ops import (REGISTRY, AdaptiveAvgPool, BatchNorm, Clamp, DimReduce, GroupNorm, InstanceNorm,
                          MaxPool, Mul)
from fusetune.ops.base import number_text_hint

from conftest import ROOT, SEEDS

#: name -> (output shape for shapes[0], output shape for shapes[1])
OUTPUT_SHAPES = {
    "convt3d_scale_maxpool_gap_clamp": ((128, 16, 1, 1, 1), (3, 16, 1, 1, 1)),
    "convt3d_scale_batchnorm_gap": ((16, 128, 1, 1, 1), (3, 128, 1, 1, 1)),
    "conv2d_groupnorm_scale_maxpool_clamp": ((128, 64, 31, 31), (3, 64, 8, 10)),
    "conv3d_mul_instancenorm_clamp_mul_max": ((128, 14, 30, 30), (3, 9, 17, 21)),
}


def _raw(key: str) -> dict:
    return yaml.safe_load(SEEDS[key].read_text())


def _digest(raw: dict) -> str:
    return parse_config(copy.deepcopy(raw), "x.yaml").digest()


def test_all_four_seeds_load(seed_path):
    spec = load_config(seed_path)
    assert isinstance(spec, ProblemSpec)
    assert spec.path == str(seed_path)
    assert spec.name == seed_path.stem
    assert spec.dtype == "float32"
    assert spec.search == SearchSettings(trials=24, timeout=300.0, seed=0)
    assert isinstance(spec.search.timeout, float)
    assert len(spec.shapes) == 2


def test_seed_names_cover_the_table():
    assert {load_config(p).name for p in SEEDS.values()} == set(OUTPUT_SHAPES)


def test_output_shapes_of_seed_shapes(seed_path):
    spec = load_config(seed_path)
    expected = OUTPUT_SHAPES[spec.name]
    assert tuple(spec.output_shape(s) for s in spec.shapes) == expected


def test_shapes_through_each_op():
    spec = load_config(SEEDS["groupnorm"])
    assert spec.shapes_through((3, 8, 37, 45)) == [
        (3, 64, 35, 43),  # conv 3x3
        (3, 64, 35, 43),  # group norm
        (3, 64, 35, 43),  # mul
        (3, 64, 8, 10),  # max pool 4 (floor)
        (3, 64, 8, 10),  # clamp
    ]
    spec = load_config(SEEDS["maxpool_gap"])
    # transposed conv: (s-1)*2 - 2*1 + 3
    assert spec.shapes_through((3, 3, 7, 11, 13)) == [
        (3, 16, 13, 21, 25), (3, 16, 13, 21, 25), (3, 16, 6, 10, 12), (3, 16, 1, 1, 1), (3, 16, 1, 1, 1)]
    spec = load_config(SEEDS["instancenorm"])
    assert spec.shapes_through((3, 3, 11, 19, 23))[-2:] == [(3, 16, 9, 17, 21), (3, 9, 17, 21)]


def test_producer_and_ops_parsed_as_written():
    spec = load_config(SEEDS["maxpool_gap"])
    p = spec.producer
    assert (p.kind, p.in_channels, p.out_channels) == ("conv_transpose3d", 3, 16)
    assert (p.kernel_size, p.stride, p.padding, p.output_padding, p.bias) == ((3,) * 3, (2,) * 3, (1,) * 3, (0,) * 3, True)
    assert p.transposed and p.spatial_dims == 3
    assert [type(op) for op in spec.epilogue] == [Mul, MaxPool, AdaptiveAvgPool, Clamp]
    assert spec.epilogue[0].scalar == 0.5 and spec.epilogue[0].param is None
    assert spec.epilogue[1].kernel_size == (2, 2, 2) and spec.epilogue[1].stride == (2, 2, 2)

    spec = load_config(SEEDS["instancenorm"])
    assert [type(op) for op in spec.epilogue] == [Mul, InstanceNorm, Clamp, Mul, DimReduce]
    assert spec.epilogue[0].param == "m" and spec.epilogue[0].scalar is None
    assert (spec.epilogue[2].min, spec.epilogue[2].max) == (-1.0, 1.0)
    assert spec.epilogue[4].mode == "max" and spec.epilogue[4].dim == 1
    assert [p.name for p in spec.parameters] == ["m"] and spec.parameters[0].init == "randn"

    spec = load_config(SEEDS["batchnorm"])
    bn = spec.epilogue[1]
    assert isinstance(bn, BatchNorm) and bn.training and bn.scope == "batch"
    assert (bn.eps, bn.momentum, bn.affine) == (1e-5, 0.1, True)

    spec = load_config(SEEDS["groupnorm"])
    gn = spec.epilogue[0]
    assert isinstance(gn, GroupNorm) and gn.groups == 16 and gn.groups_of(64) == 4


def test_canonical_form_and_digest_are_stable(seed_path):
    a, b = load_config(seed_path), load_config(seed_path)
    assert a.canonical() == b.canonical()
    assert a.digest() == b.digest()
    assert len(a.digest()) == 16 and int(a.digest(), 16) >= 0


def test_seed_digests_are_distinct():
    digests = {load_config(p).digest() for p in SEEDS.values()}
    assert len(digests) == len(SEEDS)


@pytest.mark.parametrize("change", [
    lambda r: r["epilogue"][1].__setitem__("eps", 1.0e-3),
    lambda r: r["epilogue"][1].__setitem__("momentum", 0.2),
    lambda r: r["epilogue"][1].__setitem__("training", False),
    lambda r: r["epilogue"][0].__setitem__("by", 3.0),
    lambda r: r["epilogue"][0].__setitem__("op", "div"),
    lambda r: r["epilogue"].append({"op": "relu"}),
    lambda r: r["producer"].__setitem__("kernel_size", 3),
    lambda r: r["producer"].__setitem__("bias", False),
    lambda r: r["producer"].__setitem__("out_channels", 64),
], ids=["eps", "momentum", "training", "scalar", "mul->div", "extra op", "kernel_size", "bias", "out_channels"])
def test_digest_changes_with_the_problem(change):
    raw = _raw("batchnorm")
    before = _digest(raw)
    change(raw)
    assert _digest(raw) != before


def test_digest_changes_with_clamp_bound_and_parameter_init():
    raw = _raw("groupnorm")
    before = _digest(raw)
    raw2 = copy.deepcopy(raw)
    raw2["epilogue"][3]["max"] = 0.5
    assert _digest(raw2) != before
    raw3 = copy.deepcopy(raw)
    raw3["parameters"]["scale"]["init"] = "randn"
    assert _digest(raw3) != before
    raw4 = copy.deepcopy(raw)
    raw4["epilogue"][0]["groups"] = 8
    assert _digest(raw4) != before


@pytest.mark.parametrize("key", ["groupnorm", "instancenorm", "batchnorm", "maxpool_gap"])
def test_digest_ignores_name_search_and_shapes(key):
    raw = _raw(key)
    before = _digest(raw)
    raw["name"] = "something-else_2"
    raw["search"] = {"trials": 3, "timeout": 5, "seed": 123}
    raw["shapes"] = [raw["shapes"][1]]
    spec = parse_config(copy.deepcopy(raw), "elsewhere.yaml")
    assert spec.digest() == before
    assert "name" not in spec.canonical() and "search" not in spec.canonical()
    assert "shapes" not in spec.canonical()
    del raw["search"]
    assert _digest(raw) == before


def test_digest_ignores_spelling_of_the_same_problem():
    """Defaults written out, ints for floats, negative dims and key order: same problem, same digest."""
    raw = _raw("groupnorm")
    before = _digest(raw)
    same = copy.deepcopy(raw)
    same["epilogue"][0] = {"eps": 0.00001, "groups": 16, "op": "group_norm", "affine": True}
    same["epilogue"][2] = {"op": "max_pool", "kernel_size": [4, 4], "stride": 4}
    same["epilogue"][3] = {"op": "clamp", "min": 0, "max": 1}
    same["producer"] = {**raw["producer"], "stride": 1, "padding": 0, "bias": True}
    same["dtype"] = "float32"
    assert _digest(same) == before
    del same["dtype"]  # float32 is the default
    assert _digest(same) == before

    raw = _raw("instancenorm")
    before = _digest(raw)
    same = copy.deepcopy(raw)
    same["epilogue"][4]["dim"] = -4  # rank 5 input: -4 is dim 1
    del same["epilogue"][1]["eps"]  # 1e-5 is the default
    assert _digest(same) == before
    del same["epilogue"][4]["dim"]  # dim 1 is the default
    assert _digest(same) == before


def test_reduce_ops_are_distinguished_in_digest():
    raw = _raw("instancenorm")
    digests = set()
    for mode in ("max", "min", "sum", "mean"):
        raw["epilogue"][4]["op"] = mode
        digests.add(_digest(raw))
    assert len(digests) == 4


def test_parse_config_defaults_path():
    raw = _raw("groupnorm")
    raw["name"] = ""
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith("<config>: name: ")


def test_search_defaults_when_omitted():
    raw = _raw("groupnorm")
    del raw["search"]
    assert parse_config(raw, "x.yaml").search == SearchSettings()
    raw["search"] = {"timeout": 7}
    s = parse_config(raw, "x.yaml").search
    assert (s.trials, s.timeout, s.seed) == (32, 7.0, 0)


def test_parameters_may_be_omitted_or_null():
    raw = _raw("batchnorm")
    assert "parameters" not in raw
    assert parse_config(copy.deepcopy(raw), "x.yaml").parameters == ()
    raw["parameters"] = None
    assert parse_config(raw, "x.yaml").parameters == ()


def test_training_batch_norm_needs_two_values_per_channel():
    raw = _raw("batchnorm")
    raw["producer"]["kernel_size"] = 1
    raw["shapes"] = [[1, 64, 1, 1, 1]]
    with pytest.raises(ConfigError) as info:
        parse_config(copy.deepcopy(raw), "x.yaml")
    assert info.value.key == "epilogue[1]"
    assert "more than one value per channel" in str(info.value)
    raw["epilogue"][1]["training"] = False  # eval mode: running statistics, any size works
    assert parse_config(raw, "x.yaml").output_shape((1, 64, 1, 1, 1)) == (1, 128, 1, 1, 1)


@pytest.mark.parametrize("raw, offered", [
    ({"kernel_size": 5}, True),
    ({"kernel_size": [3, 2, 4], "padding": [2, 0, 3]}, True),  # padding up to k - 1
    ({"kernel_size": 3, "padding": 3}, False),                 # more: the plain form would need a crop
    ({"kernel_size": 3, "stride": [1, 2, 1]}, False),          # a stride spreads the input: no plain form
])
def test_transposed_convolution_forward_form_computes_the_same(raw, offered):
    """A stride-1 transposed convolution equals the plain convolution with flipped, swapped weights
    and padding k - 1 - p; the code the generated model runs for it is checked in float64."""
    from fusetune.producers import Producer

    producer = Producer.parse({"op": "conv_transpose3d", "in_channels": 3, "out_channels": 5, **raw}, "c.yaml")
    assert producer.has_forward_form is offered
    assert not Producer.parse({"op": "conv3d", "in_channels": 3, "out_channels": 5, "kernel_size": 3},
                              "c.yaml").has_forward_form
    if not offered:
        return
    torch = pytest.importorskip("torch")
    import torch.nn as nn
    import torch.nn.functional as F

    module = eval(producer.module_code(), {"nn": nn}).double()  # noqa: S307 - our own code
    x = torch.randn(2, 3, 4, 6, 5, dtype=torch.float64)
    got = eval(producer.functional_code("x", "module", "module.bias", forward_form=True),  # noqa: S307
               {"F": F}, {"x": x, "module": module})
    torch.testing.assert_close(got, module(x), rtol=1e-12, atol=1e-12)


# -- duplicate keys and encodings: refused, never silently read ----------------------------------

def _seed_text() -> str:
    return SEEDS["groupnorm"].read_text()


def test_duplicate_top_level_key_is_refused_with_file_key_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(_seed_text() + "shapes:\n  - [16, 8, 64, 64]\n")  # a second shapes: used to drop the first
    line = len(_seed_text().splitlines()) + 1
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "shapes" and info.value.exit_code == 2
    assert str(info.value).startswith(f"{path}: shapes: duplicate key 'shapes' at line {line} (first given at line ")


@pytest.mark.parametrize("text, key, line", [
    ("name: a\nproducer: {op: conv2d, in_channels: 3, out_channels: 4, kernel_size: 3, kernel_size: 5}\n",
     "producer.kernel_size", 2),
    ("name: a\nparameters:\n  m: {init: ones}\n  m: {init: zeros}\n", "parameters.m", 4),
    ("name: a\nepilogue:\n  - {op: relu}\n  - op: clamp\n    min: 0.0\n    min: 1.0\n", "epilogue[1].min", 6),
    ("name: a\nsearch:\n  trials: 3\n  seed: 1\n  trials: 4\n", "search.trials", 5),
])
def test_duplicate_nested_key_is_refused_at_any_depth(tmp_path, text, key, line):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key
    assert f"duplicate key '{key.rsplit('.', 1)[-1]}' at line {line}" in str(info.value)
    assert str(path) in str(info.value)


def test_merge_key_overrides_are_not_duplicates(tmp_path):
    path = tmp_path / "merge.yaml"
    text = _seed_text().replace("search: {trials: 24, timeout: 300, seed: 0}",
                                "defaults: &d {trials: 24, timeout: 300, seed: 0}\n"
                                "search: {<<: *d, trials: 5}")
    path.write_text(text)
    with pytest.raises(ConfigError) as info:  # the anchor's host key is unknown: but not a duplicate
        load_config(path)
    assert info.value.key == "defaults"
    path.write_text(text.replace("defaults: &d {trials: 24, timeout: 300, seed: 0}\n", "")
                    .replace("{<<: *d, trials: 5}", "{trials: 5}"))
    assert load_config(path).search.trials == 5


def test_non_utf8_config_is_refused_with_the_byte_offset(tmp_path):
    path = tmp_path / "latin1.yaml"
    data = ("# café\n" + _seed_text()).encode("latin-1")
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    offset = data.index(b"\xe9")
    assert info.value.key == "" and info.value.exit_code == 2
    assert str(info.value) == (f"{path}: not UTF-8 text: byte 0xe9 at byte offset {offset} (line 1) is not valid "
                               "UTF-8; save the file as UTF-8")


def test_utf8_with_byte_order_mark_and_non_ascii_comment_loads(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + ("# café\n" + _seed_text()).encode())
    assert load_config(path).name == load_config(SEEDS["groupnorm"]).name


# --- Hints for a new user's near misses: dtype spellings, numbers YAML read as text, ops without arguments.

@pytest.mark.parametrize("alias", sorted(ALIASES) + ["FP16", "torch.half", "torch.float32"])
def test_dtype_alias_is_refused_with_the_name_it_means(alias):
    """Each alias names a dtype of the table, and a config that writes it is told that name, as the config's own
    spelling is part of every cache key."""
    meant = alias_of(alias)
    assert meant in DTYPES
    raw = _raw("groupnorm")
    raw["dtype"] = alias
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert info.value.key == "dtype"
    assert str(info.value).endswith(f"got {alias!r}; did you mean '{meant}'?")


def test_unsupported_dtype_gets_no_misleading_suggestion():
    """float64 is a near miss of float16 and float32 letter by letter, but neither is what it means."""
    raw = _raw("groupnorm")
    raw["dtype"] = "float64"
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("text", ["1e-5", "1E-5", "-2e3", "1.0e5", "3.5E2", ".5e3", "+7e+1"])
def test_exponent_yaml_reads_as_text_gets_a_spelling_it_reads_as_the_same_number(text):
    assert isinstance(yaml.safe_load(f"v: {text}")["v"], str)  # the premise: YAML 1.1 reads it as text
    hint = number_text_hint(text)
    assert "YAML 1.1" in hint and "quoted" not in hint
    spelt = hint.rsplit("write ", 1)[1].rstrip(")")
    assert yaml.safe_load(f"v: {spelt}")["v"] == float(text)


@pytest.mark.parametrize("text", ["0.1", "5", "-3", "1.0e-5", "+1.5e+3", ".5"])
def test_number_yaml_reads_as_a_number_was_quoted(text):
    assert isinstance(yaml.safe_load(f"v: {text}")["v"], (int, float))  # so only quotes made it text
    assert number_text_hint(text) == f" (a quoted number is text: write {text} without the quotes)"


@pytest.mark.parametrize("text", ["tiny", "inf", "nan", "1,5", "0x10", "١"])
def test_text_that_is_no_finite_number_gets_no_number_hint(text):
    assert number_text_hint(text) == ""


def test_every_op_refuses_an_unknown_key_naming_what_it_takes():
    """An op that takes arguments lists them; one that takes none says so (not "expected one of: no other keys")."""
    takes_none = []
    for kind in sorted(REGISTRY):
        raw = _raw("groupnorm")
        raw["epilogue"] = [{"op": kind, "zz_unknown": 1}]
        with pytest.raises(ConfigError) as info:
            parse_config(raw, "x.yaml")
        assert info.value.key == "epilogue[0].zz_unknown"  # a typo is named before what it may have meant
        message = str(info.value)
        assert "no other keys" not in message
        if f"{kind} takes no arguments" in message:
            takes_none.append(kind)
        else:
            assert "(expected one of: " in message, message
    assert "relu" in takes_none


def test_outputs_says_what_the_model_returns_and_is_part_of_the_problem():
    """``outputs: [chain, producer]`` makes the model return the convolution's output beside the chain's, in that
    order, at the shapes each has; it is part of the problem's key, which a config without it keeps as it was."""
    path = ROOT / "tests" / "chains" / "conv2d_groupnorm_silu_returns_producer.yaml"
    spec = load_config(path)
    assert spec.outputs == ("chain", "producer") and spec.returns_producer
    shape = spec.shapes[0]
    assert spec.output_shapes(shape) == [spec.output_shape(shape), spec.producer.out_shape(shape)]
    raw = yaml.safe_load(path.read_text())
    del raw["outputs"]
    alone = parse_config(raw, "x.yaml")
    assert alone.outputs == ("chain",) and not alone.returns_producer and "outputs" not in alone.canonical()
    assert spec.canonical() == {**alone.canonical(), "outputs": ["chain", "producer"]}
    assert spec.digest() != alone.digest()
    raw["outputs"] = "producer"
    with pytest.raises(ConfigError, match="expected a list of what the model returns"):
        parse_config(raw, "x.yaml")
