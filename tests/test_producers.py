"""Every convolution producer a PyTorch user writes (fusetune/producers.py): PyTorch's names, shape
rule and results on the CPU, the kernels' 3-D geometry, and which worlds take it."""
from __future__ import annotations

import copy

import pytest

from fusetune.codegen import plan_facts, plan_space, render
from fusetune.worlds import WORLDS, refusals
from fusetune.config import parse_config
from fusetune.errors import ConfigError
from fusetune.plan import make_plan
from fusetune.producers import KINDS, Producer
from fusetune.space import load_family

from conftest import REFERENCE_WORLDS, import_file

#: A tiny input per spatial dims (N, C, spatial): sizes that differ per axis, so a swapped axis shows.
SPATIAL = {1: (9,), 2: (7, 9), 3: (5, 7, 6)}
N, CIN, COUT = 2, 4, 6
#: Argument combinations (beside in/out channels) every producer kind of the matching sort takes;
#: a list value is per dim (cut to the kind's spatial dims from the end).
BOTH = [
    {"kernel_size": 3},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "dilation": 2, "padding": 1},
    {"kernel_size": 2, "dilation": 3},
    {"kernel_size": 3, "groups": 2},
    {"kernel_size": [3, 1, 2], "stride": [1, 2, 2], "padding": [2, 0, 1], "dilation": [1, 2, 1], "groups": 2,
     "bias": False},
]
PLAIN = BOTH + [
    {"kernel_size": 3, "padding": "same"},                  # odd kernel: symmetric
    {"kernel_size": 2, "padding": "same"},                  # even kernel: the extra one after
    {"kernel_size": 4, "padding": "same", "dilation": 1},
    {"kernel_size": 2, "padding": "same", "dilation": 3},   # total 3: asymmetric
    {"kernel_size": 3, "padding": "same", "dilation": 2},   # total 4: symmetric
    {"kernel_size": [2, 3, 4], "padding": "same", "groups": 2},
    {"kernel_size": 3, "padding": "valid", "stride": 2},
    # nn.Conv*d's padding modes: the input padded by F.pad, then the convolution unpadded
    {"kernel_size": 3, "padding": 1, "padding_mode": "reflect"},
    {"kernel_size": 3, "padding": [1, 2, 1], "stride": 2, "padding_mode": "replicate"},
    {"kernel_size": 3, "padding": 2, "dilation": 2, "groups": 2, "padding_mode": "circular"},
    {"kernel_size": 2, "padding": "same", "padding_mode": "reflect"},  # the odd one after
]
TRANSPOSED = BOTH + [
    {"kernel_size": 3, "stride": 2, "padding": 1, "output_padding": 1},
    {"kernel_size": 3, "dilation": 2, "output_padding": 1},           # output_padding < dilation, stride 1
    {"kernel_size": 2, "stride": [2, 3, 2], "output_padding": [1, 2, 0], "groups": 2},
    {"kernel_size": 3, "padding": 2},                                  # p <= k - 1: a forward form
    {"kernel_size": 3, "padding": 3, "dilation": 2},                   # p <= d(k - 1): one with dilation
]


def _per_dim(args: dict, dims: int) -> dict:
    return {k: (v[-dims:] if isinstance(v, list) else v) for k, v in args.items()}


CASES = [(kind, _per_dim(args, KINDS[kind].spatial_dims)) for kind in KINDS
         for args in (TRANSPOSED if KINDS[kind].transposed else PLAIN)]


def _ids(case) -> str:
    kind, args = case
    return kind + "-" + "-".join(f"{k}{v}" for k, v in args.items()).replace(" ", "")


def _producer(kind: str, args: dict) -> Producer:
    return Producer.parse({"op": kind, "in_channels": CIN, "out_channels": COUT, **args}, "p.yaml")


def test_the_table_has_every_pytorch_convolution():
    import torch.nn as nn
    import torch.nn.functional as F

    assert set(KINDS) == {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}
    for kind, (dims, module, transposed) in KINDS.items():
        assert hasattr(nn, module) and hasattr(F, kind)  # the op name is torch's functional one
        assert module.endswith(f"{dims}d") and ("Transpose" in module) is transposed


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_shape_rule_and_functional_code_are_pytorchs(case):
    """The shape rule, the module and the functional call the generated model makes, each against
    PyTorch's own module run on the CPU in float64."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    kind, args = case
    producer = _producer(kind, args)
    torch.manual_seed(0)
    module = eval(producer.module_code(), {"nn": nn}).double()  # noqa: S307 - our own code
    x = torch.randn(N, CIN, *SPATIAL[producer.spatial_dims], dtype=torch.float64)
    expected = module(x)
    assert producer.out_shape(tuple(x.shape)) == tuple(expected.shape)
    bias = "module.bias" if producer.bias else "None"
    got = eval(producer.functional_code("x", "module", bias), {"F": F, "module": module, "x": x})  # noqa: S307
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    if producer.has_forward_form:
        forward = eval(producer.functional_code("x", "module", bias, forward_form=True),  # noqa: S307
                       {"F": F, "module": module, "x": x})
        assert torch.allclose(forward, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_geometry_is_3d_with_leading_ones(case):
    kind, args = case
    producer = _producer(kind, args)
    pad = 3 - producer.spatial_dims
    conv = producer.geometry()
    assert conv["kernel"] == (1,) * pad + producer.kernel_size and conv["stride"] == (1,) * pad + producer.stride
    assert conv["dilation"] == (1,) * pad + producer.dilation and conv["groups"] == producer.groups
    assert conv["padding"] == (0,) * pad + producer.padding
    assert conv["padding_end"] == (0,) * pad + producer.padding_end
    assert conv["output_padding"] == (0,) * pad + producer.output_padding
    # The weights PyTorch holds.
    import math
    assert conv["weights"] == CIN * COUT // producer.groups * math.prod(producer.kernel_size)
    # 'same': d(k - 1) in all, the odd one after.
    if args.get("padding") == "same":
        for d, k, before, after in zip(producer.dilation, producer.kernel_size, producer.padding,
                                       producer.padding_end):
            assert before + after == d * (k - 1) and after - before in (0, 1)
    else:
        assert producer.padding_end == producer.padding
    # The same 3-D output the kernels see, from the padded geometry.
    spatial = (1,) * pad + SPATIAL[producer.spatial_dims]
    out = producer.out_shape((N, CIN, *SPATIAL[producer.spatial_dims]))
    assert (1,) * pad + out[2:] == _conv_out_3d(conv, spatial)


def _conv_out_3d(conv: dict, spatial: tuple) -> tuple:
    out = []
    for i, k, s, p, e, d, op in zip(spatial, conv["kernel"], conv["stride"], conv["padding"], conv["padding_end"],
                                    conv["dilation"], conv["output_padding"]):
        if conv["transposed"]:
            out.append((i - 1) * s - p - e + d * (k - 1) + op + 1)
        else:
            out.append((i + p + e - d * (k - 1) - 1) // s + 1)
    return tuple(out)


def test_canonical_keeps_the_earlier_keys():
    """Fields added later (dilation, groups, same) are in the cache key only where they are not what
    every earlier config had; a symmetric 'same' is its integers."""
    old = _producer("conv3d", {"kernel_size": 3, "padding": 1})
    assert set(old.canonical()) == {"kind", "in_channels", "out_channels", "kernel_size", "stride", "padding",
                                    "output_padding", "bias"}
    assert _producer("conv3d", {"kernel_size": 3, "padding": "same"}).canonical() == old.canonical()
    assert _producer("conv3d", {"kernel_size": 3, "padding": 1, "dilation": 2}).canonical()["dilation"] == (2, 2, 2)
    assert _producer("conv3d", {"kernel_size": 3, "groups": 2}).canonical()["groups"] == 2
    assert _producer("conv3d", {"kernel_size": 2, "padding": "same"}).canonical()["same"] is True
    # The existing producers' code is as it was: no dilation or groups arguments at their defaults.
    assert old.module_code() == "nn.Conv3d(4, 6, kernel_size=(3, 3, 3), stride=(1, 1, 1), padding=(1, 1, 1), bias=True)"


# ---------------------------------------------------------------------------------------------
# Configs: what parse_config refuses, and which worlds the plan offers.

CHAIN_STATS_POOL = [{"op": "mul", "by": 2.0}, {"op": "batch_norm"}, {"op": "relu"},
                    {"op": "max_pool", "kernel_size": 2}]
BASE = {
    "conv1d": ({"op": "conv1d", "in_channels": 8, "out_channels": 16, "kernel_size": 3}, [[4, 8, 64]]),
    "conv_transpose1d": ({"op": "conv_transpose1d", "in_channels": 8, "out_channels": 16, "kernel_size": 3,
                          "stride": 2, "padding": 1, "output_padding": 1}, [[4, 8, 64]]),
    "conv_transpose2d": ({"op": "conv_transpose2d", "in_channels": 16, "out_channels": 64, "kernel_size": 3,
                          "stride": 2, "padding": 1, "output_padding": 1}, [[4, 16, 16, 16]]),
    "conv2d": ({"op": "conv2d", "in_channels": 8, "out_channels": 16, "kernel_size": 3}, [[4, 8, 32, 32]]),
}


def _raw(kind: str, epilogue: list | None = None, **producer) -> dict:
    base, shapes = copy.deepcopy(BASE[kind])
    return {"name": f"{kind}_test", "dtype": "float32", "producer": {**base, **producer},
            "epilogue": epilogue or copy.deepcopy(CHAIN_STATS_POOL), "shapes": shapes,
            "search": {"trials": 4, "timeout": 60, "seed": 0}}


def _plan(kind: str, epilogue: list | None = None, **producer):
    return make_plan(parse_config(_raw(kind, epilogue, **producer), "x.yaml"))


@pytest.mark.parametrize("producer, key, fragment", [
    ({"groups": 3}, "producer.groups", "3 groups do not divide in_channels 8 and out_channels 16"),
    ({"groups": 0}, "producer.groups", "expected an integer >= 1"),
    ({"padding": "same", "stride": 2}, "producer.padding", "'same' needs stride 1"),
    ({"padding": "full"}, "producer.padding", "expected 'same', 'valid'"),
    ({"dilation": 0}, "producer.dilation", "positive integers"),
    ({"output_padding": 1}, "producer.output_padding", "unknown key for op 'conv1d'"),
    ({"padding_mode": "mirror"}, "producer.padding_mode", "expected one of zeros, reflect, replicate, circular"),
])
def test_bad_plain_producers_are_refused(producer, key, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(_raw("conv1d", **producer), "x.yaml")
    assert info.value.key == key and fragment in str(info.value)


@pytest.mark.parametrize("producer, key, fragment", [
    ({"output_padding": 2}, "producer.output_padding", "must be smaller than stride [2, 2] or dilation [1, 1]"),
    ({"stride": 1, "output_padding": 1}, "producer.output_padding", "must be smaller than stride"),
    ({"padding": "same"}, "producer.padding", "a string padding is for plain convolutions"),
    ({"groups": 5}, "producer.groups", "5 groups do not divide"),
    ({"padding_mode": "reflect"}, "producer.padding_mode", "unknown key for op 'conv_transpose2d'"),
])
def test_bad_transposed_producers_are_refused(producer, key, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(_raw("conv_transpose2d", **producer), "x.yaml")
    assert info.value.key == key and fragment in str(info.value)


def test_shapes_name_the_rank_of_the_producer():
    raw = _raw("conv1d")
    raw["shapes"] = [[4, 8, 16, 16]]
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert info.value.key == "shapes[0]" and "expected a list of 3 integers for conv1d [N, C, L]" in str(info.value)
    raw["shapes"] = []
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert "[N, C, L]" in str(info.value)
    raw = _raw("conv1d", groups=2)
    raw["shapes"] = [[4, 4, 64]]  # the channel check is against in_channels, with groups too
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert "does not match producer.in_channels 8" in str(info.value)


@pytest.mark.parametrize("kind, offered", [
    ("conv1d", {"direct", "gemm", "gemm_extrema", "gemm_store"}),
    ("conv_transpose1d", {"direct"}),          # transposed: not gemm; 16 channels and direct: not gemm_wide
    ("conv_transpose2d", {"direct", "gemm_wide"}),
])
def test_plain_1d_and_2d_producers_go_inside(kind, offered):
    plan = _plan(kind)
    assert offered <= set(plan.impl_stages) and "cudnn" in plan.impl_stages
    assert not set(refusals(plan)) & offered


@pytest.mark.parametrize("kind", ["conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d"])
@pytest.mark.parametrize("producer, reason", [
    ({"dilation": 2}, "dilation 2 (the kernels compute dilation 1 only)"),
    ({"groups": 2}, "groups 2 (the kernels compute one group only)"),
])
def test_inside_worlds_refuse_dilation_and_groups(kind, producer, reason):
    plan = _plan(kind, **producer)
    assert set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}  # cuDNN (and PyTorch) take every producer
    assert {impl: refusals(plan)[impl] for impl in ("direct", "gemm", "gemm_wide")} == dict.fromkeys(
        ("direct", "gemm", "gemm_wide"), reason)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_a_padding_mode_runs_in_cudnns_world_alone_and_refuses_inputs_pytorch_refuses(mode):
    """The kernels that compute the convolution pad with zeros; cuDNN's world convolves the input F.pad padded,
    its epilogue fused as any other's. An input a reflect padding is as large as (a circular one larger than)
    is refused as PyTorch refuses it, naming the shape."""
    plan = _plan("conv2d", padding=2, padding_mode=mode)
    assert set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}
    assert all(refusals(plan)[impl].startswith(f"padding_mode {mode!r}") for impl in ("direct", "gemm", "gemm_wide"))
    raw = _raw("conv2d", padding=2, padding_mode=mode)
    raw["shapes"] = [[4, 8, 1, 9]]
    if mode == "replicate":  # repeats its edge as far as asked
        parse_config(raw, "x.yaml")
        return
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert info.value.key == "shapes[0]" and f"padding_mode {mode!r} pads 2 beside an input size of 1" in str(info.value)


def test_inside_worlds_refuse_asymmetric_same_and_take_symmetric():
    plan = _plan("conv1d", kernel_size=2, padding="same")
    assert set(plan.impl_stages) == {"cudnn", *REFERENCE_WORLDS}
    assert set(refusals(plan)) == set(WORLDS) - {"cudnn", *REFERENCE_WORLDS}
    assert all(refusals(plan)[impl].startswith("padding 'same' of 0 before and 1 after")
               for impl in ("direct", "gemm", "gemm_wide"))
    plan = _plan("conv1d", kernel_size=3, padding="same")
    assert {"direct", "gemm"} <= set(plan.impl_stages)


SPECTRAL_CHAIN = [{"op": "mul", "by": 2.0}, {"op": "batch_norm"}, {"op": "adaptive_avg_pool", "output_size": 1}]


@pytest.mark.parametrize("producer, offered", [
    ({}, True), ({"dilation": 2}, False), ({"groups": 2}, False), ({"padding": 1}, False)])
def test_spectral_only_without_dilation_or_groups(producer, offered):
    full = {"stride": 1, "padding": 0, "output_padding": 0}
    plan = _plan("conv_transpose1d", copy.deepcopy(SPECTRAL_CHAIN), **{**full, **producer})
    assert ("spectral" in plan.impl_stages) is offered and ("spectral" in plan.impl_stages) is offered


@pytest.mark.parametrize("kind, channels_last", [("conv1d", False), ("conv_transpose1d", False),
                                                 ("conv2d", True), ("conv_transpose2d", True)])
def test_channels_last_only_where_torch_has_it(kind, channels_last):
    plan = _plan(kind)
    assert plan_facts(plan)["spatial_dims"] == plan.spec.producer.spatial_dims
    space = plan_space(plan)
    layouts = {s["producer.layout"] for s in space.producer_starts()}
    assert layouts == ({"contiguous", "channels_last"} if channels_last else {"contiguous"})
    # A candidate naming it anyway (not canonical) breaks the producer's constraint for 1-D, with the reason.
    names = {**plan_facts(plan), "sm": 90, "impl": "cudnn", "layout": "channels_last", "store": "float",
             "form": "native"}
    refused = [c.why for c in load_family("producer").constraints
               if not eval(c.expr, {"__builtins__": {}}, names)]  # noqa: S307 - our own data
    assert refused == ([] if channels_last else ["torch has channels-last memory formats for 2-D and 3-D tensors only"])


# ---------------------------------------------------------------------------------------------
# The generated model: its dims for 1-, 2- and 3-D producers (CPU: no kernels run).

MODEL_CASES = [
    ("conv1d", None, {}),
    ("conv1d", [{"op": "mul", "by": 2.0}, {"op": "batch_norm"}, {"op": "max", "dim": 1}], {}),
    ("conv_transpose1d", None, {}),
    ("conv_transpose2d", None, {}),
    ("conv2d", None, {"dilation": 2, "padding": 2}),
    ("conv1d", None, {"kernel_size": 2, "padding": "same"}),
]


@pytest.mark.parametrize("kind, epilogue, producer", MODEL_CASES)
def test_generated_model_dims_follow_the_producer(tmp_path, kind, epilogue, producer):
    import torch

    plan = _plan(kind, copy.deepcopy(epilogue) if epilogue else None, **producer)
    module = render(plan)
    path = tmp_path / "model.py"
    path.write_text(module.files["model.py"])
    model = import_file(path)
    shape = plan.spec.shapes[0]
    x = torch.randn(*shape)
    expected = model.Model()(x)  # PyTorch's own, on the CPU
    y_shape = plan.spec.producer.out_shape(shape)
    pad = (1,) * (3 - plan.spec.producer.spatial_dims)
    assert model._conv_out(pad + tuple(shape[2:])) == pad + tuple(y_shape[2:])
    assert model.MEMORY_FORMAT is {1: torch.contiguous_format, 2: torch.channels_last,
                                   3: torch.channels_last_3d}[len(shape) - 2]
    # A non-contiguous producer output is never read as channels last where torch has no such format.
    y = torch.randn(y_shape[0], *y_shape[2:], y_shape[1]).movedim(-1, 1)  # channels fastest in memory
    channels_last = (not y.is_contiguous() and y.is_contiguous(memory_format=model.MEMORY_FORMAT))
    assert channels_last is (len(shape) > 3)
    dims = model._dims(shape[0], y_shape[1], pad + tuple(y_shape[2:]), pad + tuple(shape[2:]))
    new = model.ModelNew()
    assert tuple(new._output(dims, x, 0).shape) == tuple(expected.shape)
