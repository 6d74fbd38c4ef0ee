"""gemm_cluster: the whole chain in one kernel on a Hopper thread-block cluster per sample."""
from __future__ import annotations

from fusetune.tiles import cluster_boxes
from fusetune.worlds.base import World
from fusetune.worlds.facts import (GEMM_DTYPES, GEMM_NATIVE_MMA, SAMPLE_SCOPES, gemm_elem, gemm_refusal,
                                   gemm_terms, windows_in_boxes)


class GemmCluster(World):
    name = "gemm_cluster"
    doc = ("one kernel per sample on a Hopper thread-block cluster: the convolution once on the tensor cores, "
           "kept in the cluster's shared memory while the blocks sum the norm's statistics, then the chain")
    computes_conv_inside = True
    tf32 = True
    dtypes = GEMM_DTYPES
    native_mma = GEMM_NATIVE_MMA
    min_sm = 90
    launch = "cluster"

    def why_not(self, plan):
        """The norm's statistics lie within a sample (instance or group norm), so a cluster of blocks per
        sample computes the convolution once, keeps every output in its blocks' shared memory, sums the
        statistics across the cluster through distributed shared memory, and applies the chain from
        there. For a channel reduction, or a map whose pooling windows lie whole in the boxes; a shape
        fits where a sample's output fits the cluster's shared memory (tiles.cluster_boxes)."""
        refusal = gemm_refusal(plan)
        if refusal is not None:
            return f"the tensor-core kernels do not take it: {refusal}"
        if not plan.needs_stats:
            return "no norm needs statistics (one cluster per sample holds a norm's)"
        if plan.norm.scope not in SAMPLE_SCOPES:
            what = "mean centring" if plan.norm.centres else plan.norm.kind
            return f"a {what}'s statistics span samples (one cluster per sample needs instance or group statistics)"
        if plan.family == "channel_reduce" or (plan.family == "window_map" and windows_in_boxes(plan)):
            return None
        return (f"a chain that ends in {plan.family or 'finalize'}, not a channel reduction or a map whose pooling "
                "windows lie whole in the boxes")

    def stages(self, plan):
        return ("gemm_cluster",)

    def facts(self, plan):
        """``cluster``: offered; ``cluster_boxes``: (th, tw, taps) -> the boxes a block keeps (tiles.cluster_boxes)."""
        offered = self.refusal(plan) is None
        boxes = cluster_boxes(plan.spec.producer.geometry(), gemm_elem(plan), gemm_terms(plan)) if offered else {}
        return {"cluster": int(offered), "cluster_boxes": boxes}
