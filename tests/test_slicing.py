"""The slice op (fusetune/ops/slicing.py) against Python's slicing of a tensor, in float64 on the CPU: its shape
rule and its PyTorch form at starts, ends and steps of either sign, clipped past the dim's size."""
from __future__ import annotations

import itertools

import pytest
import torch

from fusetune.ops import REGISTRY, OpContext

SHAPE = (2, 3, 11, 6)


def _slice(entry: dict):
    ctx = OpContext(path="test.yaml", key="epilogue[0]", in_shape=SHAPE, spatial_dims=2, parameters={})
    return REGISTRY["slice"].parse({"op": "slice", **entry}, ctx)


@pytest.mark.parametrize("dim", [1, 2, -1])
def test_a_slice_is_pythons(dim):
    x = torch.randn(SHAPE, dtype=torch.float64)
    for start, end, step in itertools.product((0, 1, 4, -3, -20), (None, -1, -4, 5, 30), (1, 2, 3)):
        entry = {"dim": dim, "start": start, **({"end": end} if end is not None else {}), "step": step}
        op = _slice(entry)
        index = [slice(None)] * len(SHAPE)
        index[dim] = slice(start, end, step)
        expected = x[tuple(index)]
        if expected.numel() == 0:
            continue
        got = eval(op.forward_code("x", None), {"x": x})  # noqa: S307 - our own text
        assert op.out_shape(SHAPE) == tuple(expected.shape), entry
        assert torch.equal(got, expected), entry
