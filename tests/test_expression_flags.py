"""The expression op's planner flags (fusetune/ops/expression.py: trend, flags) against data.

tests/expression_flags.yaml lists expressions and the flags the rules must give them. Each compiled row's claims are
checked where the max-pool shortcuts rely on them: on the kernels' float32 values (the CUDA fragment compiled on the
host with g++, as tests/test_ops.py runs every op) and on PyTorch's float32 values, over the ops' grid and random
float32 inputs (infinities, NaN and signed zeros among them). FUNCTION_TRENDS, the facts the rules compose, is
checked against the ops' own flags and on the same inputs.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fusetune.ops import REGISTRY
from fusetune.ops.expression import FUNCTION_TRENDS, FUNCTIONS, ExpressionError, evaluate, parse_expression

from test_ops import context, grid_shape, input_grid, run_on_host

DATA = Path(__file__).resolve().parent / "expression_flags.yaml"
#: Random float32 inputs beside the grid: of random bits (every magnitude), and normal at a few scales.
RANDOM_BITS, RANDOM_NORMAL, SCALES = 4000, 1000, (1.0, 8.0, 100.0)


def rows(section: str) -> list[dict[str, Any]]:
    return yaml.safe_load(DATA.read_text())[section]


def expression(row: dict[str, Any]) -> Any:
    return REGISTRY["expression"].parse({"op": "expression", "expr": row["expr"]}, context())


def inputs() -> np.ndarray:
    """input_grid() and random float32 values, sorted (-0 before +0), with one NaN last (grid_shape's order)."""
    rng = np.random.default_rng(22)
    bits = rng.integers(0, 2 ** 32, RANDOM_BITS, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = np.concatenate([rng.standard_normal(RANDOM_NORMAL).astype(np.float32) * np.float32(s) for s in SCALES])
    x = np.concatenate([input_grid(), bits, normal, np.array([np.inf, -np.inf, 0.0, -0.0], np.float32)])
    x = x[~np.isnan(x)]
    x = x[np.lexsort((~np.signbit(x), x))]
    return np.concatenate([x, np.array([np.nan], np.float32)])


@pytest.fixture(scope="module")
def values(tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """expr -> {"cuda": the fragment's float32 values, "torch": PyTorch's float32 values} over inputs(); each
    function of FUNCTION_TRENDS, by name, as its own op's fragment ("cuda" alone)."""
    x = inputs()
    compiled = [expression(row) for row in rows("compiled")]
    functions = [REGISTRY[name].parse({"op": name}, context()) for name in FUNCTION_TRENDS]
    host = run_on_host(compiled + functions, tmp_path_factory.mktemp("expression_flags"), x)[:, 0]
    out: dict[str, dict[str, np.ndarray]] = {}
    for row, op, got in zip(rows("compiled"), compiled, host):
        with torch.no_grad():
            reference = evaluate(op.tree, torch.from_numpy(x)).numpy()
        out[row["expr"]] = {"cuda": got, "torch": reference}
    for name, got in zip(FUNCTION_TRENDS, host[len(compiled):]):
        out[name] = {"cuda": got}
    return out


@pytest.mark.parametrize("row", rows("compiled"), ids=lambda row: row["expr"])
def test_the_rules_give_the_datas_flags(row: dict[str, Any]):
    op = expression(row)
    assert (op.monotone(), op.increasing()) == (row["monotone"], row["increasing"])


@pytest.mark.parametrize("row", rows("outside_float32"), ids=lambda row: row["expr"])
def test_numbers_outside_float32_are_refused(row: dict[str, Any]):
    """A number float32 takes as inf or 0 (where float64's reference does not) is refused by name, before any
    kernel's literal could be inf."""
    with pytest.raises(ExpressionError, match="outside float32's range"):
        parse_expression(row["expr"])


@pytest.mark.parametrize("row", rows("compiled"), ids=lambda row: row["expr"])
@pytest.mark.parametrize("side", ["cuda", "torch"])
def test_claimed_flags_hold_on_float32_inputs(row: dict[str, Any], side: str,
                                              values: dict[str, dict[str, np.ndarray]]):
    """A claimed flag holds on the inputs. On the kernels' values (the shortcuts' own), a flag not claimed fails
    visibly (the data's False rows are not monotone in fact), unless the row names a known miss of the rules, which
    the inputs then show monotone. (PyTorch's tanh, unlike tanhf, keeps x - tanh(x) in order: its values alone
    would not show why that expression is refused.)"""
    monotone, increasing = grid_shape(values[row["expr"]][side])
    claimed = (row["monotone"], row["increasing"])
    if row["monotone"]:
        assert monotone, f"{row['expr']} claims monotone; not on the {side} values"
    if row["increasing"]:
        assert increasing, f"{row['expr']} claims increasing; not on the {side} values"
    if side != "cuda":
        return
    if "misses" in row:
        assert (monotone, increasing) != claimed, f"{row['expr']}: no miss on the {side} values"
    else:
        assert (monotone, increasing) == claimed, f"{row['expr']}: {side} values show {(monotone, increasing)}"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_trends_are_the_ops_flags(name: str):
    """A function is in FUNCTION_TRENDS exactly where its op is monotone, and the row rises without NaN at the low
    end exactly where the op is increasing."""
    op = REGISTRY[name].parse({"op": name}, context())
    assert (name in FUNCTION_TRENDS) == op.monotone()
    if name in FUNCTION_TRENDS:
        f = FUNCTION_TRENDS[name]
        rises = f.direction > 0 and f.nan_below == -math.inf and not f.nan_at_infinities
        assert rises == op.increasing()


@pytest.mark.parametrize("name", sorted(FUNCTION_TRENDS))
def test_function_trends_hold_on_the_kernels(name: str, values: dict[str, dict[str, np.ndarray]]):
    """On the op's own fragment: NaN for NaN, and for other arguments just where the row says (below nan_below,
    at the infinities where nan_at_infinities); the other values within [lo, hi] and in the row's direction (up to
    grid_shape's two ulps)."""
    f, got, x = FUNCTION_TRENDS[name], values[name]["cuda"], inputs()
    assert np.isnan(got[-1])
    x, got = x[:-1], got[:-1]
    nan_expected = (x < f.nan_below) | (np.isinf(x) & f.nan_at_infinities)
    assert np.array_equal(np.isnan(got), nan_expected), x[np.isnan(got) != nan_expected][:5]
    real = got[~nan_expected]
    assert real.min() >= f.lo and real.max() <= f.hi, (real.min(), real.max())
    _, increasing = grid_shape(np.concatenate([got[~nan_expected] * np.float32(f.direction), [np.nan]]))
    assert increasing, f"{name} does not follow direction {f.direction}"
