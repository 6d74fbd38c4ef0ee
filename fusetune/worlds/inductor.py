"""inductor: no kernels of fusetune's, the reference forward compiled by torch.compile's max-autotune,
timed and verified like any candidate, so that a search never hands back something slower than what
``torch.compile`` gives for free. The plan offers it for every region (planning does not depend on the
machine); where this machine's torch cannot compile for the GPU (no triton), ``machine_refusal`` says
why, ``fusetune plan`` shows it and the search leaves the candidate out."""
from __future__ import annotations

import importlib.util

from fusetune.worlds.base import World

#: torch.compile's mode for the world (WORLDS["inductor"]["mode"] in model.py): max-autotune, the
#: fastest code inductor generates, without CUDA graphs (a graph replays fixed buffers; the model's
#: callers pass fresh tensors, and the other candidates are timed without one).
MODE = "max-autotune-no-cudagraphs"


class Inductor(World):
    name = "inductor"
    doc = (f"no kernels of fusetune's: the reference model compiled by torch.compile(mode=\"{MODE}\") at its "
           "first call, timed and verified like any candidate, so that a search never hands back something slower "
           "than max-autotune; needs triton where the search runs")
    computes_conv_inside = False
    dtypes = ("float32", "float16", "bfloat16")  # inductor compiles the forward at whatever dtype it runs
    launch = "inductor"
    runs_reference = True
    compile_mode = MODE
    won = (f"the inductor world won: no kernels of fusetune's beat torch.compile(mode=\"{MODE}\") of the "
           "reference, which ModelNew compiles at its first call and runs (torch with triton, no nvcc)")
    # max-autotune benchmarks its templates while compiling: about a minute for one chain, several for
    # a large convolution, once per worker process (inductor's caches make a second compile short).
    warmup_s = 600.0
    # A later region (no convolution) is a few memory-bound passes: its compile would cost a search up to a
    # minute a region for what the whole chain's inductor candidate (region 0's search) already covers.
    later_regions = False
    later_refusal = ("a later region: torch.compile's candidate is the whole chain's, in the first region's "
                     "search")

    def why_not(self, plan):
        return None  # torch.compile takes any chain the reference model runs

    def stages(self, plan):
        return ()

    def machine_refusal(self) -> str | None:
        if importlib.util.find_spec("torch._dynamo") is None:
            return "this torch has no torch._dynamo (torch.compile)"
        if importlib.util.find_spec("triton") is None:
            return "torch.compile's GPU code needs triton, which is not installed with this torch"
        return None
