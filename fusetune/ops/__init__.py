"""The op vocabulary: one entry per op name a config may use."""
from __future__ import annotations

from fusetune.ops.base import Op, OpContext, ParamDecl, Shape
from fusetune.ops.activations import (Abs, Celu, Elu, Exp, Gelu, Hardsigmoid, Hardswish, Hardtanh, LeakyRelu, Log,
                                      Mish, Neg, Relu6, Selu, Sigmoid, Silu, Softplus, Sqrt, Tanh)
from fusetune.ops.elementwise import Add, Clamp, Div, Elementwise, Maximum, Minimum, Mul, Pow, Prelu, Relu, Sub
from fusetune.ops.channel import ChannelLayerNorm, ChannelNorm, Normalize
from fusetune.ops.dropout import Dropout
from fusetune.ops.gate import Glu
from fusetune.ops.slicing import Slice
from fusetune.ops.norm import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, MeanCentre, Norm
from fusetune.ops.pool import AvgPool, MaxPool, Pool
from fusetune.ops.reduce import (REDUCE_MODES, AdaptiveAvgPool, AdaptiveMaxPool, AdaptivePool, DimReduce, Flatten,
                                 LogSoftmax, Reduce, SoftmaxOp, SpatialReduce, Squeeze, Unflatten,
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
    "batch_norm": BatchNorm,
    "group_norm": GroupNorm,
    "instance_norm": InstanceNorm,
    "layer_norm": LayerNorm,
    "max_pool": MaxPool,
    "avg_pool": AvgPool,
    "adaptive_avg_pool": AdaptiveAvgPool,
    "adaptive_max_pool": AdaptiveMaxPool,
    **{mode: DimReduce for mode in REDUCE_MODES},
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
    "slice": Slice,
}

__all__ = ["REGISTRY", "Op", "OpContext", "ParamDecl", "Shape", "Elementwise", "Norm", "Pool", "Reduce",
           "Add", "Clamp", "Div", "Mul", "Relu", "BatchNorm", "GroupNorm", "InstanceNorm",
           "MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "AdaptivePool", "DimReduce", "Dropout",
           "Flatten", "LayerNorm", "LogSoftmax", "MeanCentre", "SoftmaxOp", "SpatialReduce", "Squeeze", "Unflatten", "Unsqueeze", "View",
           "ChannelLayerNorm", "ChannelNorm", "Normalize", "Glu", "Slice"]
