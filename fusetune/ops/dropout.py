"""Dropout, which inference leaves out: the identity where p = 0 or in eval mode."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, reject_unknown, take_bool, take_number


@dataclasses.dataclass(frozen=True)
class Dropout(Op):
    """nn.Dropout(p) in eval mode (``training: false``) or with p = 0: the identity, which the planner
    drops (fusetune/regions.py). Training-mode dropout with p > 0 draws random masks, which no
    tuned kernel can reproduce or be verified against: it is refused with what to write instead."""

    kind: ClassVar[str] = "dropout"
    role: ClassVar[str] = "identity"
    p: float = 0.5
    training: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["p", "training"], ctx)
        p = float(take_number(raw, "p", ctx, default=0.5))
        if not 0 <= p <= 1:
            raise ctx.error("p", f"expected a probability in [0, 1], got {p}")
        training = take_bool(raw, "training", ctx, default=True)
        if training and p > 0:
            raise ctx.error("p", f"dropout with p = {p} in training mode zeroes random values, which no tuned "
                                 "kernel reproduces; for inference write training: false (nn.Dropout in eval "
                                 "mode is the identity), or p: 0")
        return cls(p=p, training=training)

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"F.dropout({x}, p={self.p!r}, training={self.training})"
