"""Every elementwise op of the REGISTRY against PyTorch, on the CPU.

Each op's CUDA fragment is compiled on the host with g++ against templates/elementwise.cuh (the
header the kernels include) and run over a grid of float32 inputs; its forward_code is evaluated by
PyTorch in float64 on the same inputs. Its monotone()/increasing() claims are checked on the same
grid, and its parser's refusals name the key. Ops are found by iterating the REGISTRY: a new op
needs only its rows in SAMPLES (a test fails until it has them). The helpers whose device form differs
(ft_div_fast's __fdividef) run on a GPU in tests/test_gpu_ops.py.
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusetune.dtypes import DTYPES, Dtype
from fusetune.errors import ConfigError
from fusetune.ops import ALIASES, REGISTRY, SPECIAL_NAMES, TORCH_ALIASES, OpContext, ParamDecl
from fusetune.ops.elementwise import Elementwise

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"

#: The one declared parameter samples may name, and the per-channel values it takes in the checks:
#: both signs, zero (a learnt scale may reach it), integers and non-integers (pow's exponent).
PARAM = "w"
PARAM_VALUES: tuple[float, ...] = (-1.5, -1.0, 0.0, 0.5, 2.0, 3.0)

#: Op name -> config entries (without ``op``) to test. Parameters are powers of two where the op
#: divides or exponentiates by them, so the float32 argument is exact and the comparison is of the
#: functions, not of an input rounding that torch's float32 kernels share.
SAMPLES: dict[str, list[dict[str, Any]]] = {
    "mul": [{"by": 2.5}, {"by": -0.75}, {"by": 0}, {"by": PARAM}, {"by": "producer"}],
    "div": [{"by": 4.0}, {"by": -3.0}, {"by": PARAM}, {"by": "producer"}],
    "add": [{"by": 1.5}, {"by": PARAM}, {"by": "producer"}],
    "sub": [{"by": 0.25}, {"by": -7}, {"by": PARAM}, {"by": "producer"}],
    "minimum": [{"by": 0.5}, {"by": -2.0}, {"by": PARAM}, {"by": "producer"}],
    "maximum": [{"by": 0.5}, {"by": -2.0}, {"by": PARAM}, {"by": "producer"}],
    "pow": [{"by": e} for e in (0, 1, 2.0, 3, 4, 5, 6, -1, -2, -3, 0.5, -0.5, 1.5, 2.5, 0.75, -1.25)]
           + [{"by": PARAM}, {"by": "producer"}],
    "prelu": [{"by": 0.25}, {"by": 0}, {"by": -0.5}, {"by": PARAM}],
    "clamp": [{"min": -1.0, "max": 2.0}, {"min": 0.0}, {"max": -0.5}],
    "relu": [{}],
    "relu6": [{}],
    "leaky_relu": [{}, {"negative_slope": 0.2}, {"negative_slope": 0}, {"negative_slope": -0.5}],
    "elu": [{}, {"alpha": 0.5}, {"alpha": 0}, {"alpha": -2.0}],
    "selu": [{}],
    "celu": [{}, {"alpha": 2.0}, {"alpha": 0.5}, {"alpha": -2.0}],
    "gelu": [{}, {"approximate": "none"}, {"approximate": "tanh"}],
    "silu": [{}],
    "mish": [{}],
    "softplus": [{}, {"beta": 2.0}, {"beta": -1.0}, {"beta": 0.5, "threshold": 10.0}, {"threshold": 1.0},
                 {"beta": 4.0, "threshold": 40.0}, {"threshold": -5.0}, {"threshold": 100.0}],
    "sigmoid": [{}],
    "hardsigmoid": [{}],
    "hardswish": [{}],
    "hardtanh": [{}, {"min_val": -0.5, "max_val": 3.0}, {"min_val": 2.0, "max_val": 2.0}],
    "tanh": [{}],
    "exp": [{}],
    "log": [{}],
    "abs": [{}],
    "neg": [{}],
    "sqrt": [{}],
    **{name: [{}] for name in ("logsigmoid", "softsign", "tanhshrink", "erf", "erfc", "log1p", "expm1", "log2",
                               "log10", "exp2", "sin", "cos", "sign", "reciprocal", "rsqrt", "square", "floor",
                               "ceil", "round", "trunc")},
    # PyTorch's defaults (NaN to 0, the infinities to float32's extremes), each replaced, null as PyTorch's None
    "nan_to_num": [{}, {"nan": -1.5, "posinf": 7.0, "neginf": -3.0}, {"nan": 2.0, "posinf": None},
                   {"posinf": -4.0, "neginf": 4.0}],
    "hardshrink": [{}, {"lambd": 2.0}, {"lambd": 0}, {"lambd": -1.0}],
    "softshrink": [{}, {"lambd": 2.5}, {"lambd": 0}],
    # value below, at and above the threshold: non-decreasing, a clamp, a step down
    "threshold": [{"threshold": 0.5, "value": -1.0}, {"threshold": 0, "value": 0}, {"threshold": -2.0, "value": 3.0},
                  {"threshold": 1.0, "value": 2.5}],
    # KernelBench's custom forms, then the rest of the grammar: powers by helper and by powf, the extrema against a
    # number on either side and between two subexpressions, relu, unary minus, folded numbers
    "expression": [{"expr": "x * sigmoid(x + 3) / 6"}, {"expr": "x * tanh(x)"}, {"expr": "sigmoid(x) * x * 2.0"},
                   {"expr": "x / (1 + exp(-x)) - 0.5"},
                   {"expr": "minimum(x, 0.5) * maximum(1, relu(x)) - abs(x) / 4"}, {"expr": "-x ** 2 * 0.5 + x"},
                   {"expr": "x ** 3 - 2 * erf(x) + abs(x) ** 0.5 + maximum(-x, tanh(x)) * 2 ** -1"},
                   {"expr": "softsign(x) * (abs(x) ** 1.5 - 1 / 3)"}],
}

#: Bad entries and the key their refusal must name (beside the unknown key every op refuses).
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("mul", {}, "by"),
    ("sub", {"by": "nope"}, "by"),
    ("minimum", {"by": [1.0]}, "by"),
    ("maximum", {"by": True}, "by"),
    ("pow", {"by": float("nan")}, "by"),
    ("div", {"by": 0}, "by"),
    ("prelu", {"by": "producer"}, "by"),
    ("prelu", {}, "by"),
    ("leaky_relu", {"negative_slope": "0.2"}, "negative_slope"),
    ("elu", {"alpha": True}, "alpha"),
    ("celu", {"alpha": 0}, "alpha"),
    ("gelu", {"approximate": "fast"}, "approximate"),
    ("gelu", {"approximate": None}, "approximate"),
    ("gelu", {"approximate": ["tanh"]}, "approximate"),
    ("softplus", {"beta": 0}, "beta"),
    ("softplus", {"threshold": float("inf")}, "threshold"),
    ("hardtanh", {"min_val": 2.0, "max_val": 1.0}, "min_val"),
    ("hardtanh", {"max_val": "1"}, "max_val"),
    ("hardshrink", {"lambd": "0.5"}, "lambd"),
    ("softshrink", {"lambd": -0.5}, "lambd"),
    ("threshold", {"value": 1.0}, "threshold"),
    ("threshold", {"threshold": 1.0}, "value"),
    ("threshold", {"threshold": 1.0, "value": float("nan")}, "value"),
    ("nan_to_num", {"nan": "0"}, "nan"),
    ("nan_to_num", {"posinf": float("inf")}, "posinf"),
    ("nan_to_num", {"neginf": -1e39}, "neginf"),
    ("expression", {}, "expr"),
    ("expression", {"expr": 2.0}, "expr"),
    ("expression", {"expr": "x ** x"}, "expr"),
    ("expression", {"expr": "torch.tanh(x)"}, "expr"),
    ("expression", {"expr": "x * y"}, "expr"),
    ("expression", {"expr": "x / (3 - 3)"}, "expr"),
    ("expression", {"expr": "exp(1) * x"}, "expr"),
    ("expression", {"expr": "__import__('os')"}, "expr"),
]

#: Tolerances of the value check: float32 ulps of the reference, or an absolute floor.
ULPS = 4
ABS_TOL = 1e-6


def elementwise_names() -> list[str]:
    """The REGISTRY's elementwise op names: what every test here iterates."""
    return sorted(name for name, cls in REGISTRY.items() if issubclass(cls, Elementwise))


def context() -> OpContext:
    """A context like config.py's, with the one parameter samples may name."""
    return OpContext(path="test.yaml", key="epilogue[0]", in_shape=(2, 4, 8, 8), spatial_dims=2,
                     parameters={PARAM: ParamDecl(PARAM, "randn")})


def parse(name: str, entry: dict[str, Any]) -> Elementwise:
    return REGISTRY[name].parse({"op": name, **entry}, context())


def samples() -> list[tuple[str, Elementwise]]:
    """(id, op) for every sample of every elementwise op that has samples."""
    out = []
    for name in elementwise_names():
        for i, entry in enumerate(SAMPLES.get(name, [])):
            out.append((f"{name}[{i}]", parse(name, entry)))
    return out


def input_grid() -> np.ndarray:
    """Sorted float32 inputs (NaN last): a fine linspace over [-12, 12], the neighbours of the ops'
    break points (a few ulps each side, where a step, a switch between formulas, a pole (log1p at -1)
    or a tie of round (half to even) would show),
    signed zeros, tiny, huge and infinite values."""
    values = list(np.linspace(-12, 12, 961, dtype=np.float32))
    for b in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 6.0, 10.0, 20.0, 40.0):
        for point in (np.float32(b), np.float32(-b)):
            lo = hi = point
            for _ in range(3):
                lo, hi = np.nextafter(lo, np.float32(-np.inf)), np.nextafter(hi, np.float32(np.inf))
                values += [lo, hi]
    values += [1e-30, 1e-40, 1e-7, 30.0, 88.0, 89.0, 100.0, 1e10, 1e30, 3e38]
    values += [-v for v in values[-10:]]
    values += [np.inf, -np.inf]
    grid = np.unique(np.array(values, dtype=np.float32))  # sorted; one zero (+0) left
    zero = int(np.searchsorted(grid, 0.0))
    grid = np.concatenate([grid[:zero], np.array([-0.0], np.float32), grid[zero:]])
    return np.concatenate([grid, np.array([np.nan], np.float32)])


def producer_grid(x: np.ndarray) -> np.ndarray:
    """The producer's values paired with x: the same values in a fixed shuffled order."""
    return np.random.default_rng(0).permutation(x)


def op_functions(ops: list, qualifier: str) -> str:
    """Each op's cuda() fragment as a function f<i>(v, p, ft_y) (``qualifier``: static on the host, __device__ on the
    GPU); the parameter loads as ``p``."""
    return "\n".join(f"{qualifier} float f{i}(float v, float p, float ft_y) "
                     f"{{ return {op.cuda('v', lambda name: 'p')}; }}" for i, op in enumerate(ops))


def host_program(ops: list[Elementwise]) -> str:
    """A C++ program evaluating every op's cuda() fragment: reads n, m, x[n], y[n], p[m] (int32 and
    float32) on stdin, writes out[op][p][i] as float32 on stdout. The parameter loads as ``p``."""
    functions = op_functions(ops, "static")
    table = ", ".join(f"f{i}" for i in range(len(ops)))
    return f"""#include "elementwise.cuh"
#include <stdio.h>
#include <stdint.h>
#include <vector>
{functions}
typedef float (*Fn)(float, float, float);
static const Fn FNS[] = {{{table}}};
int main() {{
  int32_t n = 0, m = 0;
  if (fread(&n, 4, 1, stdin) != 1 || fread(&m, 4, 1, stdin) != 1) return 1;
  std::vector<float> x(n), y(n), p(m), out(n);
  if (fread(x.data(), 4, n, stdin) != (size_t)n || fread(y.data(), 4, n, stdin) != (size_t)n ||
      fread(p.data(), 4, m, stdin) != (size_t)m) return 1;
  for (const Fn f : FNS)
    for (int j = 0; j < m; ++j) {{
      for (int i = 0; i < n; ++i) out[i] = f(x[i], p[j], y[i]);
      fwrite(out.data(), 4, n, stdout);
    }}
  return 0;
}}
"""


@pytest.fixture(scope="module")
def host_values(tmp_path_factory) -> dict[str, np.ndarray]:
    """Sample id -> its CUDA fragment's float32 values, shape (parameter values, inputs): one g++
    compile and one run for every sample of every op."""
    ids, ops = zip(*samples())
    return dict(zip(ids, run_on_host(list(ops), tmp_path_factory.mktemp("ops"))))


def run_on_host(ops: list[Any], folder: Path, x: np.ndarray | None = None) -> np.ndarray:
    """The ops' CUDA fragments compiled with g++ (host_program) and run over ``x`` (float32; input_grid() where
    None): their float32 values, shape (ops, parameter values, inputs)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the ops' CUDA fragments are compiled on the host with it")
    (folder / "ops.cpp").write_text(host_program(ops))
    # No fast-math and no FMA contraction: the fragments' float32 roundings as written, as nvcc
    # (without --use_fast_math) computes them up to its own contraction.
    compile_ = subprocess.run([gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Werror",
                               f"-I{TEMPLATES}", "ops.cpp", "-o", "ops", "-lm"],
                              cwd=folder, capture_output=True, text=True)
    assert compile_.returncode == 0, compile_.stderr
    x = input_grid() if x is None else x
    y = producer_grid(x)
    p = np.array(PARAM_VALUES, np.float32)
    stdin = np.array([x.size, p.size], np.int32).tobytes() + x.tobytes() + y.tobytes() + p.tobytes()
    run = subprocess.run([str(folder / "ops")], input=stdin, capture_output=True, check=True)
    return np.frombuffer(run.stdout, np.float32).reshape(len(ops), p.size, x.size)


def torch_values(op: Elementwise, x: np.ndarray, y: np.ndarray, param: float) -> np.ndarray:
    """The op's forward_code evaluated by PyTorch in float64 on the float32 inputs, with the
    producer bound as ``y`` and the parameter as ``self.w`` (a per-channel value: a 0-d tensor)."""
    bound = {"torch": torch, "F": F,
             "x": torch.from_numpy(x.astype(np.float64)), "y": torch.from_numpy(y.astype(np.float64)),
             "self": types.SimpleNamespace(**{PARAM: torch.tensor(param, dtype=torch.float64)})}
    return eval(op.forward_code("x", None), bound).numpy()  # noqa: S307 - our own generated code


#: Ops whose helpers give a zero of the other sign than torch's CPU kernel at some input (relu, relu6 and
#: clamp: +0 at x = -0, where torch keeps -0; elu of a negative alpha: -0 at x = +0): a known difference, not
#: checked by mismatches until decided; every other op's zeros carry torch's sign.
ZERO_SIGN_UNCHECKED = frozenset({"relu", "relu6", "clamp", "elu"})


def mismatches(got: np.ndarray, ref: np.ndarray, zero_sign: bool = True, ulps: int = ULPS) -> np.ndarray:
    """Indices where float32 ``got`` is not ``ref`` (float64) to ``ulps`` float32 ulps or ABS_TOL: NaN
    only with NaN, infinities (ref past float32's range included) exactly, and with ``zero_sign`` a zero
    with a zero of its sign (a reciprocal or rsqrt after the op turns the other one into the other infinity)."""
    with np.errstate(invalid="ignore", over="ignore"):
        ref32 = ref.astype(np.float32)
        nan_got, nan_ref = np.isnan(got), np.isnan(ref)
        inf = np.isinf(ref32) | np.isinf(got)
        close = np.abs(got.astype(np.float64) - ref) <= np.maximum(ABS_TOL, ulps * np.spacing(np.abs(ref32)))
        if zero_sign:
            close &= ~((got == 0) & (ref == 0) & (np.signbit(got) != np.signbit(ref)))
        ok = np.where(nan_got | nan_ref, nan_got & nan_ref, np.where(inf, got == ref32, close))
    return np.flatnonzero(~ok)


def test_every_elementwise_op_has_samples():
    missing = [name for name in elementwise_names() if not SAMPLES.get(name)]
    assert not missing, f"add config samples to SAMPLES in tests/test_ops.py for: {missing}"
    unknown = sorted(set(SAMPLES) - set(elementwise_names()))
    assert not unknown, f"SAMPLES names ops the REGISTRY has not (as elementwise): {unknown}"


@pytest.mark.parametrize("name", elementwise_names())
def test_values_match_torch(name: str, host_values: dict[str, np.ndarray]):
    x = input_grid()
    y = producer_grid(x)
    failures = []
    for sid, op in samples():
        if not sid.startswith(f"{name}["):
            continue
        for j, param in enumerate(PARAM_VALUES if op.params() else PARAM_VALUES[:1]):
            got, ref = host_values[sid][j], torch_values(op, x, y, param)
            for i in mismatches(got, ref, name not in ZERO_SIGN_UNCHECKED)[:5]:
                failures.append(f"{sid} {op.forward_code('x', None)} w={param} x={x[i]!r} y={y[i]!r}: "
                                f"cuda {got[i]!r}, torch {ref[i]!r}")
    assert not failures, "\n".join(failures)


def grid_shape(values: np.ndarray, tol_ulps: int = 2) -> tuple[bool, bool]:
    """(monotone, non-decreasing) of an op's values over input_grid() (NaN input last), in the sense
    the planner uses: NaN in gives NaN; NaN for other inputs only at the ends of the sorted inputs (a
    window's extreme then meets it), for non-decreasing only at the top end; the other values
    monotone, up to ``tol_ulps`` of float32 rounding (which moves a pooled value by as much)."""
    if not np.isnan(values[-1]):
        return False, False
    v = values[:-1]
    nan = np.isnan(v)
    inner = np.flatnonzero(~nan)
    if inner.size and nan[inner[0]:inner[-1] + 1].any():
        return False, False  # a NaN between numbers
    low_nan = inner.size > 0 and inner[0] > 0
    w = v[~nan].astype(np.float64)
    with np.errstate(invalid="ignore"):
        step = np.diff(w)
        # float32 ulps of the larger neighbour (0 where it is infinite: an infinity is not rounded)
        big = np.maximum(np.abs(w[:-1]), np.abs(w[1:])).astype(np.float32)
        slack = np.nan_to_num(tol_ulps * np.spacing(big).astype(np.float64), nan=0.0)
        up = bool(np.all((step >= -slack) | (w[:-1] == w[1:])))
        down = bool(np.all((step <= slack) | (w[:-1] == w[1:])))
    return up or down, up and not low_nan


@pytest.mark.parametrize("name", elementwise_names())
def test_monotone_flags_hold_on_the_grid(name: str, host_values: dict[str, np.ndarray]):
    """A claimed monotone() or increasing() holds for every parameter value (both signs); a sample
    claiming neither is visibly not monotone for some parameter value (the claims are not needlessly
    conservative: each False in the ops is for a function the grid shows bending or breaking)."""
    failures = []
    for sid, op in samples():
        if not sid.startswith(f"{name}["):
            continue
        shapes = [grid_shape(host_values[sid][j]) for j in range(len(PARAM_VALUES) if op.params() else 1)]
        if op.monotone() and not all(m for m, _ in shapes):
            failures.append(f"{sid} {op.forward_code('x', None)} claims monotone(); not on the grid")
        if op.increasing() and not all(i for _, i in shapes):
            failures.append(f"{sid} {op.forward_code('x', None)} claims increasing(); not on the grid")
        if op.increasing() and not op.monotone():
            failures.append(f"{sid}: increasing() without monotone()")
        if not op.monotone() and all(m for m, _ in shapes):
            failures.append(f"{sid} {op.forward_code('x', None)}: monotone on the grid, yet monotone() is False")
        if op.monotone() and not op.increasing() and all(i for _, i in shapes):
            failures.append(f"{sid} {op.forward_code('x', None)}: non-decreasing on the grid, yet increasing() "
                            "is False")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", elementwise_names())
def test_unknown_keys_are_refused_by_name(name: str):
    with pytest.raises(ConfigError) as err:
        parse(name, {**(SAMPLES.get(name) or [{}])[0], "bogus": 1})
    assert err.value.key == "epilogue[0].bogus"


@pytest.mark.parametrize("name,entry,key", BAD, ids=[f"{n}-{k}-{i}" for i, (n, _, k) in enumerate(BAD)])
def test_bad_values_are_refused_by_name(name: str, entry: dict[str, Any], key: str):
    with pytest.raises(ConfigError) as err:
        parse(name, entry)
    assert err.value.key == f"epilogue[0].{key}"


@pytest.mark.parametrize("name", ["mul", "div", "add", "sub", "minimum", "maximum", "pow"])
def test_by_producer(name: str):
    """``by: producer`` reads the convolution's output at the element: ``y`` in the generated
    forward, ``ft_y`` in the kernels; no parameter, not monotone, in the cache key."""
    op = parse(name, {"by": "producer"})
    assert op.uses_producer()
    assert op.params() == ()
    assert not op.monotone() and not op.increasing()
    assert "y" in op.forward_code("x", None).replace("x", "").split("(")[-1]
    assert "ft_y" in op.cuda("v", lambda p: pytest.fail("no parameter load expected"))
    assert op.canonical()["producer"] is True


def test_existing_cache_keys_unchanged():
    """The canonical form of the first ops is part of every cache key: a new field must not show."""
    assert parse("mul", {"by": 2}).canonical() == {"kind": "mul", "scalar": 2.0, "param": None}
    assert parse("div", {"by": PARAM}).canonical() == {"kind": "div", "scalar": None, "param": PARAM}
    assert parse("add", {"by": -1.5}).canonical() == {"kind": "add", "scalar": -1.5, "param": None}
    assert parse("clamp", {"min": 0.0}).canonical() == {"kind": "clamp", "min": 0.0, "max": None}
    assert parse("relu", {}).canonical() == {"kind": "relu"}
    assert not any(parse(n, e).uses_producer() for n, es in SAMPLES.items() for e in es if e.get("by") != "producer")


def test_defaults_are_pytorchs():
    """Omitted arguments take PyTorch's defaults, and forward_code spells them out."""
    assert parse("leaky_relu", {}).forward_code("x", None) == "F.leaky_relu(x, negative_slope=0.01)"
    assert parse("elu", {}).forward_code("x", None) == "F.elu(x, alpha=1.0)"
    assert parse("celu", {}).forward_code("x", None) == "F.celu(x, alpha=1.0)"
    assert parse("gelu", {}).forward_code("x", None) == "F.gelu(x, approximate='none')"
    assert parse("softplus", {}).forward_code("x", None) == "F.softplus(x, beta=1.0, threshold=20.0)"
    assert parse("hardtanh", {}).forward_code("x", None) == "F.hardtanh(x, min_val=-1.0, max_val=1.0)"
    assert parse("hardshrink", {}).forward_code("x", None) == "F.hardshrink(x, lambd=0.5)"
    assert parse("softshrink", {}).forward_code("x", None) == "F.softshrink(x, lambd=0.5)"
    largest = float(torch.finfo(torch.float32).max)
    assert parse("nan_to_num", {}).forward_code("x", None) == (
        f"torch.nan_to_num(x, nan=0.0, posinf={largest!r}, neginf={-largest!r})")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_nan_to_num_defaults_are_the_dtypes_extremes(dtype: str):
    """PyTorch's None for posinf and neginf is the input dtype's largest and lowest finite value: at a half chain's
    dtype (OpContext.dtype), not float32's, which would round to an infinity there; a value past that range is
    refused by name."""
    ctx = OpContext(path="test.yaml", key="epilogue[0]", in_shape=(2, 4, 8, 8), spatial_dims=2, parameters={},
                    dtype=dtype)
    op = REGISTRY["nan_to_num"].parse({"op": "nan_to_num"}, ctx)
    largest = float(torch.finfo(getattr(torch, dtype)).max)
    assert (op.posinf, op.neginf) == (largest, -largest)
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5], dtype=getattr(torch, dtype))
    assert torch.equal(eval(op.forward_code("x", None), {"torch": torch, "x": x}), torch.nan_to_num(x))  # noqa: S307
    with pytest.raises(ConfigError, match="posinf"):
        REGISTRY["nan_to_num"].parse({"op": "nan_to_num", "posinf": 1e6 if dtype == "float16" else 1e39}, ctx)


#: The operands after x that an op's torch function takes in the alias check: the binaries' other operand (nonzero,
#: both signs), clamp's bounds.
_ALIAS_OPERANDS: dict[str, tuple[Any, ...]] = {
    **{kind: (torch.linspace(-2.5, 3.5, 101, dtype=torch.float64).add(0.03),) for kind in ("mul", "sub", "div")},
    "clamp": (-1.0, 2.0)}


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_aliases_are_pytorchs_names_of_registry_ops(alias: str):
    """Each of PyTorch's other names (ops.ALIASES, which the importer and the config's hint read) names a REGISTRY op
    and computes what the op's torch function does: as a torch function and a Tensor method (TORCH_ALIASES), or in
    torch.special (SPECIAL_NAMES)."""
    kind = ALIASES[alias]
    assert kind in REGISTRY and alias not in REGISTRY
    x = torch.linspace(-3.7, 3.7, 101, dtype=torch.float64)
    rest = _ALIAS_OPERANDS.get(kind, ())
    want = getattr(torch, kind)(x, *rest)
    spellings = ([getattr(torch, alias), lambda *a: getattr(a[0], alias)(*a[1:])] if alias in TORCH_ALIASES
                 else [getattr(torch.special, alias)])
    assert alias in TORCH_ALIASES or SPECIAL_NAMES.get(alias) == kind
    for spelling in spellings:
        torch.testing.assert_close(spelling(x, *rest), want, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("exponent,helper", [(2.0, "ft_pow2(v)"), (3, "ft_pow3(v)"), (0.5, "ft_pow_half(v)"),
                                             (-1, "ft_pow_m1(v)"), (1, "v"), (0, "1.0f"), (2.5, "powf(v, 2.5f)")])
def test_pow_exponents_without_powf(exponent: float, helper: str):
    """The exponents torch computes by products and square roots take no powf in the kernels."""
    assert parse("pow", {"by": exponent}).cuda("v", lambda p: "p") == helper


def test_an_expression_after_ops_reads_their_value_once(tmp_path: Path):
    """Where x is itself an expression (the ops before it in the kernels' chain, codegen._chain, a parameter's __ldg
    among them) and the expression reads it more than once, the chain computes it once, and its values are still
    PyTorch's (a lambda's argument, compiled as the kernels compile it)."""
    from fusetune import codegen

    ops = [parse("mul", {"by": PARAM}), parse("add", {"by": 0.5}),
           parse("expression", {"expr": "x * tanh(x) - minimum(x, 1) / 3"})]
    chain = types.SimpleNamespace(cuda=lambda v, load: codegen._chain(ops, v, {PARAM: 0}, plain=True))
    rendered = chain.cuda("v", None)
    assert rendered.count("a.p[0][c]") == 1, rendered
    # host_program's parameter is p: the chain's load as a plain array read of it
    chain = types.SimpleNamespace(cuda=lambda v, load: rendered.replace("a.p[0][c]", "p"))
    got = run_on_host([chain], tmp_path)[0]
    x, y = input_grid(), producer_grid(input_grid())
    failures = []
    for j, param in enumerate(PARAM_VALUES):
        ref = torch_values(ops[0], x, y, param)
        for op in ops[1:]:
            ref = torch_values(op, ref, y, param)
        failures += [f"w={param} x={x[i]!r}: cuda {got[j][i]!r}, torch {ref[i]!r}" for i in mismatches(got[j], ref)[:5]]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_each_dtype_row_states_its_own_largest(dtype: str):
    """Dtype.largest has no default (a new row would silently take float32's): a row without it is refused,
    and each row's is torch's for that dtype; NanToNum's fields have none either (its defaults are the dtype's)."""
    row = DTYPES[dtype]
    assert row.largest == float(torch.finfo(getattr(torch, row.torch)).max)
    rest = {f.name: getattr(row, f.name) for f in dataclasses.fields(Dtype) if f.name != "largest"}
    with pytest.raises(TypeError, match="largest"):
        Dtype(**rest)
    with pytest.raises(TypeError, match="posinf"):
        REGISTRY["nan_to_num"]()
