"""The element types a config may name, as data: how each is spelt in the kernels and the generated model.

Every tensor of the model (input, weights, parameters, the norm's affine parameters and running
statistics, the convolution's output and the model's) is in the config's dtype; the kernels widen
what they load to float, compute in float (statistics in float and double, as at float32) and round
what they store back to the dtype, to nearest even as PyTorch does. Their own workspace (statistics
partials, the norm's per-plane map, plane partials) stays float.
"""
from __future__ import annotations

import dataclasses

#: A config's dtype where it names none: eager PyTorch's own, and the one dtype whose convolution has a
#: choice of precision (TF32 or float32 products: config.PRECISIONS).
DEFAULT_DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class Dtype:
    name: str  # the config's spelling
    torch: str  # torch.<torch> in the generated model
    ft: str  # the element type the kernels' pointers have: float, or the ft_t wrapper (templates/common.cuh.j2)
    ft4: str  # four of them, loaded at once (float4: 16 bytes; ft_t4: 8)
    storage: str  # the CUDA type ft_t wraps ("" for float)
    header: str  # the CUDA header that declares it
    to_float: str  # its conversion to float, and back (round to nearest even)
    from_float: str
    bytes: int
    #: Its largest finite value (torch.finfo(...).max): nan_to_num's default for +inf, as PyTorch's at the dtype.
    #: Required: each row states its own, so a new row cannot take another dtype's.
    largest: float
    pair: str = ""  # two of them in one 4-byte word (CUDA's __half2, __nv_bfloat162): a paired load
    pair_to_float: str = ""  # its conversion to float2
    #: Its PTX type in the tensor cores' mma.sync m16n8k16 (f32 accumulation), "" for float32, whose
    #: tensor-core products are TF32 (m16n8k8) or float32 (config.PRECISIONS).
    mma: str = ""


DTYPES: dict[str, Dtype] = {
    "float32": Dtype("float32", "float32", "float", "float4", "", "", "", "", 4, largest=3.4028234663852886e+38),
    "float16": Dtype("float16", "float16", "ft_t", "ft_t4", "__half", "cuda_fp16.h",
                     "__half2float", "__float2half_rn", 2, largest=65504.0,
                     pair="__half2", pair_to_float="__half22float2", mma="f16"),
    "bfloat16": Dtype("bfloat16", "bfloat16", "ft_t", "ft_t4", "__nv_bfloat16", "cuda_bf16.h",
                      "__bfloat162float", "__float2bfloat16_rn", 2, largest=3.3895313892515355e+38,
                      pair="__nv_bfloat162", pair_to_float="__bfloat1622float2", mma="bf16"),
}

#: Other spellings of the dtypes above, as PyTorch (``torch.half``, ``torch.float``), NumPy and mixed-precision
#: habit (``fp16``, ``bf16``) write them: a config that uses one is refused with the name to write instead, since
#: a config names each dtype one way (it is part of every cache key). float64 (``double``) has no kernels: not here.
ALIASES: dict[str, str] = {
    "fp32": "float32", "f32": "float32", "float": "float32", "single": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat": "bfloat16",
}


def alias_of(word: object) -> str | None:
    """The dtype name that ``word`` is another spelling of (``fp16`` -> ``float16``), None where it is none.

    Compared without case and a ``torch.`` prefix, as a user copies ``torch.half`` from a model."""
    folded = str(word).strip().lower().removeprefix("torch.")
    if folded in DTYPES:
        return folded
    return ALIASES.get(folded)
