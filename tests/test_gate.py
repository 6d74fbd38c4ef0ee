"""Gated activations (fusetune/ops/gate.py): ``glu`` against PyTorch in float64 for every pair of half functions,
and the corpus chains with a glu (tests/chains/*glu*, *gate*) planned, rendered and run on the CPU: the glu in
PyTorch between regions, the later region after it at C/2 channels with the chain's very parameters, its values
those of the chain's own ops."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusetune.build import load_generated
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.ops import REGISTRY, Glu, OpContext
from fusetune.ops.gate import GATE_FUNCTIONS
from fusetune.pipeline import later_segments
from fusetune.plan import make_plan

from conftest import ROOT

GATE_CHAINS = sorted(p for p in (ROOT / "tests" / "chains").glob("*.yaml")
                     if any(isinstance(op, Glu) for op in load_config(p).epilogue))


def _torch_function(name: str):
    """PyTorch's own function of a vocabulary name (not GATE_FUNCTIONS' text): torch.nn.functional's, else torch's."""
    return getattr(F, name, None) or getattr(torch, name)


def _glu(entry: dict, shape: tuple[int, ...]) -> Glu:
    ctx = OpContext(path="test.yaml", key="epilogue[0]", in_shape=shape, spatial_dims=len(shape) - 2, parameters={})
    return REGISTRY["glu"].parse({"op": "glu", **entry}, ctx)


def test_the_corpus_has_gated_chains_in_1d_and_2d():
    kinds = {load_config(p).producer.spatial_dims for p in GATE_CHAINS}
    assert len(GATE_CHAINS) >= 3 and {1, 2} <= kinds


@pytest.mark.parametrize("shape", [(3, 14, 9), (2, 6, 5, 7), (2, 10, 3, 4, 5)])
@pytest.mark.parametrize("dim", [1, -1])
def test_glu_is_F_glu(shape, dim):
    """The default op is F.glu at the same dim (PyTorch's default -1 included) and halves that dim; written
    by hand, x[:, :C//2] * sigmoid(x[:, C//2:]) is the same."""
    if shape[dim] % 2:
        shape = shape[:-1] + (shape[-1] + 1,)
    op = _glu({"dim": dim} if dim != -1 else {}, shape)
    x = torch.randn(shape, dtype=torch.float64)
    got = eval(op.forward_code("x", None), {"torch": torch, "F": F, "x": x})  # noqa: S307 - our own text
    assert got.shape == op.out_shape(shape) == F.glu(x, dim=dim).shape
    assert torch.equal(got, F.glu(x, dim=dim))
    if op.dim == 1:
        half = shape[1] // 2
        torch.testing.assert_close(got, x[:, :half] * torch.sigmoid(x[:, half:]), rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("gate", sorted(GATE_FUNCTIONS))
@pytest.mark.parametrize("activation", [None, "tanh", "silu", "relu"])
def test_gated_products_are_the_halves_functions(activation, gate):
    """``activation`` maps the first half and ``gate`` the second, each PyTorch's function of that name."""
    shape = (2, 12, 7)
    op = _glu({"dim": 1, "gate": gate, **({"activation": activation} if activation else {})}, shape)
    x = torch.randn(shape, dtype=torch.float64)
    a, b = x.chunk(2, dim=1)
    value = _torch_function(activation)(a) if activation else a
    expected = value * _torch_function(gate)(b)
    got = eval(op.forward_code("x", None), {"torch": torch, "F": F, "x": x})  # noqa: S307 - our own text
    torch.testing.assert_close(got, expected, rtol=1e-15, atol=1e-15, equal_nan=True)


@pytest.mark.parametrize("path", GATE_CHAINS, ids=lambda p: p.stem)
def test_a_glu_runs_in_pytorch_and_the_chain_goes_on_in_a_later_region(path: Path, tmp_path: Path):
    """Region 0 ends before the first glu, which runs in PyTorch; the ops after it form a later region of
    kernels whose producer has the glu's output channels, whose per-channel parameters are the chain's tensors
    of that size (the reference's, shared), and whose reference model gives, attached, exactly what the chain's
    own ops give in float64 at every shape."""
    spec = load_config(path)
    plan = make_plan(spec)
    assert all(not isinstance(step.op, Glu) for step in plan.head)
    segments = later_segments(plan)
    gated = next(s for s in segments if any(isinstance(step.op, Glu) for step in s.steps))
    assert not gated.kernels and all(step.op.role in ("gate", "view") for step in gated.steps)
    (region,) = [s for s in segments if s.kernels]
    assert region.index == gated.index + 1
    first = load_generated(render(plan).write(tmp_path / f"{path.stem}_first"))
    reference = first.Model().double()
    model = first.ModelNew().double().share_from(reference)
    for p in region.spec.parameters:
        assert tuple(getattr(reference, p.name).shape) == (region.spec.producer.out_channels,) + (1,) * (
            region.spec.producer.spatial_dims)
    attached = load_generated(render(make_plan(region.spec)).write(tmp_path / f"{path.stem}_r{region.index}"))
    for i, shape in enumerate(spec.shapes):
        assert region.spec.shapes[i][1] == region.spec.producer.out_channels
        x = torch.randn(shape, dtype=torch.float64)
        y = reference.producer(x)
        if not plan.head:  # the region's input is the convolution's output: the whole chain is the reference's
            expected = reference(x)
            torch.testing.assert_close(model.tail(y), expected, rtol=1e-12, atol=1e-12)
        fused = torch.randn(plan.fused_output_shape(shape), dtype=torch.float64)
        model._later.clear()
        in_pytorch = model.tail(fused)
        model.attach_later(region.index, attached.Model().double())
        got = model.tail(fused)
        assert got.shape == in_pytorch.shape == spec.output_shape(shape)
        torch.testing.assert_close(got, in_pytorch, rtol=1e-12, atol=1e-12)
        for p in region.spec.parameters:
            assert getattr(model._later[region.index], p.name) is getattr(reference, p.name)
