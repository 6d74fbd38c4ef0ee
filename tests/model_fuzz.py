"""Random KernelBench-style model files for the importer's fuzz test (tests/test_import_fuzz.py).

A model is a convolution (PRODUCERS: conv or transposed conv of 1, 2 or 3 spatial dims, random stride, padding
(or "same", or a padding_mode), dilation, groups and bias, odd sizes no tile divides; a module or ``F.conv*d`` on
parameters) and then 1 to 6 ops drawn from FORMS: each row is one op in one spelling a user writes (a module, a
functional call, a torch function, a Tensor method, keyword arguments, in-place forms, arithmetic with numbers,
parameters, buffers and extra inputs, a residual of the convolution's output, an activation written out by hand, a
second convolution); in training or eval mode, sometimes returning the convolution's output beside the value. A row is data: its forward expression and ``__init__`` value as templates, the arguments it
draws (ARGS, by name), what the value must be for the row to apply (NEEDS) and the shape it leaves (SHAPES). The
source is plain text (``generate(seed)``), so that a failure prints what a human runs again.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
from typing import Any, Callable, Mapping

#: A value's shape as the generator tracks it: (N, C, *spatial), fewer dims after a reduction that drops them.
Shape = tuple[int, ...]


@dataclasses.dataclass
class State:
    """What the generator knows of the chain's value before the next op: its shape, the convolution's output
    shape (a residual reads that value), whether the model is in training mode, and whether the residual ``r`` is
    the convolution's output itself (``r = x``: an in-place op on x then writes r too) or a clone."""
    shape: Shape
    conv_shape: Shape
    training: bool
    alias: bool

    @property
    def rank(self) -> int:
        return len(self.conv_shape)

    @property
    def dims(self) -> int:
        return self.rank - 2


@dataclasses.dataclass(frozen=True)
class Form:
    """One op in one spelling. ``expr``: the forward's right-hand side, or an augmented assignment ``x += ...``
    (``x`` the chain's value, ``self.{m}`` the module, ``self.{p}`` the parameter, ``{y}`` the extra input, ``r`` the
    convolution's output); ``init``: the module's or parameter's constructor, or a whole statement where it starts
    with ``self.``; ``setup``: lines after construction that move a norm off its identity; ``args``: ARGS names
    drawn in order and substituted into all three; ``needs``/``shape``: NEEDS and SHAPES names."""
    name: str
    expr: str
    init: str = ""
    setup: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    needs: str = "any"
    shape: str = "same"
    #: An extra forward argument the op reads as ``{y}``: its shape as INPUTS names it ("" for none).
    input: str = ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _spatial(state: State) -> tuple[int, ...]:
    return state.shape[2:]


def _pool_kernel(rng: random.Random, state: State, args: Mapping[str, Any]) -> int:
    return rng.randint(2, min(3, min(_spatial(state))))


def _pool_pad(rng: random.Random, state: State, args: Mapping[str, Any]) -> int:
    return rng.randint(0, args["k"] // 2)


def _param_shape(rng: random.Random, state: State, args: Mapping[str, Any]) -> tuple[int, ...]:
    """A per-channel or single-value parameter as users shape it: (C, 1, 1), (1, C, 1, 1), (1,), 0-dim; C the
    convolution's channels where the value has one channel left (a bias broadcast back over them)."""
    c = state.shape[1]
    if c == 1 and rng.random() < 0.5:
        c = state.conv_shape[1]
    ones = (1,) * state.dims
    return rng.choice([(c, *ones), (c, *ones), (1, c, *ones), (1,), ()])


def _spatial_dims(rng: random.Random, state: State, args: Mapping[str, Any]) -> tuple[int, ...] | list[int] | int:
    """Every spatial dim, spelled as users do: (2, 3), [2, 3], (-2, -1), or 2 for one."""
    dims = tuple(range(2, state.rank))
    spelled = rng.choice([dims, list(dims), tuple(d - state.rank for d in dims)])
    return spelled[0] if len(dims) == 1 and rng.random() < 0.5 else spelled


#: Argument samplers: name -> (rng, state, the arguments drawn before it) -> value, substituted with str().
ARGS: dict[str, Callable[[random.Random, State, Mapping[str, Any]], Any]] = {
    "d": lambda rng, s, a: s.dims,
    "C": lambda rng, s, a: s.shape[1],
    "num": lambda rng, s, a: rng.choice([0.5, 2, -1.5, 3.0, 0.1, -0.25]),
    "nonzero": lambda rng, s, a: rng.choice([0.5, 2, -1.5, 3.0, 1.7]),
    "slope": lambda rng, s, a: rng.choice([0.01, 0.2, 0.05, -0.3]),
    "lo": lambda rng, s, a: rng.choice([-1.0, -0.5, 0.0, -2]),
    "hi": lambda rng, s, a: rng.choice([0.5, 1.0, 2.0, 6]),
    "beta": lambda rng, s, a: rng.choice([1.0, 0.5, 2.0]),
    "alpha": lambda rng, s, a: rng.choice([1.0, 0.5, 1.3]),
    "eps": lambda rng, s, a: rng.choice([1e-5, 1e-3, 0.1]),
    "momentum": lambda rng, s, a: rng.choice([0.1, 0.05, None]),
    "affine": lambda rng, s, a: rng.choice([True, False]),
    "p_drop": lambda rng, s, a: rng.choice([0.0, 0.2, 0.5]),
    "groups": lambda rng, s, a: rng.choice([g for g in _divisors(s.shape[1])
                                            if s.shape[1] // g * math.prod(_spatial(s)) > 1]),
    "rest": lambda rng, s, a: list(s.shape[1:]),
    "last": lambda rng, s, a: s.shape[-1],
    "k": _pool_kernel,
    "s": lambda rng, s, a: rng.choice([1, 2, a["k"]]),
    "pad": _pool_pad,
    "ceil": lambda rng, s, a: rng.choice([True, False]),
    "cip": lambda rng, s, a: rng.choice([True, False]),
    "osz": lambda rng, s, a: rng.randint(1, min(_spatial(s))),
    "pshape": _param_shape,
    "sp": _spatial_dims,
    "alldims": lambda rng, s, a: tuple(range(1, len(s.shape))),
    "ones": lambda rng, s, a: ", ".join(["1"] * s.dims),
    "C2": lambda rng, s, a: rng.randint(1, 5),
    "th": lambda rng, s, a: rng.choice([0.1, -0.2, 0.5]),
    "cdim": lambda rng, s, a: rng.choice([1, 1, 1 - len(s.shape)]),  # the channels, as 1 or as a negative dim
}


def _pool_length(n: int, k: int, s: int, p: int, ceil: bool) -> int:
    """PyTorch's pooled length: a window in ceil mode counts where it starts inside the input or its left pad."""
    span = n + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _pooled(shape: Shape, a: Mapping[str, Any]) -> Shape:
    k, s, p, ceil = a.get("k", 1), a.get("s") or a.get("k", 1), a.get("pad", 0), a.get("ceil", False)
    return (*shape[:2], *(_pool_length(n, k, s, p, ceil) for n in shape[2:]))


def _broadcast(shape: Shape, other: tuple[int, ...]) -> Shape:
    out = list(shape)
    for i, n in enumerate(reversed(other)):
        j = len(out) - 1 - i
        out[j] = max(out[j], n)
    return tuple(out)


#: Shape rules: name -> (shape before, the drawn arguments) -> shape after.
SHAPES: dict[str, Callable[[Shape, Mapping[str, Any]], Shape]] = {
    "same": lambda shape, a: shape,
    "broadcast": lambda shape, a: _broadcast(shape, a["pshape"]),
    "pool": _pooled,
    "adaptive": lambda shape, a: (*shape[:2], *(a.get("osz", 1),) * (len(shape) - 2)),
    "spatial_keep_all": lambda shape, a: (shape[0], *(1,) * (len(shape) - 1)),
    "spatial_keep": lambda shape, a: (*shape[:2], *(1,) * (len(shape) - 2)),
    "spatial_drop": lambda shape, a: shape[:2],
    "channel_keep": lambda shape, a: (shape[0], 1, *shape[2:]),
    "channel_drop": lambda shape, a: (shape[0], *shape[2:]),
    "flatten": lambda shape, a: (shape[0], math.prod(shape[1:])),
    "flatten_spatial": lambda shape, a: (*shape[:2], math.prod(shape[2:])),
    "last_drop": lambda shape, a: shape[:-1],
    "dim2_drop": lambda shape, a: (*shape[:2], *shape[3:]),
    "channels_to": lambda shape, a: (shape[0], a["C2"], *shape[2:]),
    "halve_channels": lambda shape, a: (shape[0], shape[1] // 2, *shape[2:]),
    "shuffle": lambda shape, a: (shape[0], shape[1] // 4, shape[2] * 2, shape[3] * 2),
    "crop_last": lambda shape, a: (*shape[:-1], shape[-1] - 1),
    "all_drop": lambda shape, a: shape[:1],
}

#: Extra inputs' shapes: name -> the value's shape -> the input's (a residual's identity, a diffusion block's
#: per-sample, per-channel embedding).
INPUTS: dict[str, Callable[[Shape], Shape]] = {
    "full": lambda shape: shape,
    "per_sample_channel": lambda shape: (*shape[:2], *(1,) * (len(shape) - 2)),
}

#: Preconditions: name -> whether a row applies to the value as it is.
NEEDS: dict[str, Callable[[State], bool]] = {
    "any": lambda s: True,
    "full": lambda s: len(s.shape) == s.rank,
    "channels": lambda s: len(s.shape) >= 2,
    "batch_always": lambda s: len(s.shape) == s.rank and s.shape[0] * math.prod(_spatial(s)) > 1,
    "grouped": lambda s: len(s.shape) == s.rank and s.shape[1] * math.prod(_spatial(s)) > 1,
    "plane": lambda s: len(s.shape) == s.rank and math.prod(_spatial(s)) > 1,
    "batch_stats": lambda s: len(s.shape) == s.rank and (not s.training or s.shape[0] * math.prod(_spatial(s)) > 1),
    "poolable": lambda s: len(s.shape) == s.rank and min(_spatial(s)) >= 2,
    "residual": lambda s: s.shape == s.conv_shape,
    "poolable2": lambda s: s.dims >= 2 and NEEDS["poolable"](s),  # (AvgPool1d has no divisor_override)
    "four_d": lambda s: len(s.shape) == s.rank == 4,
    "conv": lambda s: len(s.shape) == s.rank and min(_spatial(s)) >= 3,
    "two_channels": lambda s: len(s.shape) >= 2 and s.shape[1] >= 2,
    "even_channels": lambda s: len(s.shape) == s.rank and s.shape[1] % 2 == 0,
    "shuffle": lambda s: len(s.shape) == s.rank == 4 and s.shape[1] % 4 == 0,
    "croppable": lambda s: len(s.shape) == s.rank and s.shape[-1] >= 3,
    "softmax_dim2": lambda s: len(s.shape) == s.rank and s.rank >= 4,
}

_AFFINE = ("nn.init.uniform_(self.{m}.weight, 0.5, 1.5)", "nn.init.uniform_(self.{m}.bias, -0.5, 0.5)")
_RUNNING = ("self.{m}.running_mean.uniform_(-0.5, 0.5)", "self.{m}.running_var.uniform_(0.5, 2.0)")

#: The vocabulary in the spellings users write, one row each.
FORMS: tuple[Form, ...] = (
    # activations: modules, functions, methods
    Form("nn.ReLU", "self.{m}(x)", "nn.ReLU()"),
    Form("torch.relu", "torch.relu(x)"),
    Form("F.relu inplace", "F.relu(x, inplace=True)"),
    Form("x.relu_", "x.relu_()"),
    Form("nn.ReLU6", "self.{m}(x)", "nn.ReLU6()"),
    Form("nn.GELU", "self.{m}(x)", "nn.GELU()"),
    Form("nn.GELU tanh", "self.{m}(x)", "nn.GELU(approximate='tanh')"),
    Form("F.gelu", "F.gelu(x)"),
    Form("F.gelu tanh", "F.gelu(x, approximate='tanh')"),
    Form("nn.LeakyReLU", "self.{m}(x)", "nn.LeakyReLU({slope})", args=("slope",)),
    Form("nn.LeakyReLU kw", "self.{m}(x)", "nn.LeakyReLU(negative_slope={slope})", args=("slope",)),
    Form("F.leaky_relu", "F.leaky_relu(x, negative_slope={slope})", args=("slope",)),
    Form("F.leaky_relu positional", "F.leaky_relu(x, {slope})", args=("slope",)),
    Form("nn.Hardtanh", "self.{m}(x)", "nn.Hardtanh(min_val={lo}, max_val={hi})", args=("lo", "hi")),
    Form("F.hardtanh", "F.hardtanh(x, {lo}, {hi})", args=("lo", "hi")),
    Form("nn.Softplus", "self.{m}(x)", "nn.Softplus(beta={beta})", args=("beta",)),
    Form("F.softplus", "F.softplus(x)"),
    Form("nn.ELU", "self.{m}(x)", "nn.ELU(alpha={alpha})", args=("alpha",)),
    Form("F.elu", "F.elu(x)"),
    Form("nn.SELU", "self.{m}(x)", "nn.SELU()"),
    Form("nn.CELU", "self.{m}(x)", "nn.CELU({alpha})", args=("alpha",)),
    Form("nn.SiLU", "self.{m}(x)", "nn.SiLU()"),
    Form("F.silu", "F.silu(x)"),
    Form("nn.Mish", "self.{m}(x)", "nn.Mish()"),
    Form("F.mish", "F.mish(x)"),
    Form("nn.Sigmoid", "self.{m}(x)", "nn.Sigmoid()"),
    Form("torch.sigmoid", "torch.sigmoid(x)"),
    Form("x.sigmoid", "x.sigmoid()"),
    Form("nn.Tanh", "self.{m}(x)", "nn.Tanh()"),
    Form("torch.tanh", "torch.tanh(x)"),
    Form("x.tanh", "x.tanh()"),
    Form("nn.Hardswish", "self.{m}(x)", "nn.Hardswish()"),
    Form("F.hardswish", "F.hardswish(x)"),
    Form("nn.Hardsigmoid", "self.{m}(x)", "nn.Hardsigmoid()"),
    Form("nn.Softsign", "self.{m}(x)", "nn.Softsign()"),
    Form("torch.abs", "torch.abs(x)"),
    Form("torch.erf", "torch.erf(x)"),
    Form("neg", "-x"),
    Form("nn.Identity", "self.{m}(x)", "nn.Identity()"),
    Form("nn.Dropout", "self.{m}(x)", "nn.Dropout({p_drop})", args=("p_drop",)),
    Form("F.dropout", "F.dropout(x, p={p_drop}, training=self.training)", args=("p_drop",)),
    # clamps and extrema against a number
    Form("torch.clamp", "torch.clamp(x, min={lo}, max={hi})", args=("lo", "hi")),
    Form("x.clamp min", "x.clamp(min={lo})", args=("lo",)),
    Form("torch.clamp max", "torch.clamp(x, max={hi})", args=("hi",)),
    Form("x.clamp_min", "x.clamp_min({lo})", args=("lo",)),
    Form("torch.min tensor", "torch.min(x, torch.tensor({num}))", args=("num",)),
    Form("torch.max tensor", "torch.max(x, torch.tensor({num}))", args=("num",)),
    Form("torch.maximum tensor", "torch.maximum(x, torch.tensor({num}))", args=("num",)),
    # activations written out by hand
    Form("swish by hand", "x * torch.sigmoid(x)"),
    Form("swish by hand reversed", "torch.sigmoid(x) * x"),
    Form("hardswish by hand", "x * F.relu6(x + 3) / 6"),
    Form("hardswish clamp by hand", "x * torch.clamp(x + 3, 0, 6) / 6"),
    Form("mish by hand", "x * torch.tanh(F.softplus(x))"),
    Form("erf gelu by hand", "0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))"),
    Form("where leaky", "torch.where(x > 0, x, x * {slope})", args=("slope",)),
    # arithmetic with numbers
    Form("mul number", "x * {num}", args=("num",)),
    Form("rmul number", "{num} * x", args=("num",)),
    Form("div number", "x / {nonzero}", args=("nonzero",)),
    Form("add number", "x + {num}", args=("num",)),
    Form("sub number", "x - {num}", args=("num",)),
    Form("rsub number", "{num} - x", args=("num",)),
    Form("torch.mul number", "torch.mul(x, {num})", args=("num",)),
    Form("square", "x ** 2"),
    Form("x.pow", "x.pow(2)"),
    Form("iadd number", "x.add_({num})", args=("num",)),
    # arithmetic with parameters
    Form("add param", "x + self.{p}", "nn.Parameter(torch.randn({pshape}))", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("radd param", "self.{p} + x", "nn.Parameter(torch.randn({pshape}))", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("sub param", "x - self.{p}", "nn.Parameter(torch.randn({pshape}))", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("mul param", "x * self.{p}", "nn.Parameter(torch.randn({pshape}))", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("x.mul param", "x.mul(self.{p})", "nn.Parameter(torch.randn({pshape}))", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("torch.add param", "torch.add(x, self.{p})", "nn.Parameter(torch.randn({pshape}))", args=("pshape",),
         needs="full", shape="broadcast"),
    Form("div param", "x / self.{p}", "nn.Parameter(torch.rand({pshape}) + 0.5)", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("min param", "torch.min(x, self.{p})", "nn.Parameter(torch.randn({pshape}))", args=("pshape",),
         needs="full", shape="broadcast"),
    # a residual of the convolution's output
    Form("add residual", "x + r", needs="residual"),
    Form("radd residual", "r + x", needs="residual"),
    Form("mul residual", "x * r", needs="residual"),
    Form("sub residual", "x - r", needs="residual"),
    # norms
    Form("nn.GroupNorm", "self.{m}(x)", "nn.GroupNorm({groups}, {C}, eps={eps})", _AFFINE,
         ("groups", "C", "eps"), "grouped"),
    Form("nn.GroupNorm no affine", "self.{m}(x)", "nn.GroupNorm({groups}, {C}, affine=False)", (),
         ("groups", "C"), "grouped"),
    Form("F.group_norm", "F.group_norm(x, {groups})", args=("groups",), needs="grouped"),
    Form("nn.BatchNorm", "self.{m}(x)", "nn.BatchNorm{d}d({C}, eps={eps}, momentum={momentum})",
         _AFFINE + _RUNNING, ("d", "C", "eps", "momentum"), "batch_stats"),
    Form("nn.InstanceNorm", "self.{m}(x)", "nn.InstanceNorm{d}d({C})", (), ("d", "C"), "plane"),
    Form("nn.InstanceNorm affine", "self.{m}(x)", "nn.InstanceNorm{d}d({C}, affine=True)", _AFFINE, ("d", "C"),
         "plane"),
    Form("F.instance_norm", "F.instance_norm(x)", needs="plane"),
    Form("nn.LayerNorm over C and space", "self.{m}(x)", "nn.LayerNorm({rest})", _AFFINE, ("rest",), "full"),
    Form("F.layer_norm shape read", "F.layer_norm(x, x.shape[1:])", needs="full"),
    Form("nn.LayerNorm last dim", "self.{m}(x)", "nn.LayerNorm({last})", _AFFINE, ("last",), "full"),
    # softmax over the channels
    Form("nn.Softmax", "self.{m}(x)", "nn.Softmax(dim=1)", needs="channels"),
    Form("torch.softmax", "torch.softmax(x, dim={cdim})", args=("cdim",), needs="channels"),
    Form("F.softmax", "F.softmax(x, dim=1)", needs="channels"),
    Form("x.log_softmax", "x.log_softmax(dim=1)", needs="channels"),
    # pools
    Form("nn.MaxPool", "self.{m}(x)", "nn.MaxPool{d}d({k})", args=("d", "k"), needs="poolable", shape="pool"),
    Form("nn.MaxPool strided padded", "self.{m}(x)", "nn.MaxPool{d}d(kernel_size={k}, stride={s}, padding={pad})",
         args=("d", "k", "s", "pad"), needs="poolable", shape="pool"),
    Form("F.max_pool", "F.max_pool{d}d(x, {k})", args=("d", "k"), needs="poolable", shape="pool"),
    Form("F.max_pool kw", "F.max_pool{d}d(x, kernel_size={k}, stride={s})", args=("d", "k", "s"),
         needs="poolable", shape="pool"),
    Form("nn.AvgPool", "self.{m}(x)", "nn.AvgPool{d}d({k})", args=("d", "k"), needs="poolable", shape="pool"),
    Form("nn.AvgPool options", "self.{m}(x)",
         "nn.AvgPool{d}d({k}, stride={s}, padding={pad}, ceil_mode={ceil}, count_include_pad={cip})",
         args=("d", "k", "s", "pad", "ceil", "cip"), needs="poolable", shape="pool"),
    Form("F.avg_pool", "F.avg_pool{d}d(x, {k})", args=("d", "k"), needs="poolable", shape="pool"),
    Form("nn.AdaptiveAvgPool 1", "self.{m}(x)", "nn.AdaptiveAvgPool{d}d(1)", args=("d",), needs="full",
         shape="adaptive"),
    Form("nn.AdaptiveAvgPool grid", "self.{m}(x)", "nn.AdaptiveAvgPool{d}d({osz})", args=("d", "osz"), needs="full",
         shape="adaptive"),
    Form("F.adaptive_avg_pool", "F.adaptive_avg_pool{d}d(x, 1)", args=("d",), needs="full", shape="adaptive"),
    Form("nn.AdaptiveMaxPool", "self.{m}(x)", "nn.AdaptiveMaxPool{d}d({osz})", args=("d", "osz"), needs="full",
         shape="adaptive"),
    # reductions
    Form("x.mean spatial keepdim", "x.mean(dim={sp}, keepdim=True)", args=("sp",), needs="full",
         shape="spatial_keep"),
    Form("torch.mean spatial", "torch.mean(x, dim={sp})", args=("sp",), needs="full", shape="spatial_drop"),
    Form("x.sum spatial keepdim", "x.sum(dim={sp}, keepdim=True)", args=("sp",), needs="full", shape="spatial_keep"),
    Form("torch.amax spatial keepdim", "torch.amax(x, dim={sp}, keepdim=True)", args=("sp",), needs="full",
         shape="spatial_keep"),
    Form("torch.logsumexp spatial", "torch.logsumexp(x, dim={sp})", args=("sp",), needs="full",
         shape="spatial_drop"),
    Form("x.sum channels", "x.sum(dim=1)", needs="channels", shape="channel_drop"),
    Form("torch.sum channels keepdim", "torch.sum(x, dim=1, keepdim=True)", needs="channels", shape="channel_keep"),
    Form("torch.mean channels keepdim", "torch.mean(x, dim=1, keepdim=True)", needs="channels",
         shape="channel_keep"),
    Form("torch.min channels keepdim", "torch.min(x, dim=1, keepdim=True)[0]", needs="channels",
         shape="channel_keep"),
    Form("torch.max channels", "torch.max(x, dim=1)[0]", needs="channels", shape="channel_drop"),
    Form("x.max channels values", "x.max(dim=1, keepdim=True).values", needs="channels", shape="channel_keep"),
    Form("torch.logsumexp channels keepdim", "torch.logsumexp(x, dim=1, keepdim=True)", needs="channels",
         shape="channel_keep"),
    Form("x.amin channels", "x.amin(dim=1)", needs="channels", shape="channel_drop"),
    Form("torch.max last dim", "torch.max(x, dim=-1)[0]", needs="full", shape="last_drop"),
    Form("x.sum every dim", "x.sum(dim={alldims})", args=("alldims",), needs="channels", shape="all_drop"),
    Form("x.mean every dim keepdim", "x.mean(dim={alldims}, keepdim=True)", args=("alldims",), needs="full",
         shape="spatial_keep_all"),
    Form("torch.softmax last dim", "torch.softmax(x, dim=-1)", needs="full"),
    Form("sum channels unsqueeze", "x.sum(dim=1).unsqueeze(1)", needs="channels", shape="channel_keep"),
    # mean centrings, activations of two reads
    Form("mean centring spatial", "x - x.mean(dim={sp}, keepdim=True)", args=("sp",), needs="full"),
    Form("mean centring channels", "x - torch.mean(x, dim=1, keepdim=True)", needs="channels"),
    Form("tanh gelu by hand",
         "0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))"),
    Form("hardsigmoid by hand", "F.relu6(x + 3) / 6"),
    Form("where zeros_like", "torch.where(x > 0, x, torch.zeros_like(x))"),
    Form("masked_fill", "x.masked_fill(x < 0, 0.0)"),
    Form("square by hand", "x * x"),
    Form("add self", "x + x"),
    Form("torch.clamp positional", "torch.clamp(x, {lo}, {hi})", args=("lo", "hi")),
    Form("F.selu", "F.selu(x)"),
    Form("x.abs", "x.abs()"),
    Form("F.dropout eval", "F.dropout(x, p=0.5, training=False)"),
    Form("nn.Dropout per channel", "self.{m}(x)", "nn.Dropout{d}d({p_drop})", args=("d", "p_drop"), needs="full"),
    Form("x.contiguous", "x.contiguous()"),
    Form("x.to own dtype", "x.to(x.dtype)"),  # (x.float() too, but the check runs the model in float64)
    Form("x.type_as itself", "x.type_as(x)"),
    # operands held other ways: a Python number, a plain tensor attribute, a buffer, a parameter viewed in forward
    Form("mul float attribute", "x * self.{m}", "{num}", args=("num",)),
    Form("add tensor attribute", "x + self.{m}", "torch.randn({pshape})", args=("pshape",), needs="full",
         shape="broadcast"),
    Form("sub buffer", "x - self.{m}", "self.register_buffer('{m}', torch.randn({pshape}))", args=("pshape",),
         needs="full", shape="broadcast"),
    Form("add param viewed", "x + self.{p}.view(1, -1, {ones})", "nn.Parameter(torch.randn({C}))",
         args=("C", "ones"), needs="full"),
    Form("mul exp of param", "x * torch.exp(self.{p})", "nn.Parameter(torch.randn({pshape}) * 0.3)",
         args=("pshape",), needs="full", shape="broadcast"),
    # the model's other inputs
    Form("add input", "x + {y}", needs="full", input="full"),
    Form("mul input", "x * {y}", needs="full", input="full"),
    Form("add input per sample and channel", "x + {y}", needs="full", input="per_sample_channel"),
    # keyword and positional spellings
    Form("torch.sigmoid input kw", "torch.sigmoid(input=x)"),
    Form("F.relu input kw", "F.relu(input=x)"),
    Form("torch.tanh input kw", "torch.tanh(input=x)"),
    Form("F.gelu input kw", "F.gelu(input=x, approximate='tanh')"),
    Form("torch.clamp input kw", "torch.clamp(input=x, min={lo})", args=("lo",)),
    Form("torch.mul input kw", "torch.mul(input=x, other={num})", args=("num",)),
    Form("torch.add param kw", "torch.add(input=x, other=self.{p}, alpha=2)", "nn.Parameter(torch.randn({pshape}))",
         args=("pshape",), needs="full", shape="broadcast"),
    Form("torch.sum input kw", "torch.sum(input=x, dim=1, keepdim=True)", needs="channels", shape="channel_keep"),
    Form("torch.mean input kw", "torch.mean(input=x, dim={sp}, keepdim=True)", args=("sp",), needs="full",
         shape="spatial_keep"),
    Form("F.softmax input kw", "F.softmax(input=x, dim=1)", needs="channels"),
    Form("F.max_pool input kw", "F.max_pool{d}d(input=x, kernel_size={k})", args=("d", "k"), needs="poolable",
         shape="pool"),
    Form("F.group_norm input kw", "F.group_norm(input=x, num_groups={groups})", args=("groups",), needs="grouped"),
    Form("F.instance_norm input kw", "F.instance_norm(input=x)", needs="plane"),
    Form("F.layer_norm input kw", "F.layer_norm(input=x, normalized_shape=[{last}])", args=("last",), needs="full"),
    Form("torch.logsumexp input kw", "torch.logsumexp(input=x, dim=1, keepdim=True)", needs="channels",
         shape="channel_keep"),
    Form("torch.max input kw", "torch.max(input=x, dim=1, keepdim=True)[0]", needs="channels", shape="channel_keep"),
    Form("F.leaky_relu input kw", "F.leaky_relu(input=x, negative_slope={slope})", args=("slope",)),
    Form("F.hardtanh input kw", "F.hardtanh(input=x, min_val={lo}, max_val={hi})", args=("lo", "hi")),
    Form("F.adaptive_avg_pool input kw", "F.adaptive_avg_pool{d}d(input=x, output_size=1)", args=("d",),
         needs="full", shape="adaptive"),
    Form("torch.flatten input kw", "torch.flatten(input=x, start_dim=1)", needs="channels", shape="flatten"),
    Form("torch.sum positional keepdim", "torch.sum(x, 1, True)", needs="channels", shape="channel_keep"),
    Form("x.mean positional", "x.mean({sp}, True)", args=("sp",), needs="full", shape="spatial_keep"),
    Form("x *= number", "x *= {num}", args=("num",)),
    Form("x += param", "x += self.{p}", "nn.Parameter(torch.randn({C}, {ones}))", args=("C", "ones"), needs="full"),
    Form("x.mul_ param", "x.mul_(self.{p})", "nn.Parameter(torch.randn({C}, {ones}))", args=("C", "ones"),
         needs="full"),
    Form("x.sub_ number", "x.sub_({num})", args=("num",)),
    Form("torch.sigmoid_ ", "torch.sigmoid_(x)"),
    # more of the vocabulary
    Form("torch.var channels keepdim", "torch.var(x, dim=1, keepdim=True)", needs="two_channels",
         shape="channel_keep"),
    Form("x.std spatial biased", "x.std(dim={sp}, unbiased=False)", args=("sp",), needs="full",
         shape="spatial_drop"),
    Form("softmax dim 2", "torch.softmax(x, dim=2)", needs="softmax_dim2"),
    Form("x.mean dim 2", "x.mean(dim=2)", needs="softmax_dim2", shape="dim2_drop"),
    Form("F.normalize", "F.normalize(x, dim=1)", needs="channels"),
    Form("F.normalize p1", "F.normalize(x, p=1.0, dim=1)", needs="channels"),
    Form("F.glu", "F.glu(x, dim=1)", needs="even_channels", shape="halve_channels"),
    Form("nn.PixelShuffle", "self.{m}(x)", "nn.PixelShuffle(2)", needs="shuffle", shape="shuffle"),
    Form("crop last", "x[:, :, ..., :-1].contiguous()", needs="croppable", shape="crop_last"),
    Form("nn.PReLU per channel", "self.{m}(x)", "nn.PReLU({C}, init=0.2)", args=("C",), needs="full"),
    Form("nn.PReLU", "self.{m}(x)", "nn.PReLU()"),
    Form("nn.Threshold", "self.{m}(x)", "nn.Threshold({th}, {num})", args=("th", "num")),
    Form("F.hardshrink", "F.hardshrink(x, 0.3)"),
    Form("nn.Softshrink", "self.{m}(x)", "nn.Softshrink(0.2)"),
    Form("torch.nan_to_num", "torch.nan_to_num(x, nan=0.0)"),
    Form("elu by hand", "torch.where(x > 0, x, torch.exp(x) - 1)"),
    Form("softsign by hand", "x / (1 + torch.abs(x))"),
    Form("gate of param", "x * torch.sigmoid(self.{p})", "nn.Parameter(torch.randn({pshape}))", args=("pshape",),
         needs="full", shape="broadcast"),
    Form("nn.BatchNorm no affine", "self.{m}(x)", "nn.BatchNorm{d}d({C}, affine=False)", _RUNNING, ("d", "C"),
         "batch_stats"),
    Form("nn.BatchNorm no running stats", "self.{m}(x)", "nn.BatchNorm{d}d({C}, track_running_stats=False)",
         _AFFINE, ("d", "C"), "batch_always"),
    Form("nn.InstanceNorm running stats", "self.{m}(x)", "nn.InstanceNorm{d}d({C}, track_running_stats=True)", (),
         ("d", "C"), "plane"),
    Form("nn.LayerNorm no affine", "self.{m}(x)", "nn.LayerNorm({rest}, elementwise_affine=False)", (), ("rest",),
         "full"),
    Form("nn.AvgPool divisor", "self.{m}(x)", "nn.AvgPool{d}d({k}, divisor_override=3)", args=("d", "k"),
         needs="poolable2", shape="pool"),
    Form("nn.MaxPool ceil", "self.{m}(x)", "nn.MaxPool{d}d({k}, stride={s}, ceil_mode={ceil})",
         args=("d", "k", "s", "ceil"),
         needs="poolable", shape="pool"),
    # a second convolution: a chain of its own
    Form("conv again", "self.{m}(x)", "nn.Conv{d}d({C}, {C2}, 3, padding=1)", args=("d", "C", "C2"), needs="conv",
         shape="channels_to"),
    Form("conv again valid", "self.{m}(x)", "nn.Conv{d}d({C}, {C2}, 1)", args=("d", "C", "C2"), needs="full",
         shape="channels_to"),
    # two readers, modules called twice, permuted norms
    Form("sigmoid times tanh", "torch.sigmoid(x) * torch.tanh(x)"),
    Form("module called twice", "self.{m}(self.{m}(x))", "nn.Tanh()"),
    Form("spatial mean through a view", "x.view(x.size(0), x.size(1), -1).mean(dim=-1)", needs="full",
         shape="spatial_drop"),
    Form("channel LayerNorm permuted", "self.{m}(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)", "nn.LayerNorm({C})",
         _AFFINE, ("C",), "four_d"),
    # views
    Form("torch.flatten", "torch.flatten(x, 1)", needs="channels", shape="flatten"),
    Form("x.view flatten", "x.view(x.size(0), -1)", needs="channels", shape="flatten"),
    Form("x.flatten spatial", "x.flatten(2)", needs="full", shape="flatten_spatial"),
    Form("x.view spatial", "x.view(x.shape[0], x.shape[1], -1)", needs="full", shape="flatten_spatial"),
)


@dataclasses.dataclass(frozen=True)
class Producer:
    """A convolution kind: its module and functional names, spatial dims, and whether it is transposed."""
    name: str
    module: str
    function: str
    dims: int
    transposed: bool


PRODUCERS: tuple[Producer, ...] = tuple(
    Producer(f"{'conv_transpose' if t else 'conv'}{d}d", f"nn.{'ConvTranspose' if t else 'Conv'}{d}d",
             f"F.{'conv_transpose' if t else 'conv'}{d}d", d, t)
    for t in (False, True) for d in (1, 2, 3))

#: Input sizes a spatial dim takes, by the convolution's spatial dims: odd and prime sizes no tile divides.
SIZES: dict[int, tuple[int, ...]] = {1: (9, 13, 17, 23, 31), 2: (5, 7, 9, 11, 13), 3: (3, 4, 5, 7)}


@dataclasses.dataclass(frozen=True)
class Geometry:
    """A convolution's drawn arguments and its input and output shapes."""
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int | str  # or "same" (stride 1)
    dilation: int
    groups: int
    bias: bool
    output_padding: int
    input_shape: Shape
    output_shape: Shape
    padding_mode: str = "zeros"  # a module's: reflect, replicate, circular pad the input as F.pad does


def _out_length(p: Producer, g: Geometry, n: int) -> int:
    if p.transposed:
        return (n - 1) * g.stride - 2 * g.padding + g.dilation * (g.kernel - 1) + g.output_padding + 1
    if g.padding == "same":
        return n
    return (n + 2 * g.padding - g.dilation * (g.kernel - 1) - 1) // g.stride + 1


def _geometry(rng: random.Random, p: Producer) -> Geometry:
    """Draws until the output has 2 to 24 positions a spatial dim (and not one position overall)."""
    while True:
        groups = rng.choice([1, 1, 1, 2, 3])
        in_channels = groups * rng.randint(1, 3)
        out_channels = groups * rng.randint(1, 4)
        kernel, stride, dilation = rng.randint(1, 4), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2])
        padding: int | str = rng.randint(0, max(0, (kernel - 1) * dilation // 2 + (1 if rng.random() < 0.3 else 0)))
        mode = "zeros"
        if not p.transposed and stride == 1 and rng.random() < 0.15:
            padding = "same"
        elif not p.transposed and padding and rng.random() < 0.2:
            mode = rng.choice(["reflect", "replicate", "circular"])
        output_padding = rng.randint(0, max(stride, dilation) - 1) if p.transposed else 0
        batch = rng.choice([1, 2, 3])
        spatial = tuple(rng.choice(SIZES[p.dims]) for _ in range(p.dims))
        g = Geometry(in_channels, out_channels, kernel, stride, padding, dilation, groups, rng.random() < 0.7,
                     output_padding, (batch, in_channels, *spatial), (), mode)
        out = tuple(_out_length(p, g, n) for n in spatial)
        if all(2 <= n <= 24 for n in out) and (not p.transposed or padding < kernel * dilation) and (
                mode == "zeros" or padding < min(spatial)):
            return dataclasses.replace(g, output_shape=(batch, out_channels, *out))


@dataclasses.dataclass
class Generated:
    """A generated model file: its source, and the producer and forms it draws (the fuzz test's coverage)."""
    seed: int
    source: str
    producer: str
    forms: list[str]


def _producer_lines(rng: random.Random, p: Producer, g: Geometry) -> tuple[list[str], str]:
    """The convolution's ``__init__`` lines and its forward expression: a module, or ``F.conv*d`` on parameters."""
    k, s, pad, dil, grp = g.kernel, g.stride, g.padding, g.dilation, g.groups
    if rng.random() < 0.75 or g.padding_mode != "zeros":
        extra = f", output_padding={g.output_padding}" if p.transposed else ""
        extra += f", padding_mode={g.padding_mode!r}" if g.padding_mode != "zeros" else ""
        init = [f"self.conv = {p.module}({g.in_channels}, {g.out_channels}, {k}, stride={s}, padding={pad!r}{extra}, "
                f"groups={grp}, bias={g.bias}, dilation={dil})"]
        return init, "self.conv(x)"
    kernel = ", ".join([str(k)] * p.dims)
    weight = (f"({g.in_channels}, {g.out_channels // grp}, {kernel})" if p.transposed
              else f"({g.out_channels}, {g.in_channels // grp}, {kernel})")
    init = [f"self.weight = nn.Parameter(torch.randn{weight} * 0.3)"]
    init.append(f"self.conv_bias = nn.Parameter(torch.randn({g.out_channels}))" if g.bias else "self.conv_bias = None")
    if p.transposed:
        call = (f"{p.function}(x, self.weight, self.conv_bias, stride={s}, padding={pad}, "
                f"output_padding={g.output_padding}, groups={grp}, dilation={dil})")
    else:
        call = f"{p.function}(x, self.weight, self.conv_bias, {s}, {pad!r}, {dil}, {grp})"
    return init, call


#: Seed s below STRIDE draws FORMS[s] and FORMS[s + STRIDE] among its ops (as the first two, in the order that
#: applies, its convolution drawn again until one does): those seeds draw every row. The others draw at random.
STRIDE = (len(FORMS) + 1) // 2


def _forced(seed: int) -> list[Form]:
    if seed >= STRIDE:
        return []
    return [FORMS[i] for i in (seed, seed + STRIDE) if i < len(FORMS)]


@dataclasses.dataclass
class _Op:
    """A drawn op: its row, its arguments, and the shape it reads."""
    form: Form
    args: dict[str, Any]
    shape: Shape


def _draw_ops(rng: random.Random, state: State, forced: list[Form], count: int) -> list[_Op] | None:
    """``count`` ops, the forced rows first, each drawn among the rows that apply to the value as it is then; None
    where a forced row does not apply."""
    ops: list[_Op] = []
    for i in range(count):
        fitting = [f for f in FORMS if NEEDS[f.needs](state)]
        if i < len(forced) and forced[i] not in fitting:
            return None
        form = forced[i] if i < len(forced) else rng.choice(fitting)
        args: dict[str, Any] = {}
        for name in form.args:
            args[name] = ARGS[name](rng, state, args)
        ops.append(_Op(form, args, state.shape))
        state.shape = SHAPES[form.shape](state.shape, args)
    return ops


def _draw(rng: random.Random, seed: int) -> tuple[Producer, Geometry, State, list[_Op]]:
    """The convolution and the ops of a seed: drawn again until the seed's forced rows apply (STRIDE)."""
    forced = _forced(seed)
    for attempt in range(1000):
        p = rng.choice(PRODUCERS)
        g = _geometry(rng, p)
        training = rng.random() < 0.5
        alias = rng.random() < 0.3
        count = rng.randint(max(1, len(forced)), 6)
        order = forced if attempt % 2 == 0 else forced[::-1]
        ops = _draw_ops(rng, State(g.output_shape, g.output_shape, training, alias), order, count)
        if ops is not None:
            return p, g, State(g.output_shape, g.output_shape, training, alias), ops
    raise AssertionError(f"seed {seed}: no convolution takes the rows {[f.name for f in forced]}")


def generate(seed: int) -> Generated:
    """The model file of a seed: a convolution and 1 to 6 ops (_draw), as a KernelBench-style source."""
    rng = random.Random(seed)
    p, g, state, ops = _draw(rng, seed)
    init, conv = _producer_lines(rng, p, g)
    setup: list[str] = []
    forward: list[str] = [f"x = {conv}"]
    inputs: list[tuple[str, Shape]] = []
    for i, op in enumerate(ops):
        form = op.form
        names = {"m": f"m{i}", "p": f"p{i}", "y": f"y{i}"}
        fill = {**{k: str(v) for k, v in op.args.items()}, **names}
        if form.init.startswith("self."):
            init.append(form.init.format(**fill))
        elif form.init:
            init.append(f"self.{names['p' if form.init.startswith('nn.Parameter') else 'm']} = "
                        f"{form.init.format(**fill)}")
        if form.input:
            inputs.append((names["y"], INPUTS[form.input](op.shape)))
        setup += [line.format(**fill) for line in form.setup]
        statement = form.expr.format(**fill)
        forward.append(statement if re.match(r"x [-+*/]= ", statement) else f"x = {statement}")
    returns_r = rng.random() < 0.15  # the convolution's output returned beside the chain's: return x, r
    if returns_r or any(op.form.needs == "residual" for op in ops):
        spellings = ("r = x",) if state.alias else ("r = x.clone().detach()", "r = x.clone()")
        forward.insert(1, rng.choice(spellings))
    mode = "        self.eval()\n" if not state.training else ""
    body = "\n".join(f"        {line}" for line in init)
    if setup:
        body += "\n        with torch.no_grad():\n" + "\n".join(f"            {line}" for line in setup)
    chain = " -> ".join([p.name, *(op.form.name for op in ops)])
    arguments = ", ".join(["x", *(name for name, _ in inputs)])
    tensors = ", ".join(f"torch.randn{shape}" for shape in [g.input_shape, *(s for _, s in inputs)])
    source = f"""\"\"\"Fuzz model, seed {seed} ({'training' if state.training else 'eval'} mode): {chain}.\"\"\"
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{body}
{mode}
    def forward(self, {arguments}):
{chr(10).join(f"        {line}" for line in forward)}
        return {"x, r" if returns_r else "x"}


def get_inputs():
    return [{tensors}]


def get_init_inputs():
    return []
"""
    return Generated(seed, source, p.name, [op.form.name for op in ops])


if __name__ == "__main__":  # python tests/model_fuzz.py SEED: the model file of a seed, to run or import again
    import sys

    print(generate(int(sys.argv[1])).source, end="")
