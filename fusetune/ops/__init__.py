"""The op vocabulary: one entry per op name a config may use."""
from __future__ import annotations

from fusetune.ops.base import Op, OpContext, ParamDecl, Shape
from fusetune.ops.activations import (Abs, Ceil, Celu, Cos, Elu, Erf, Erfc, Exp, Exp2, Expm1, Floor, Gelu, Hardshrink,
                                      Hardsigmoid, Hardswish, Hardtanh, LeakyRelu, Log, Log1p, Log2, Log10,
                                      Logsigmoid, Mish, NanToNum, Neg, Reciprocal, Relu6, Round, Rsqrt, Selu,
                                      Sigmoid, Sign, Silu, Sin, Softplus, Softshrink, Softsign, Sqrt, Square, Tanh,
                                      Tanhshrink, Threshold, Trunc)
from fusetune.ops.expression import Expression
from fusetune.ops.elementwise import Add, Clamp, Div, Elementwise, Maximum, Minimum, Mul, Pow, Prelu, Relu, Sub
from fusetune.ops.channel import ChannelLayerNorm, ChannelNorm, Normalize
from fusetune.ops.dropout import Dropout
from fusetune.ops.gate import Glu
from fusetune.ops.shuffle import PixelShuffle
from fusetune.ops.slicing import Slice
from fusetune.ops.norm import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, MeanCentre, Norm
from fusetune.ops.pool import AvgPool, MaxPool, Pool
from fusetune.ops.reduce import (REDUCE_MODES, SPREAD_MODES, AdaptiveAvgPool, AdaptiveMaxPool, AdaptivePool, DimReduce,
                                 Flatten, LogSoftmax, Reduce, SoftmaxOp, SpatialReduce, Spread, Squeeze, Unflatten,
                                 Unsqueeze, View)

#: Config op name -> class. Adding an op is one class and one line here.
REGISTRY: dict[str, type[Op]] = {
    "mul": Mul,
    "div": Div,
    "add": Add,
    "clamp": Clamp,
    "relu": Relu,
    "sub": Sub,
    "minimum": Minimum,
    "maximum": Maximum,
    "pow": Pow,
    "prelu": Prelu,
    "relu6": Relu6,
    "leaky_relu": LeakyRelu,
    "elu": Elu,
    "selu": Selu,
    "celu": Celu,
    "gelu": Gelu,
    "silu": Silu,
    "mish": Mish,
    "softplus": Softplus,
    "sigmoid": Sigmoid,
    "hardsigmoid": Hardsigmoid,
    "hardswish": Hardswish,
    "hardtanh": Hardtanh,
    "tanh": Tanh,
    "exp": Exp,
    "log": Log,
    "abs": Abs,
    "neg": Neg,
    "sqrt": Sqrt,
    "logsigmoid": Logsigmoid,
    "softsign": Softsign,
    "tanhshrink": Tanhshrink,
    "hardshrink": Hardshrink,
    "softshrink": Softshrink,
    "threshold": Threshold,
    "erf": Erf,
    "erfc": Erfc,
    "log1p": Log1p,
    "expm1": Expm1,
    "log2": Log2,
    "log10": Log10,
    "exp2": Exp2,
    "sin": Sin,
    "cos": Cos,
    "sign": Sign,
    "reciprocal": Reciprocal,
    "rsqrt": Rsqrt,
    "square": Square,
    "floor": Floor,
    "ceil": Ceil,
    "round": Round,
    "trunc": Trunc,
    "nan_to_num": NanToNum,
    "expression": Expression,
    "batch_norm": BatchNorm,
    "group_norm": GroupNorm,
    "instance_norm": InstanceNorm,
    "layer_norm": LayerNorm,
    "max_pool": MaxPool,
    "avg_pool": AvgPool,
    "adaptive_avg_pool": AdaptiveAvgPool,
    "adaptive_max_pool": AdaptiveMaxPool,
    **{mode: DimReduce for mode in REDUCE_MODES},
    **{mode: Spread for mode in SPREAD_MODES},
    "softmax": SoftmaxOp,
    "log_softmax": LogSoftmax,
    "normalize": Normalize,
    "channel_layer_norm": ChannelLayerNorm,
    "flatten": Flatten,
    "unflatten": Unflatten,
    "squeeze": Squeeze,
    "unsqueeze": Unsqueeze,
    "dropout": Dropout,
    "glu": Glu,
    "pixel_shuffle": PixelShuffle,
    "slice": Slice,
}

#: PyTorch's other names of REGISTRY ops, each a torch function and a Tensor method (torch.fix(x), x.sgn(), torch.clip,
#: x.multiply(y); sgn is sign on real values): name -> the op. The importer reads each as its op's own function or
#: method (importer.table.TABLE).
TORCH_ALIASES: dict[str, str] = {"fix": "trunc", "sgn": "sign", "absolute": "abs", "negative": "neg", "clip": "clamp",
                                 "multiply": "mul", "subtract": "sub", "divide": "div", "true_divide": "div"}
#: torch.special's names of REGISTRY ops (an erf GELU written with torch.special.erf): name -> the op. The importer
#: reads each as the op's torch function (importer.table.TABLE, its pointwise regions); torch.special.round is round's own
#: row (its decimals).
SPECIAL_NAMES: dict[str, str] = {"erf": "erf", "erfc": "erfc", "log1p": "log1p", "expm1": "expm1", "exp2": "exp2",
                                 "expit": "sigmoid"}
#: All of PyTorch's other names of REGISTRY ops: a config names each op once, by its REGISTRY name, and an unknown op
#: that is one of these is told which (config.py).
ALIASES: dict[str, str] = {**TORCH_ALIASES, **{name: op for name, op in SPECIAL_NAMES.items() if name != op}}

__all__ = ["REGISTRY", "ALIASES", "TORCH_ALIASES", "SPECIAL_NAMES", "Op", "OpContext", "ParamDecl", "Shape", "Elementwise", "Norm", "Pool", "Reduce",
           "Add", "Clamp", "Div", "Mul", "Relu", "BatchNorm", "GroupNorm", "InstanceNorm",
           "MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "AdaptivePool", "DimReduce", "Dropout",
           "Flatten", "LayerNorm", "LogSoftmax", "MeanCentre", "SoftmaxOp", "SpatialReduce", "Spread", "Squeeze", "Unflatten", "Unsqueeze", "View",
           "ChannelLayerNorm", "ChannelNorm", "Normalize", "Glu", "PixelShuffle", "Slice"]
