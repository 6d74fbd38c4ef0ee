"""The registry of worlds: every value of producer.impl, one module each, in a fixed order (the
search's and the docs' order). What the rest of fusetune knows of worlds derives from here."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusetune.worlds.base import World
from fusetune.worlds.cudnn import Cudnn
from fusetune.worlds.cudnn_fused import CudnnFused
from fusetune.worlds.direct import Direct
from fusetune.worlds.eager import Eager
from fusetune.worlds.facts import CONV_STAGES
from fusetune.worlds.gemm import Gemm
from fusetune.worlds.gemm_cluster import GemmCluster
from fusetune.worlds.gemm_extrema import GemmExtrema
from fusetune.worlds.gemm_store import GemmStore
from fusetune.worlds.gemm_wide import GemmWide
from fusetune.worlds.gemm_wide_recompute import GemmWideRecompute
from fusetune.worlds.inductor import Inductor
from fusetune.worlds.inductor_default import InductorDefault
from fusetune.worlds.spectral import Spectral

if TYPE_CHECKING:
    from fusetune.plan import Plan

__all__ = ["DEFAULT", "WORLDS", "World", "all_facts", "conv_passes", "launches", "machine_refusals", "offered",
           "reference_won", "refusals", "won_note"]

#: producer.impl -> its world; cudnn first (the default), then the kernels' worlds, cuDNN's fused convolution
#: (cudnn_fused), then the search's floors: eager (PyTorch's own forward), inductor_default and inductor (torch.compile's default mode and
#: max-autotune of it).
WORLDS: dict[str, World] = {world.name: world for world in (
    Cudnn(), Direct(), Gemm(), GemmExtrema(), GemmStore(), GemmCluster(), GemmWide(), GemmWideRecompute(),
    Spectral(), CudnnFused(), Eager(), InductorDefault(), Inductor())}
#: The world a candidate that names none runs in (producer.impl's default): the registry's first.
DEFAULT: str = next(iter(WORLDS))


def offered(plan: Plan) -> dict[str, tuple[str, ...]]:
    """The worlds that take the region, each with its stages in launch order (cudnn, eager and inductor
    always)."""
    return {name: world.stages(plan) for name, world in WORLDS.items() if world.refusal(plan) is None}


def refusals(plan: Plan) -> dict[str, str]:
    """The worlds that do not take the region, each with why: what ``fusetune plan`` shows."""
    why = {name: world.refusal(plan) for name, world in WORLDS.items()}
    return {name: reason for name, reason in why.items() if reason is not None}


def machine_refusals(plan: Plan) -> dict[str, str]:
    """The offered worlds this machine cannot run, each with why (World.machine_refusal: inductor
    without triton): the plan offers them, the search here leaves them out."""
    why = {name: WORLDS[name].machine_refusal() for name in plan.impl_stages}
    return {name: reason for name, reason in why.items() if reason is not None}


def reference_won(candidate: dict[str, Any]) -> bool:
    """Whether a winner is the reference's own forward (eager PyTorch, or torch.compile's): no kernels of
    fusetune's run for it."""
    return WORLDS[candidate.get("producer.impl", DEFAULT)].runs_reference


def won_note(candidate: dict[str, Any] | None) -> str | None:
    """What a winner means where its world has no kernels of fusetune's (World.won), else None."""
    world = WORLDS.get((candidate or {}).get("producer.impl", "cudnn"))
    return world.won if world is not None else None


def all_facts(plan: Plan) -> dict[str, Any]:
    """Every world's facts (whether it is offered or not: a stage's constraints read them by name). The
    names are one namespace: two worlds naming a fact alike would have one silently read the other's."""
    merged: dict[str, Any] = {}
    for world in WORLDS.values():
        facts = world.facts(plan)
        clash = set(facts) & set(merged)
        assert not clash, f"world {world.name} redefines facts {sorted(clash)} another world names"
        merged.update(facts)
    return merged


def launches(plan: Plan) -> dict[str, dict[str, Any]]:
    """For the generated model: each offered world's launch ("cudnn", "kernels", "cluster", "spectral",
    "folded", "eager", "inductor"), whether its statistics pass stores the convolution output ("", "float",
    "choice"), and what its launch reads beside (World.launch_data: torch.compile's mode, a fold)."""
    return {name: {"launch": WORLDS[name].launch, "store": WORLDS[name].store(plan),
                   **WORLDS[name].launch_data(plan)}
            for name in plan.impl_stages}


def conv_passes(plan: Plan, impl: str) -> int:
    """How many of an impl's stages compute the convolution (0 for cuDNN: it computes it once, outside
    the kernels)."""
    return sum(stage in CONV_STAGES for stage in plan.impl_stages.get(impl, ()))
