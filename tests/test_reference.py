"""The generated model.py: its reference ``Model`` computes the config's chain on CPU, op for op,
and ``ModelNew`` can be built and wired up without CUDA."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusetune.codegen import render
from fusetune.config import load_config, parse_config
from fusetune.plan import make_plan

from conftest import SEEDS, import_file


def _generate(key: str, directory: Path):
    spec = load_config(SEEDS[key])
    rendered = render(make_plan(spec))
    target = directory / key
    rendered.write(target)
    return spec, import_file(target / "model.py")


def _randomize(model: torch.nn.Module) -> None:
    """Make every parameter non-trivial so that order and operand mistakes show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("producer."):
                continue
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))


def _expected_groupnorm(model, x):
    w, b = model.producer.weight, model.producer.bias
    gn = model.group_norm_0
    y = F.conv2d(x, w, b)
    y = F.group_norm(y, 16, gn.weight, gn.bias, eps=1e-5)
    y = y * model.scale
    y = F.max_pool2d(y, 4)
    return y.clamp(0.0, 1.0)


def _expected_instancenorm(model, x):
    w, b, m = model.producer.weight, model.producer.bias, model.m
    y = F.conv3d(x, w, b)
    y = y * m
    y = F.instance_norm(y, eps=1e-5)
    y = y.clamp(-1.0, 1.0) * m
    return y.max(dim=1)[0]


def _expected_batchnorm(model, x):
    w, b = model.producer.weight, model.producer.bias
    bn = model.batch_norm_1
    y = F.conv_transpose3d(x, w, b)
    y = y * 2.0
    mean = y.mean(dim=(0, 2, 3, 4), keepdim=True)
    var = y.var(dim=(0, 2, 3, 4), unbiased=False, keepdim=True)
    y = (y - mean) / torch.sqrt(var + 1e-5) * bn.weight.view(1, -1, 1, 1, 1) + bn.bias.view(1, -1, 1, 1, 1)
    return y.mean(dim=(2, 3, 4), keepdim=True)


def _expected_maxpool_gap(model, x):
    w, b = model.producer.weight, model.producer.bias
    y = F.conv_transpose3d(x, w, b, stride=2, padding=1)
    y = y * 0.5
    y = F.max_pool3d(y, 2)
    y = y.mean(dim=(2, 3, 4), keepdim=True)
    return y.clamp(0.0, 1.0)


EXPECTED = {
    "groupnorm": _expected_groupnorm,
    "instancenorm": _expected_instancenorm,
    "batchnorm": _expected_batchnorm,
    "maxpool_gap": _expected_maxpool_gap,
}


@pytest.mark.parametrize("key", sorted(SEEDS))
def test_reference_model_matches_hand_written_forward(key, tmp_path):
    torch.manual_seed(0)
    spec, module = _generate(key, tmp_path)
    model = module.Model()
    _randomize(model)
    shape = spec.shapes[1]
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = EXPECTED[key](model, x)
        got = model(x)
    assert tuple(got.shape) == spec.output_shape(shape)
    assert tuple(expected.shape) == spec.output_shape(shape)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # not a vacuous comparison: the outputs vary
    assert got.std() > 0 or key == "maxpool_gap"


def test_maxpool_gap_reference_is_not_degenerate(tmp_path):
    """The seed's clamp(0, 1) could hide mistakes if everything clamped: check some values are interior."""
    torch.manual_seed(0)
    spec, module = _generate("maxpool_gap", tmp_path)
    model = module.Model()
    with torch.no_grad():
        model.producer.weight.mul_(4.0)
        x = torch.randn(*spec.shapes[1])
        got = model(x)
        torch.testing.assert_close(got, _expected_maxpool_gap(model, x), rtol=1e-5, atol=1e-5)
    interior = ((got > 0) & (got < 1)).sum().item()
    assert interior > 0


def test_mul_before_max_pool_order_matters(tmp_path):
    """With a negative per-channel scale, mul-then-pool differs from pool-then-mul: the model must mul first."""
    torch.manual_seed(1)
    spec, module = _generate("groupnorm", tmp_path)
    model = module.Model()
    with torch.no_grad():
        model.scale.copy_(-torch.rand_like(model.scale) - 0.5)
        x = torch.randn(*spec.shapes[1])
        got = model(x)
        gn = model.group_norm_0
        y = F.group_norm(model.producer(x), 16, gn.weight, gn.bias, eps=1e-5)
        wrong = (F.max_pool2d(y, 4) * model.scale).clamp(0, 1)
        torch.testing.assert_close(got, _expected_groupnorm(model, x))
    assert not torch.allclose(got, wrong)


def test_batch_norm_running_statistics_after_one_forward(tmp_path):
    torch.manual_seed(0)
    spec, module = _generate("batchnorm", tmp_path)
    model = module.Model()
    bn = model.batch_norm_1
    assert model.training and bn.training
    assert torch.equal(bn.running_mean, torch.zeros(128))
    assert torch.equal(bn.running_var, torch.ones(128))
    assert bn.num_batches_tracked.item() == 0
    x = torch.randn(*spec.shapes[1])
    with torch.no_grad():
        model(x)
        y = F.conv_transpose3d(x, model.producer.weight, model.producer.bias) * 2.0
    batch_mean = y.mean(dim=(0, 2, 3, 4))
    count = y.numel() // y.shape[1]
    unbiased = ((y - batch_mean.view(1, -1, 1, 1, 1)) ** 2).sum(dim=(0, 2, 3, 4)) / (count - 1)
    torch.testing.assert_close(bn.running_mean, 0.9 * 0.0 + 0.1 * batch_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, 0.9 * 1.0 + 0.1 * unbiased, rtol=1e-5, atol=1e-6)
    assert bn.num_batches_tracked.item() == 1


def test_eval_mode_batch_norm_config_uses_running_statistics(tmp_path):
    """``training: false`` means eval semantics whatever mode the module is in."""
    import yaml
    from fusetune.config import parse_config

    raw = yaml.safe_load(SEEDS["batchnorm"].read_text())
    raw["epilogue"][1]["training"] = False
    spec = parse_config(raw, "x.yaml")
    rendered = render(make_plan(spec))
    rendered.write(tmp_path)
    module = import_file(tmp_path / "model.py")
    torch.manual_seed(0)
    model = module.Model()
    bn = model.batch_norm_1
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(128))
        bn.running_var.copy_(torch.rand(128) + 0.5)
        _randomize(model)
    before = (bn.running_mean.clone(), bn.running_var.clone())
    assert model.training
    x = torch.randn(*spec.shapes[1])
    with torch.no_grad():
        got = model(x)
        y = F.conv_transpose3d(x, model.producer.weight, model.producer.bias) * 2.0
        y = F.batch_norm(y, before[0], before[1], bn.weight, bn.bias, training=False, eps=1e-5)
        expected = y.mean(dim=(2, 3, 4), keepdim=True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])
    assert bn.num_batches_tracked.item() == 0


@pytest.mark.parametrize("key", sorted(SEEDS))
def test_model_new_builds_on_cpu_without_kernels(key, tmp_path, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    def no_build(*args, **kwargs):
        raise AssertionError("ModelNew must not build kernels before its first forward")

    monkeypatch.setattr(cpp_extension, "load_inline", no_build)
    spec, module = _generate(key, tmp_path)
    fused = module.ModelNew()
    assert module._KERNELS is None
    assert isinstance(fused, module.Model)
    assert set(module.STAGES) == set(make_plan(spec).stages)
    assert set(fused.variant) == set(module.STAGES) | {"producer"}
    # same parameters and buffers as the reference, by name and shape
    ref = module.Model()
    assert {k: v.shape for k, v in fused.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("key", sorted(SEEDS))
def test_model_new_refuses_cpu_input(key, tmp_path):
    spec, module = _generate(key, tmp_path)
    fused = module.ModelNew()
    x = torch.randn(*spec.shapes[1])
    with pytest.raises(ValueError, match="CUDA"):
        fused.forward(x)
    assert module._KERNELS is None


@pytest.mark.parametrize("key", sorted(SEEDS))
def test_model_new_share_from(key, tmp_path):
    spec, module = _generate(key, tmp_path)
    ref = module.Model()
    fused = module.ModelNew().share_from(ref)
    assert fused.producer.weight is ref.producer.weight
    assert fused.producer is ref.producer
    for p in spec.parameters:
        assert getattr(fused, p.name) is getattr(ref, p.name)
    ref_tensors = {k: v.data_ptr() for k, v in ref.state_dict().items()}
    assert {k: v.data_ptr() for k, v in fused.state_dict().items()} == ref_tensors


def test_model_new_shares_batch_norm_buffers(tmp_path):
    _, module = _generate("batchnorm", tmp_path)
    ref = module.Model()
    fused = module.ModelNew().share_from(ref)
    assert fused.batch_norm_1.running_mean is ref.batch_norm_1.running_mean
    assert fused.batch_norm_1.running_var is ref.batch_norm_1.running_var


def test_model_new_variant_selection(tmp_path):
    _, module = _generate("groupnorm", tmp_path)
    fused = module.ModelNew()
    assert fused.variant == {"producer": {"impl": "cudnn", "layout": "contiguous", "store": "float", "form": "native"},
                             "stats": {"block": 256, "vec": 4, "reduce": "warp", "split": 4},
                             "finalize": {}, "window_map": {"block": 256, "ilp": 2},
                             "direct_stats": {"block": 128, "ct": 4, "reduce": "warp", "split": 16},
                             "direct_main": {"block": 256, "ct": 8, "reduce": "warp", "cells": 2, "split": 4},
                             "gemm_stats": {"taps": 1, "bregs": 1, "block": 256, "mt": 1, "tw": 32, "th": 8,
                                            "split": 4},
                             "gemm_main": {"taps": 1, "block": 256, "mt": 1, "tw": 32, "th": 8, "split": 4},
                             "extrema_map": {"block": 256, "ilp": 2},
                             "gemm_cluster": {"taps": 1, "block": 256, "mt": 1, "tw": 32, "th": 8, "split": 8}}
    stats_variants = module.VARIANTS["stats"]
    index, split = fused._resolved["stats"]
    assert stats_variants[index] == {"block": 256, "vec": 4, "reduce": "warp"} and split == 4
    with pytest.raises(ValueError, match="no compiled variant"):
        module.ModelNew(variant={"stats": {"block": 100, "vec": 4, "reduce": "warp"}, "window_map": {"block": 256, "ilp": 2}})
    other = {"stats": {"block": 128, "vec": 1, "reduce": "smem", "split": 8}, "window_map": {"block": 512, "ilp": 4}}
    fused = module.ModelNew(variant=other)
    index, split = fused._resolved["stats"]
    assert stats_variants[index] == {"block": 128, "vec": 1, "reduce": "smem"} and split == 8
    index, _ = fused._resolved["window_map"]
    assert module.VARIANTS["window_map"][index] == {"block": 512, "ilp": 4}


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("form", ["native", "forward"])
def test_generated_producer_forms_compute_the_transposed_convolution(form, layout, tmp_path):
    """The generated model's cuDNN producer, in either form and layout, is the transposed
    convolution (float64, on CPU): the forward form flips and swaps the weights and pads k - 1 - p."""
    spec = parse_config({"name": "convt_forms", "dtype": "float32",
                         "producer": {"op": "conv_transpose3d", "in_channels": 3, "out_channels": 5,
                                      "kernel_size": [3, 2, 4], "padding": [1, 0, 3]},
                         "epilogue": [{"op": "batch_norm"}, {"op": "adaptive_avg_pool"}],
                         "shapes": [[2, 3, 4, 5, 6]]}, "<convt_forms>")
    assert spec.producer.has_forward_form
    render(make_plan(spec)).write(tmp_path / "m")
    module = import_file(tmp_path / "m" / "model.py")
    fused = module.ModelNew(variant={"producer": {"impl": "cudnn", "layout": layout, "form": form}}).double()
    x = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64)
    y = fused.produce(x)
    want = F.conv_transpose3d(x, fused.producer.weight, padding=(1, 0, 3))
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    assert y.is_contiguous(memory_format=torch.channels_last_3d if layout == "channels_last" else
                           torch.contiguous_format)


def test_model_new_reads_exported_winner(tmp_path):
    spec, module_first = _generate("instancenorm", tmp_path)
    winner = {"stats": {"block": 512, "vec": 1, "reduce": "smem", "split": 2},
              "channel_reduce": {"block": 128, "vec": 1, "unroll": 1}}
    (tmp_path / "instancenorm" / "winner.json").write_text(json.dumps({"variant": winner}))
    module = import_file(tmp_path / "instancenorm" / "model.py")
    assert module.default_variant() == winner
    assert module.ModelNew().variant == winner


def test_generated_model_does_not_need_fusetune(tmp_path):
    _, module = _generate("groupnorm", tmp_path)
    source = (tmp_path / "groupnorm" / "model.py").read_text()
    assert "import fusetune" not in source and "from fusetune" not in source
    assert (tmp_path / "groupnorm" / "stats.cu").exists() and (tmp_path / "groupnorm" / "binding.cpp").exists()
    assert sorted(module.CUDA_SOURCES) == sorted(render(make_plan(load_config(SEEDS["groupnorm"]))).cuda_sources)
    assert re.fullmatch(r"ft_[0-9a-f]{12}", module.MODULE_NAME)  # named by content, not by config name
    assert module.MODULE_NAME.isidentifier()


def test_spectral_world_spectra_and_parseval(tmp_path):
    """What spectral_stats rests on, in the layout it reads: ModelNew._input_spectrum gives the input's half
    spectrum zero-padded to the output's size (bins contiguous, the last dim halved), _weights_spectrum the
    raw weights and a float32 buffer of their spectrum's size (CIN x C pairs of complex bins); with the
    weights' spectrum the product per channel pair is the transposed convolution's spectrum, bin 0 its
    planes' sums, and its squares, weighted as ft_bin_weight weighs them (1 for the last dim's bin 0 and
    Nyquist bin, 2 for the others), sum to the planes' spread times the bin count. At odd and even output
    widths."""
    torch.manual_seed(0)
    _, module = _generate("batchnorm", tmp_path)
    model = module.ModelNew()
    for x_shape, k in (((2, 64, 4, 5, 7), (5, 5, 5)), ((3, 64, 3, 4, 4), (5, 5, 5))):  # output widths 11 and 8
        x = torch.randn(x_shape)
        w = torch.randn(64, 3, *k)
        y = F.conv_transpose3d(x.double(), w.double())
        size = tuple(y.shape[2:])
        dims = module._dims(x.shape[0], 3, size, tuple(x.shape[2:]))
        model.producer.weight = torch.nn.Parameter(w)
        spectrum = model._input_spectrum(x, dims)
        assert spectrum.dtype == torch.float32 and spectrum.shape == (*x.shape[:2], size[0], size[1], size[2] // 2 + 1, 2)
        held, weights = model._weights_spectrum(dims, spectrum)
        assert spectrum.is_contiguous() and weights.data_ptr() == w.data_ptr()
        assert held.dtype == torch.float32 and held.numel() == w.shape[0] * w.shape[1] * spectrum[0, 0].numel()
        X = torch.view_as_complex(spectrum).flatten(2).cdouble()
        W = torch.fft.rfftn(w.double(), s=size, dim=(2, 3, 4)).flatten(2)
        U = torch.einsum("nif,icf->ncf", X, W)
        kw = torch.arange(U.shape[-1]) % (size[-1] // 2 + 1)
        weight = torch.where((kw == 0) | (2 * kw == size[-1]), 1.0, 2.0).double()
        weight[0] = 0.0  # bin 0 is the plane's sum, kept apart
        spread = ((y - y.mean(dim=(2, 3, 4), keepdim=True)) ** 2).sum(dim=(2, 3, 4))
        torch.testing.assert_close((U.abs() ** 2 * weight).sum(-1) / math.prod(size), spread, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(U[..., 0].real, y.sum(dim=(2, 3, 4)), rtol=1e-4, atol=1e-3)
