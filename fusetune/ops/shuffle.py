"""``F.pixel_shuffle(x, upscale_factor)`` (``nn.PixelShuffle``): the sub-pixel upsampler of super-resolution models
(ESPCN, EDSR's and SRResNet's upsamplers, Real-ESRGAN), written ``conv -> pixel_shuffle(r) -> activation``.

It moves each value to another channel and position, nothing more: out[n, c, h*r + i, w*r + j] =
in[n, c*r*r + i*r + j, h, w], so that C channels become C / r^2 of r times the height and width. PyTorch's
pixel_shuffle takes a 4-D input (or more: its last three dims), so the op follows a 2-D convolution only.

No kernel family writes a value to another channel's plane, so the planner ends a region before it (``role``
"shuffle", plan._ROLE_REFUSALS): PyTorch runs the permutation copy between regions, as it runs a glu. Before that,
the rule regions.shuffle_commutes moves the pointwise ops after it in front of it (the same values either way, each
read at the channel it came from: a per-channel parameter of C / r^2 values repeated r^2 times, a scalar as it is),
so that the convolution's own region takes them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from fusetune.ops.base import Op, OpContext, Shape, reject_unknown, take_int

#: The rank of the input the op takes: (N, C, H, W), a 2-D convolution's output.
SHUFFLE_RANK = 4


@dataclasses.dataclass(frozen=True)
class PixelShuffle(Op):
    """``F.pixel_shuffle(x, upscale_factor)`` on an (N, C, H, W) input whose C is a multiple of upscale_factor^2."""

    kind: ClassVar[str] = "pixel_shuffle"
    role: ClassVar[str] = "shuffle"
    upscale_factor: int = 1

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: OpContext) -> "Op":
        reject_unknown(raw, ["upscale_factor"], ctx)
        if len(ctx.in_shape) != SHUFFLE_RANK:
            raise ctx.error("op", f"pixel_shuffle takes an (N, C, H, W) input, a 2-D convolution's output; here it "
                                  f"is {list(ctx.in_shape)}, of rank {len(ctx.in_shape)}")
        return cls(upscale_factor=take_int(raw, "upscale_factor", ctx, minimum=1))

    @property
    def block(self) -> int:
        """The channels that become one channel's r x r block of positions: upscale_factor^2."""
        return self.upscale_factor * self.upscale_factor

    def check_shape(self, shape: Shape, ctx_error) -> None:
        if shape[1] % self.block:
            ctx_error("upscale_factor", f"pixel_shuffle with upscale_factor {self.upscale_factor} needs channels "
                                        f"divisible by {self.upscale_factor}^2 = {self.block}; its input "
                                        f"{list(shape)} has {shape[1]} (PyTorch refuses it)")

    def out_shape(self, shape: Shape) -> Shape:
        n, c, h, w = shape
        r = self.upscale_factor
        return (n, c // self.block, h * r, w * r)

    def forward_code(self, x: str, attr: str | None) -> str:
        return f"F.pixel_shuffle({x}, {self.upscale_factor})"
