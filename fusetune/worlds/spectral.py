"""spectral: the norm's statistics from spectra (Parseval), the convolution never computed."""
from __future__ import annotations

from fusetune.worlds.base import World
from fusetune.worlds.facts import stages_of


class Spectral(World):
    name = "spectral"
    doc = ("no convolution in space: where the output is a norm's statistics alone, spectral_stats takes "
           "them from the spectra of the input (cuFFT) and of the weights, by Parseval's theorem")
    computes_conv_inside = True
    launch = "spectral"
    #: At half precision the generated model widens the input and the weights to float32 before the
    #: spectra (model.py's _input_spectrum, _weights_spectrum): the statistics are float32's, the output the dtype's.
    dtypes = ("float32", "float16", "bfloat16")

    def why_not(self, plan):
        """A transposed convolution with stride 1 and no padding is the full linear convolution of its
        input with its weights, so zero-padded to the output's size, the output's spectrum is the
        product of theirs per channel pair: U[n, c, f] = sum_ci X[n, ci, f] W[ci, c, f]. By Parseval's
        theorem a plane's sum of squares is its spectrum's (over the bin count), and its sum is bin 0.
        Where the chain is an affine pre chain, a norm, and the spatial mean that finalize takes from the
        statistics (family None), those sums are the whole output: the product costs N * CIN * C complex
        multiply-adds per bin, where the convolution in space costs N * CIN * C per output element times
        the kernel's taps, and the output is never computed. Not with dilation or groups: spectral_stats builds the
        weights' spectrum from contiguous taps of every channel pair (producers.geometry_refusal)."""
        producer = plan.spec.producer
        if not producer.is_full_transposed:
            return "not a full transposed convolution (stride 1, no padding or output padding)"
        refusal = producer.inside_refusal()
        if refusal is not None:
            return refusal
        if not plan.needs_stats or plan.family is not None:
            return "the output is not a norm's statistics alone (a norm, then a spatial mean or sum)"
        if plan.pre_scale is None:
            return "the chain before the norm is not affine per channel (mul, div and add only)"
        return None

    def stages(self, plan):
        return stages_of(plan, "spectral_stats", None)

    def facts(self, plan):
        return {"spectral": int(self.refusal(plan) is None)}
