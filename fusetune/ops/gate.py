"""Gated activations: ``F.glu(x, dim)`` and the products of two halves that models write by hand.

A gated linear unit splits its input in two halves along ``dim`` and multiplies the first (the value) by a
function of the second (the gate): out[:, c] = f(x[:, c]) * g(x[:, c + C/2]) over the channels, C/2 of them after
it. ``F.glu`` is f the identity and g the sigmoid (Conformer's convolution module, fairseq's convolutional
models); WaveNet's gated activation is tanh(a) * sigmoid(b); ReGLU's a * relu(b). The op keeps PyTorch's name and
argument (``glu``, ``dim``, whose default is PyTorch's -1) and takes the two functions as data (``activation``,
``gate``: rows of ``GATE_FUNCTIONS``).

No kernel family reads both channels of a pair (a value and its gate are C/2 channels apart: every family maps a
position's values one channel at a time, and channel_softmax's pass folds them into one accumulator), so the
planner ends a region before it (``role`` "gate", plan._ROLE_REFUSALS): it runs in PyTorch between the first
region and a later one, which reads the tensor of C/2 channels it writes (fusetune/pipeline.py), per-channel
parameters after it holding C/2 values (config.py sizes a parameter by the channels where it is read).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.activations import UNARY
from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_int

#: The functions a half may go through, by their vocabulary names: the parameter-free activations (UNARY's
#: PyTorch forms) and relu. ``{x}`` is the half.
GATE_FUNCTIONS: dict[str, str] = {**{name: facts.torch for name, facts in UNARY.items()}, "relu": "torch.relu({x})"}
#: F.glu's gate; its value goes through nothing.
GLU_GATE = "sigmoid"


def _take_function(raw: Mapping[str, Any], key: str, ctx: OpContext, default: str | None) -> str | None:
    value = raw.get(key, default)
    if value is not None and value not in GATE_FUNCTIONS:
        raise ctx.error(key, f"expected one of {', '.join(sorted(GATE_FUNCTIONS))} (a parameter-free activation), "
                             f"got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Glu(Op):
    """``F.glu(x, dim)``, and with ``activation`` / ``gate`` the gated products of the two halves of ``dim``
    (``activation``: the function of the first half, none by default; ``gate``: of the second, sigmoid by
    default). ``dim`` is stored non-negative; its size must be even, as PyTorch requires."""

    kind: ClassVar[str] = "glu"
    role: ClassVar[str] = "gate"
    dim: int = -1
    activation: str | None = None
    gate: str = GLU_GATE

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["dim", "activation", "gate"], ctx)
        rank = len(ctx.in_shape)
        dim = take_int(raw, "dim", ctx, default=-1)
        if not -rank <= dim < rank:
            raise ctx.error("dim", f"expected a dim in [{-rank}, {rank - 1}] for an input of rank {rank}, got {dim}")
        gate = _take_function(raw, "gate", ctx, GLU_GATE)
        if gate is None:
            raise ctx.error("gate", "expected the gate's function (sigmoid for F.glu), got null")
        return cls(dim=dim % rank, activation=_take_function(raw, "activation", ctx, None), gate=gate)

    def check_shape(self, shape: Shape, ctx_error) -> None:
        if shape[self.dim] % 2:
            ctx_error("dim", f"glu halves dim {self.dim}, whose size {shape[self.dim]} is odd (input "
                             f"{list(shape)}); PyTorch refuses it")

    def out_shape(self, shape: Shape) -> Shape:
        return tuple(s // 2 if i == self.dim else s for i, s in enumerate(shape))

    @property
    def is_glu(self) -> bool:
        """Whether it is F.glu itself: the value as it is, times the sigmoid of the gate."""
        return self.activation is None and self.gate == GLU_GATE

    def halves_channels(self) -> bool:
        """Whether it halves the channel dim: the chain goes on at C/2 channels."""
        return self.dim == 1

    def forward_code(self, x: str, attr: str | None) -> str:
        if self.is_glu:
            return f"F.glu({x}, dim={self.dim})"
        value = GATE_FUNCTIONS[self.activation].format(x="_a") if self.activation else "_a"
        gate = GATE_FUNCTIONS[self.gate].format(x="_b")
        return f"(lambda _a, _b: {value} * {gate})(*{x}.chunk(2, dim={self.dim}))"
