"""The contract every op of the vocabulary fulfils.

An op is a small frozen value built from one config entry. It knows:
  * its PyTorch reference semantics, as Python source for a generated module
    (``module_code`` builds any submodule, ``forward_code`` applies it);
  * its shape rule (``out_shape``);
  * its role for the planner (``role``) and, where it is elementwise, its CUDA fragment.
Ops are registered explicitly in ``fusetune.ops.REGISTRY``: one line per op.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, ClassVar, Mapping, Sequence

import yaml

from fusetune.dtypes import DEFAULT_DTYPE
from fusetune.errors import ConfigError, did_you_mean

Shape = tuple[int, ...]

#: Roles the planner understands. Elementwise ops map one value to one value (optionally
#: per channel); norms need statistics; pools shrink spatial windows; reductions drop a dim.
ROLES = ("elementwise", "norm", "pool", "reduce")


@dataclasses.dataclass(frozen=True)
class OpContext:
    """What an op may consult while it is parsed: where it sits and what feeds it."""

    path: str  # config file, for error messages
    key: str  # key path of this op, e.g. "epilogue[2]"
    in_shape: Shape  # shape of the op's input for the config's first shape
    spatial_dims: int  # 2 for Conv2d, 3 for Conv3d / ConvTranspose3d
    parameters: Mapping[str, "ParamDecl"]  # named learnable tensors of the config
    #: The config's extra input tensors (``inputs:``), which a binary op may read by name (``by: NAME``).
    inputs: tuple[str, ...] = ()
    #: The element type of the op's input: the config's, or what an op before it made it (Op.out_dtype).
    dtype: str = DEFAULT_DTYPE

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.path, f"{self.key}.{key}" if key else self.key, message)


@dataclasses.dataclass(frozen=True)
class ParamDecl:
    """A named learnable tensor, as a model would declare it: of shape (C, 1, ..., 1) (``per_channel``: one value
    per channel of the convolution), or a single value (``scalar``: 0-dim, which broadcasts against any value
    without changing its shape, so that it applies after the channels are reduced away too; a user's (1, 1, 1)
    binds to it as a view, importer.declared_view)."""

    name: str
    init: str  # "ones" | "zeros" | "randn"
    shape: str = "per_channel"  # or "scalar"

    @property
    def scalar(self) -> bool:
        return self.shape == "scalar"

    def module_code(self, channels: int, spatial_dims: int) -> str:
        if self.scalar:
            return f"nn.Parameter(torch.{self.init}(()))"
        shape = ", ".join([str(channels)] + ["1"] * spatial_dims)
        return f"nn.Parameter(torch.{self.init}({shape}))"

    def canonical(self) -> dict[str, str]:
        """For cache keys: ``shape`` left out where per_channel, so the keys from before it stay as they were."""
        out = dataclasses.asdict(self)
        if not self.scalar:
            del out["shape"]
        return out


class Op:
    """Base class; subclasses are frozen dataclasses with a ``kind`` class attribute."""

    kind: ClassVar[str]
    role: ClassVar[str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        raise NotImplementedError

    def out_shape(self, shape: Shape) -> Shape:
        return shape

    def out_dtype(self, dtype: str) -> str:
        """The element type of the op's output for an input of ``dtype``: the same, but where the op names
        its own (a softmax's ``dtype``)."""
        return dtype

    def check_shape(self, shape: Shape, ctx_error) -> None:
        """Raise through ``ctx_error(key, message)`` if the op cannot take ``shape``."""

    def module_code(self, channels: int, spatial_dims: int) -> str | None:
        """Python expression building this op's nn.Module, or None if it needs none."""
        return None

    def forward_code(self, x: str, attr: str | None) -> str:
        """Python expression applying the op to tensor expression ``x``."""
        raise NotImplementedError

    @property
    def config_name(self) -> str:
        """The op's name as a config writes it (its REGISTRY key): the planner's messages name a step by it."""
        return self.kind

    def uses_producer(self) -> bool:
        """Whether the op reads the convolution's own output (``by: producer``) beside its input."""
        return False

    def reads_input(self) -> str | None:
        """The config's extra input tensor (``inputs:``) the op reads at the element as an operand
        (``by: NAME``), None where it reads none."""
        return None

    def canonical(self) -> dict[str, Any]:
        """Everything that changes the op's result, for cache keys."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


def is_int(value: Any) -> bool:
    """An integer as YAML gives one: a bool is an int to Python, not a size or a dim to a config."""
    return isinstance(value, int) and not isinstance(value, bool)


#: A number in exponent form as Python reads one: sign, digits, an optional fraction, the exponent.
_EXPONENT = re.compile(r"(?P<sign>[-+]?)(?P<whole>[0-9_]*)(?:\.(?P<fraction>[0-9_]*))?"
                       r"[eE](?P<esign>[-+]?)(?P<exp>[0-9_]+)")


def number_text_hint(text: str) -> str:
    """Why a number arrived as text, for a message after ``got '...'``; "" where ``text`` is no number.

    Two causes, told apart by asking YAML itself how it reads ``text`` unquoted: a number it reads as one can only
    be text because it was quoted (``"0.1"``); one it reads as text is YAML 1.1's exponent without a decimal point
    or without the exponent's sign (``1e-5``, ``1.0e5``), and the hint spells it the way YAML reads a number
    (``1.0e-5``). Not a finite number (``inf``, ``nan``): no hint, as YAML's own spellings would be refused too."""
    text = text.strip()
    if not text.isascii():  # float() reads other scripts' digits too, which YAML never reads as a number
        return ""
    try:
        number = float(text)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    if isinstance(yaml.safe_load(text), (int, float)):
        return f" (a quoted number is text: write {text} without the quotes)"
    return (f" (YAML 1.1 reads an exponent without a decimal point or a signed exponent as text: "
            f"write {_yaml_number(text, number)})")


def _yaml_number(text: str, number: float) -> str:
    """``text`` (a number YAML reads as text) spelt so that YAML reads it as a number: the user's digits kept, with
    a decimal point and a signed exponent (``1e-5`` -> ``1.0e-5``)."""
    exponent = _EXPONENT.fullmatch(text)
    if exponent:
        spelt = (f"{exponent['sign']}{exponent['whole'] or '0'}.{exponent['fraction'] or '0'}"
                 f"e{exponent['esign'] or '+'}{exponent['exp']}")
        if isinstance(yaml.safe_load(spelt), float):
            return spelt
    return repr(number)


def take_number(raw: Mapping[str, Any], key: str, ctx: OpContext, *, default: Any = ...,
                positive: bool = False, allow_int_only: bool = False) -> float:
    """Read a number from an op entry, with a message naming the key on failure."""
    if key not in raw:
        if default is ...:
            raise ctx.error(key, "missing; expected a number")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = number_text_hint(value) if isinstance(value, str) else ""
        raise ctx.error(key, f"expected a number, got {value!r}{hint}")
    if allow_int_only and not isinstance(value, int):
        raise ctx.error(key, f"expected an integer, got {value!r}")
    if positive and not value > 0:
        raise ctx.error(key, f"expected a positive number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ctx.error(key, f"expected a finite number, got {value!r}")
    return value


def take_int(raw: Mapping[str, Any], key: str, ctx: OpContext, *, default: Any = ...,
             minimum: int | None = None) -> int:
    """Read an integer, rejecting bools and floats."""
    if key not in raw:
        if default is ...:
            raise ctx.error(key, "missing; expected an integer")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.error(key, f"expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ctx.error(key, f"expected an integer >= {minimum}, got {value}")
    return value


def take_bool(raw: Mapping[str, Any], key: str, ctx: OpContext, *, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ctx.error(key, f"expected true or false, got {value!r}")
    return value


def take_window(raw: Mapping[str, Any], key: str, ctx: OpContext, *, default: Any = ...,
                minimum: int = 1) -> tuple[int, ...]:
    """An int or a list of ints, one per spatial dim, each >= ``minimum`` (1: sizes, 0: paddings)."""
    what = f"{'a non-negative' if minimum == 0 else 'an'} integer or a list of {ctx.spatial_dims} integers"
    if key not in raw:
        if default is ...:
            raise ctx.error(key, f"missing; expected {what}")
        value = default
    else:
        value = raw[key]
    if is_int(value):
        values: Sequence[Any] = [value] * ctx.spatial_dims
    elif isinstance(value, list) and len(value) == ctx.spatial_dims:
        values = value
    else:
        raise ctx.error(key, f"expected {what}, got {value!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            expected = "positive integers" if minimum == 1 else what
            raise ctx.error(key, f"expected {expected}, got {value!r}")
    return tuple(values)


def reject_unknown(raw: Mapping[str, Any], allowed: Sequence[str], ctx: OpContext) -> None:
    """Unknown keys are typos more often than not: name them."""
    for key in raw:
        if key != "op" and key not in allowed:
            op = raw.get("op")
            if not allowed:
                raise ctx.error(str(key), f"unknown key for op '{op}': {op} takes no arguments (only the op key)")
            raise ctx.error(str(key), f"unknown key for op '{op}'{did_you_mean(key, allowed)} "
                                      f"(expected one of: {', '.join(sorted(allowed))})")
