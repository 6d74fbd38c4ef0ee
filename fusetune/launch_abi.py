"""What model.py's ``_launch`` and binding.cpp's ``launch`` agree on, as data: the addresses in their order, and
the status codes. Both templates render from these tables (and args.h the launchers' own status), so the order a
tensor is passed in and the field it lands in are spelled once.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Slot:
    """One address ``launch`` takes, and the ``FtArgs`` field it fills."""

    name: str  # the FtArgs field
    source: str  # what _launch passes there: one of its arguments (norm: the 4-tuple, by index)
    what: str  # how _launch's error names the tensor
    element: str = "dtype"  # "dtype": the config's element type; "float": the kernels' float32 workspace
    const: bool = True  # the kernels only read it
    #: The launch layout in which the slot holds float32 words instead of the dtype (2: gemm_store's y, halves
    #: in words; 3: the spectral world's input spectrum in x, its weights widened to float32 in weight), or None.
    words_in_layout: int | None = None

    @property
    def enum(self) -> str:
        return f"FT_{self.name.upper()}"


#: The addresses, in the order launch reads them; the learnable parameters follow, by slot (FT_MAX_PARAMS).
SLOTS: tuple[Slot, ...] = (
    Slot("y", "y", "y", words_in_layout=2),
    Slot("out", "out", "out", const=False),
    Slot("partials", "partials", "partials", element="float", const=False),
    Slot("ab", "ab", "ab", element="float", const=False),
    Slot("stats", "stats", "stats", element="float", const=False),
    Slot("bias", "bias", "the producer's bias"),
    Slot("x", "x", "x", words_in_layout=3),
    Slot("weight", "weight", "weight", words_in_layout=3),
    Slot("extra", "extra", "extra"),
    Slot("norm_weight", "norm[0]", "the norm's weight"),
    Slot("norm_bias", "norm[1]", "the norm's bias"),
    Slot("running_mean", "norm[2]", "the norm's running mean", const=False),
    Slot("running_var", "norm[3]", "the norm's running variance", const=False),
    #: The spectral world's weights' spectrum (layout 3): a buffer the model keeps between forwards, which the
    #: launcher fills from the raw weights where it is given them (weight), and only reads where not.
    Slot("weight_spectrum", "weight_spectrum", "the weights' spectrum", element="float", const=False),
)

#: launch's status codes beside CUDA's own (positive) error codes; FT_TOO_BIG is the launchers' (args.h): a shape
#: needs more of the GPU than the variant can take (shared memory a block, blocks a cluster).
STATUSES: dict[str, int] = {"FT_OK": 0, "FT_NO_VARIANT": -1, "FT_BAD_ARGS": -3, "FT_BAD_STAGE": -4, "FT_TOO_BIG": -5}
