"""The registry of worlds: every value of producer.impl, one module each, in a fixed order (the
search's and the docs' order). What the rest of fusetune knows of worlds derives from here."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusetune.worlds.base import World
from fusetune.worlds.cudnn import Cudnn
from fusetune.worlds.direct import Direct
from fusetune.worlds.eager import Eager
from fusetune.worlds.facts import CONV_STAGES
from fusetune.worlds.gemm import Gemm
from fusetune.worlds.gemm_cluster import GemmCluster
from fusetune.worlds.gemm_extrema import GemmExtrema
from fusetune.worlds.gemm_store import GemmStore
from fusetune.worlds.gemm_wide import GemmWide
from fusetune.worlds.gemm_wide_recompute import GemmWideRecompute
from fusetune.worlds.spectral import Spectral

if TYPE_CHECKING:
    from fusetune.plan import Plan

__all__ = ["WORLDS", "World", "all_facts", "conv_passes", "launches", "offered", "refusals"]

#: producer.impl -> its world; cudnn first (the default), eager last (the search's floor).
WORLDS: dict[str, World] = {world.name: world for world in (
    Cudnn(), Direct(), Gemm(), GemmExtrema(), GemmStore(), GemmCluster(), GemmWide(), GemmWideRecompute(),
    Spectral(), Eager())}


def offered(plan: Plan) -> dict[str, tuple[str, ...]]:
    """The worlds that take the region, each with its stages in launch order (cudnn and eager always)."""
    return {name: world.stages(plan) for name, world in WORLDS.items() if world.refusal(plan) is None}


def refusals(plan: Plan) -> dict[str, str]:
    """The worlds that do not take the region, each with why: what ``fusetune plan`` shows."""
    why = {name: world.refusal(plan) for name, world in WORLDS.items()}
    return {name: reason for name, reason in why.items() if reason is not None}


def all_facts(plan: Plan) -> dict[str, Any]:
    """Every world's facts (whether it is offered or not: a stage's constraints read them by name)."""
    merged: dict[str, Any] = {}
    for world in WORLDS.values():
        merged.update(world.facts(plan))
    return merged


def launches(plan: Plan) -> dict[str, dict[str, Any]]:
    """For the generated model: each offered world's launch ("cudnn", "kernels", "cluster", "spectral",
    "eager") and whether its statistics pass stores the convolution output ("", "float", "choice")."""
    return {name: {"launch": WORLDS[name].launch, "store": WORLDS[name].store(plan)} for name in plan.impl_stages}


def conv_passes(plan: Plan, impl: str) -> int:
    """How many of an impl's stages compute the convolution (0 for cuDNN: it computes it once, outside
    the kernels)."""
    return sum(stage in CONV_STAGES for stage in plan.impl_stages.get(impl, ()))
