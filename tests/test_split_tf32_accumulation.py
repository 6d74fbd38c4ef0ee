"""Split TF32's accumulation in the K-tiled kernels, emulated on the CPU as their render (ft_wide_multiply's call
of mma.cuh.j2's split-TF32 MMAs) does it.

The tensor cores round the float32 sum an MMA accumulates toward zero (they truncate). Three MMAs a k step
accumulated straight into the output's register truncate it 3 K / 8 times, each time by up to an ulp of the
running sum: over the 64 x 125 taps of the transposed-conv3d seed every value is pulled toward zero by about
1e-5 of its running sums, and batch norm then a spatial mean (the output is the plane's mean less the batch's
over the spread) turn that into 1e-5 of the output, where eager float32's error is 3e-7.
The test reads those statements from the ieee render and runs them over such a K on inputs drawn as
verification draws them, each MMA's sum rounded toward zero, and bounds the bias of the values' mean."""
from __future__ import annotations

import re

import numpy as np
import pytest

from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.plan import make_plan

from conftest import ROOT

SEED = ROOT / "benchmarks" / "half" / "convt3d_scale_batchnorm_gap_ieee.yaml"
#: A k step: an m16n8k8 MMA's products per value.
KSTEP = 8


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 to TF32, to nearest with ties away from zero (cvt.rna.tf32.f32)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.int32)
    return ((bits + 0x1000) & -0x2000).view(np.float32)


def _split(x: np.ndarray) -> dict[str, np.ndarray]:
    """ft_tf32_split: hi = tf32(x), lo = tf32(x - hi), as float64 (their products are exact there)."""
    hi = _tf32(x)
    return {"hi": hi.astype(np.float64), "lo": _tf32(x - hi).astype(np.float64)}


def _toward_zero(v: np.ndarray) -> np.ndarray:
    """float64 to float32 rounded toward zero, as the tensor cores normalise an MMA's sum."""
    r = v.astype(np.float32)
    over = np.abs(r.astype(np.float64)) > np.abs(v)
    return np.where(over, np.nextafter(r, np.float32(0)), r)


def _steps(text: str, function: str, d: str = "d") -> list[tuple]:
    """The body of split-TF32 function ``function`` (ft_mma_split or one that calls it) as steps, its output
    register named ``d``: ("zero", s) a float[4] from zero; ("mma", acc, a term, b term) an MMA accumulating
    into acc; ("add", x, s) x += s in float32. Any other statement fails the test: the emulation must
    follow what the kernel does."""
    body = re.search(rf"void {function}\(.*?\) \{{\n(.*?)\n\}}", text, re.S)
    assert body, f"no {function} in the ieee render"
    name = lambda reg: d if reg == "d" else f"{function}.{reg}"
    steps = []
    for line in (s.strip() for s in body.group(1).splitlines()):
        if not line or line.startswith(("//", "#pragma")):
            continue
        if m := re.fullmatch(r"float (\w+)\[4\] = \{0\.f, 0\.f, 0\.f, 0\.f\};", line):
            steps.append(("zero", name(m.group(1))))
        elif m := re.fullmatch(r"ft_mma_tf32\((\w+), a([hl])\[0\], a[hl]\[1\], a[hl]\[2\], a[hl]\[3\], b\[(\d)\], b\[\d\]\);",
                               line):
            steps.append(("mma", name(m.group(1)), "hi" if m.group(2) == "h" else "lo",
                          "hi" if m.group(3) == "0" else "lo"))
        elif m := re.fullmatch(r"(ft_mma_split\w*)\((\w+), ah, al, b\);", line):
            steps += _steps(text, m.group(1), name(m.group(2)))
        elif m := re.fullmatch(r"(?:for \(int e = 0; e < 4; \+\+e\) )?(\w+)\[e\] \+= (\w+)\[e\];", line):
            steps.append(("add", name(m.group(1)), name(m.group(2))))
        else:
            raise AssertionError(f"{function}: a statement the emulation does not know: {line!r}")
    return steps


def _accumulate(steps: list[tuple], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row of a times b, a k step at a time through the steps (float32 registers, MMAs rounding
    toward zero); the output register is "d"."""
    ta, tb = _split(a), _split(b)
    regs = {"d": np.zeros(a.shape[0], dtype=np.float32)}
    for k in range(0, a.shape[1], KSTEP):
        for step in steps:
            if step[0] == "zero":
                regs[step[1]] = np.zeros(a.shape[0], dtype=np.float32)
            elif step[0] == "mma":
                _, acc, at, bt = step
                products = ta[at][:, k:k + KSTEP] @ tb[bt][k:k + KSTEP]
                regs[acc] = _toward_zero(regs[acc].astype(np.float64) + products)
            else:
                regs[step[1]] = regs[step[1]] + regs[step[2]]  # float32, to nearest
    return regs["d"].astype(np.float64)


#: ft_mma_split: the three MMAs accumulating in d (the whole-weights kernels' product, over their K of a few
#: hundred; the test's own check that the emulation sees the truncation's bias).
IN_D = [("mma", "d", "lo", "hi"), ("mma", "d", "hi", "lo"), ("mma", "d", "hi", "hi")]


@pytest.fixture(scope="module")
def rendered_split() -> list[tuple]:
    """What the K-tiled kernels' product (ft_wide_multiply) does a k step, from the ieee seed's render."""
    module = render(make_plan(load_config(SEED)))
    units = {u: t for u, t in module.cuda_sources.items() if re.fullmatch(r"wide_stats_\d+\.cu", u)}
    assert units
    steps = set()
    for unit, text in units.items():
        called = set(re.findall(r"(ft_mma_split\w*)\(acc\[i\]\[2 \* p(?: \+ 1)?\], ah\[i\], al\[i\], b[01]\);", text))
        assert len(called) == 1, (unit, called)
        steps.add(tuple(_steps(text, called.pop())))
    assert len(steps) == 1  # one mma.cuh.j2
    return list(steps.pop())


def test_split_tf32_mean_is_float32s_over_a_long_k(rendered_split):
    """Over the seed's K (64 channels x 125 taps), on inputs in [0, 1) and weights of the seed's init, the
    rendered split-TF32 accumulation's values have a mean within 3e-7 of the exact one (relative to the
    values' largest: the rendered scheme gives 1e-8 there, as float32 rounding to nearest does), and their
    largest error is float32's (1e-6); accumulated in d (the MMAs truncating the running sum) the mean's error is
    1e-5 of the largest value."""
    rng = np.random.default_rng(0)
    rows, k = 512, 64 * 125
    bound = 1 / np.sqrt(128 * 125)  # ConvTranspose3d(64, 128, 5)'s kaiming-uniform bound
    a = rng.random((rows, k), dtype=np.float32)
    b = rng.uniform(-bound, bound, k).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(exact).max()

    def errors(steps):
        err = _accumulate(steps, a, b) - exact
        return abs(err.mean()) / scale, np.abs(err).max() / scale

    mean_err, max_err = errors(rendered_split)
    old_mean, old_max = errors(IN_D)
    assert old_mean > 3e-6, old_mean  # the emulation sees the truncation's bias
    assert mean_err < 3e-7 and max_err < 5e-6, (mean_err, max_err, old_mean, old_max)
