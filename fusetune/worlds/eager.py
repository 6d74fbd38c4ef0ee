"""eager: no kernels, the reference model as PyTorch runs it: the search's floor."""
from __future__ import annotations

from fusetune.dtypes import DTYPES
from fusetune.worlds.base import World


class Eager(World):
    name = "eager"
    doc = ("no kernels: the reference model as PyTorch runs it, timed and verified like any candidate, so "
           "that a search never hands back something slower than what it started from")
    computes_conv_inside = False
    dtypes = tuple(DTYPES)  # PyTorch's own forward takes any of them
    launch = "eager"
    runs_reference = True
    won = "the eager world won: no candidate beat PyTorch's own forward, which ModelNew runs as it is"

    def why_not(self, plan):
        return None

    def stages(self, plan):
        return ()
