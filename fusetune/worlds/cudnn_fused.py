"""cudnn_fused: the chain folded into the convolution, which cuDNN runs with its own fused epilogue.

Why: the chain an inference model most often puts after a convolution is an eval-mode batch norm, maybe a
residual add, and a relu (ResNet's conv-bn-relu and conv-bn-add-relu). Eval batch norm and the per-channel
scales and shifts around it are one affine map per channel, s * y + t: folded into the weights (w * s) and the
bias (b * s + t), they cost nothing on the output. What is left, the residual add and the relu, cuDNN applies
in the convolution's own epilogue (torch.cudnn_convolution_relu, torch.cudnn_convolution_add_relu): the output
is written once and never read again, where every other world writes the convolution's output and then reads
it back (cuDNN's world), or computes the convolution in kernels slower than cuDNN's at wide channel counts.

The fold is computed from the model's tensors as they are, in float32, and kept until one of them changes: the
generated model compares each source's address and version counter at every call (an in-place update, as
``load_state_dict`` makes, bumps the version), and a CUDA graph of the optimized model is keyed by the same
versions (fusetune/graphs.py), so a replay never runs a stale fold."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusetune.dtypes import DTYPES
from fusetune.ops import Add, BatchNorm, Div, Mul, Relu, Sub
from fusetune.worlds.base import World

if TYPE_CHECKING:
    from fusetune.plan import Plan

#: The per-channel affine ops the fold takes, by the op the generated model applies to the scale and shift.
AFFINE_OPS = {Mul: "mul", Div: "div", Add: "add", Sub: "sub"}


class CudnnFused(World):
    name = "cudnn_fused"
    doc = ("cuDNN's fused convolution: an eval batch norm and the per-channel scales and shifts folded into the "
           "weights and bias (kept until a tensor they come from changes), the residual add and the relu in "
           "cuDNN's epilogue (torch.cudnn_convolution_relu, cudnn_convolution_add_relu): no pass over the output")
    computes_conv_inside = False
    dtypes = tuple(DTYPES)  # cuDNN convolves at the dtype; the fold is computed in float32
    launch = "folded"
    later_regions = False
    later_refusal = "a later region: there is no convolution to fold its chain into"

    def why_not(self, plan: Plan) -> str | None:
        return fold_refusal(plan)

    def stages(self, plan: Plan) -> tuple[str, ...]:
        return ()

    def facts(self, plan: Plan) -> dict[str, Any]:
        return {"foldable": fold_refusal(plan) is None}  # producer.layout varies under this world where it is

    def launch_data(self, plan: Plan) -> dict[str, Any]:
        return {"fold": fold_table(plan)}


def fold_refusal(plan: Plan) -> str | None:
    """Why the region's chain does not fold into its convolution, None where it does: a plain (not
    transposed) convolution (a 1-D one runs as the 2-D one of height 1 it is), zero padding, then per-channel affine ops and eval batch norms, then at
    most a residual add of an input of the chain's shape, then at most a relu, and nothing else."""
    producer = plan.spec.producer
    if producer.transposed:
        return "cuDNN's fused convolution takes plain (not transposed) convolutions"
    if producer.padding_mode != "zeros" or producer.asymmetric:
        return "cuDNN's fused convolution pads with zeros, the same amount on both sides"
    if plan.pool is not None or plan.reduce is not None or plan.channel_map is not None:
        return "a pool or a reduction: only a per-channel affine chain, a residual add and a relu fold"
    ops = [step.op for step in plan.head]
    if not ops:
        return "no op after the convolution in this region: nothing to fold into it or fuse after it"
    if plan.param_repeats or plan.norm_repeat > 1:
        return ("a per-channel parameter or a batch norm read repeated (moved before a pixel shuffle): the fold "
                "scales the convolution's channels by the model's tensors as they are")
    i = 0
    while i < len(ops) and _affine(ops[i]):
        i += 1
    if i < len(ops) and isinstance(ops[i], Add) and ops[i].reads_input() is not None:
        if ops[i].reads_input() in dict(plan.spec.input_kinds):
            return "a residual add of a broadcast input (cuDNN adds one of the output's shape)"
        i += 1
    if i < len(ops) and isinstance(ops[i], Relu):
        i += 1
    if i < len(ops) and isinstance(ops[i], BatchNorm) and ops[i].training:
        return "a batch norm in training mode: its statistics are the batch's, not constants to fold"
    if i < len(ops):
        return (f"{ops[i].kind}: only per-channel scales and shifts, eval batch norms, then a residual add and a "
                "relu fold into cuDNN's fused convolution")
    return None


def _affine(op: Any) -> bool:
    """Whether an op is a per-channel affine map the fold takes: an eval-mode batch norm, or mul, div, add or sub
    by a number or a parameter (not by the convolution's output, not by an input)."""
    if isinstance(op, BatchNorm):
        return not op.training
    return type(op) in AFFINE_OPS and not op.uses_producer() and op.reads_input() is None


def fold_table(plan: Plan) -> dict[str, Any] | None:
    """What the generated model folds and runs (None where the world does not take the region): the affine
    ops in order (a batch norm by its attribute, eps and affine; the others by parameter or number), the
    residual input's name, whether a relu ends the chain, and the convolution's geometry."""
    if fold_refusal(plan) is not None:
        return None
    producer = plan.spec.producer
    ops: list[dict[str, Any]] = []
    residual, relu = None, False
    for step in plan.head:
        op = step.op
        if isinstance(op, BatchNorm):
            ops.append({"op": "batch_norm", "attr": step.attr, "eps": op.eps})
        elif isinstance(op, Relu):
            relu = True
        elif op.reads_input() is not None:
            residual = op.reads_input()
        else:
            ops.append({"op": AFFINE_OPS[type(op)], "param": op.param, "scalar": op.scalar})
    dims = producer.spatial_dims
    lift = dims == 1  # cuDNN's fused ops take 4-D and 5-D tensors: a 1-D convolution is a 2-D one of height 1
    geometry = {"stride": list(producer.stride), "padding": list(producer.padding),
                "dilation": list(producer.dilation or (1,) * dims)}
    if lift:
        geometry = {"stride": [1, *geometry["stride"]], "padding": [0, *geometry["padding"]],
                    "dilation": [1, *geometry["dilation"]]}
    return {"ops": ops, "residual": residual, "relu": relu, **geometry, "groups": producer.groups,
            "bias": producer.bias, "lift": lift}
