"""The op vocabulary: one entry per op name a config may use."""
from __future__ import annotations

from fusetune.ops.base import Op, OpContext, ParamDecl, Shape
from fusetune.ops.elementwise import Add, Clamp, Div, Elementwise, Mul, Relu
from fusetune.ops.norm import BatchNorm, GroupNorm, InstanceNorm, Norm
from fusetune.ops.pool import AvgPool, MaxPool, Pool
from fusetune.ops.reduce import AdaptiveAvgPool, DimReduce, Reduce

#: Config op name -> class. Adding an op is one class and one line here.
REGISTRY: dict[str, type[Op]] = {
    "mul": Mul,
    "div": Div,
    "add": Add,
    "clamp": Clamp,
    "relu": Relu,
    "batch_norm": BatchNorm,
    "group_norm": GroupNorm,
    "instance_norm": InstanceNorm,
    "max_pool": MaxPool,
    "avg_pool": AvgPool,
    "adaptive_avg_pool": AdaptiveAvgPool,
    "max": DimReduce,
    "min": DimReduce,
    "sum": DimReduce,
    "mean": DimReduce,
}

__all__ = ["REGISTRY", "Op", "OpContext", "ParamDecl", "Shape", "Elementwise", "Norm", "Pool", "Reduce",
           "Add", "Clamp", "Div", "Mul", "Relu", "BatchNorm", "GroupNorm", "InstanceNorm",
           "MaxPool", "AvgPool", "AdaptiveAvgPool", "DimReduce"]
