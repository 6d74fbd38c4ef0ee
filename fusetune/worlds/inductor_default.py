"""inductor_default: the reference forward compiled by torch.compile in its default mode, one more
candidate beside ``inductor`` (max-autotune). max-autotune is not always inductor's fastest code: its
benchmarked templates can lose to the default mode's ATen convolution and fused Triton kernels, and its
choice differs between two compilations, so the search times both and a winner is never slower than
either mode of ``torch.compile``. The default mode compiles in seconds, without benchmarking templates."""
from __future__ import annotations

from fusetune.worlds.inductor import Inductor

#: torch.compile's mode for the world (WORLDS["inductor_default"]["mode"] in model.py).
MODE = "default"


class InductorDefault(Inductor):
    name = "inductor_default"
    doc = (f"no kernels of fusetune's: the reference model compiled by torch.compile(mode=\"{MODE}\") at its "
           "first call, timed and verified like any candidate, so that a search never hands back something slower "
           "than torch.compile's default mode; needs triton where the search runs")
    compile_mode = MODE
    won = (f"the inductor_default world won: no kernels of fusetune's beat torch.compile(mode=\"{MODE}\") of the "
           "reference, which ModelNew compiles at its first call and runs (torch with triton, no nvcc)")
    # The default mode generates code without benchmarking it: seconds to a minute for a chain.
    warmup_s = 180.0
