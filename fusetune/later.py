"""The later regions' tuned modules (fusetune/pipeline.py), found in the cache and attached to the first
region's model: what ``load_tuned``, ``optimize`` and ``bench`` run, and what ``export`` writes beside it.

A later region is tuned as a problem of its own (its own cache key): here each one with a winner at the
config's shapes (one of kernels: where PyTorch's own ops won, they run inline) gets a module of its winners' variants (``winners.render_winners``), built into the cache
and attached to the first region's ModelNew (``ModelNew.attach_later``), which then runs it instead of the
region's ops in PyTorch. One without a winner stays in PyTorch; that is said, never an error.

A region on a view of its input (fusetune/views.py) is attached the same way: the first region's ModelNew
views the tensor in and the region's output back (``_through_view`` in templates/model.py.j2), so the
region's model sees the view's shape, the shapes it was tuned at.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from fusetune.build import build_and_load
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import ProblemSpec
from fusetune.export import find_winner
from fusetune.pipeline import Segment, later_segments
from fusetune.plan import Plan, make_plan
from fusetune.winners import render_winners
from fusetune.worlds import reference_won

log = logging.getLogger("fusetune")


def region_winners(segment: Segment, cache: Cache, gpu: str | None) -> dict[tuple[int, ...], Any]:
    """The region's input shape -> its cached winner entry, for every one of its shapes tuned (on ``gpu``)."""
    plan = make_plan(segment.spec)
    source_hash = render(plan).source_hash
    found = {}
    for shape in segment.spec.shapes:
        entry = find_winner(cache, segment.spec, shape, source_hash, gpu)
        if entry is not None and entry.winner is not None:
            found[tuple(shape)] = entry
    return found


def attach_later(model: Any, plan: Plan, cache: Cache, gpu: str | None, arch: str | None) -> list[str]:
    """Attach each later region's tuned model to ``model`` (the first region's ModelNew); one line per
    later region of kernels saying what runs there."""
    lines = []
    for segment in later_segments(plan):
        if segment.spec is None:
            continue
        label = f"region {segment.index} ({segment.where})"
        try:
            winners = region_winners(segment, cache, gpu)
            if not winners:
                lines.append(f"{label}: PyTorch (not tuned yet: `fusetune search {plan.spec.path}` tunes it)")
                continue
            # PyTorch's own forward won: inline in the first region's model its ops cost less than a model of its own
            if all(reference_won(entry.winner["candidate"]) for entry in winners.values()):
                lines.append(f"{label}: PyTorch (its search found nothing faster than the region's own ops)")
                continue
            variants = {shape: dict(entry.winner["variant"]) for shape, entry in winners.items()}
            generated = build_and_load(render_winners(make_plan(segment.spec), variants.values()), cache, arch)
            region = generated.ModelNew(variant=next(iter(variants.values())))
            for shape, variant in variants.items():
                region._by_shape[shape] = region._resolve(variant)
            model.attach_later(segment.index, region)
            lines.append(f"{label}: tuned kernels")
        except Exception as exc:  # a region's trouble leaves it in PyTorch, never the model down
            lines.append(f"{label}: PyTorch (its kernels did not load: {type(exc).__name__}: {str(exc)[-300:]})")
    for line in lines:
        log.debug("fusetune: %s: %s", plan.spec.name, line)
    return lines


def prebuild(problems: list[ProblemSpec], cache: Cache, arch: str | None) -> threading.Thread | None:
    """Build the later regions' modules (every variant, as their searches build them) in the background,
    while the first region is searched: a later region's module is small (cuDNN's world's stages alone), and
    built one after another each added its whole build to a cold search. The searches' own builds find them
    finished, or wait on the module's lock while one runs. None where there is no later region."""
    later = [p for p in problems if not p.producer.convolves]
    if not later:
        return None
    modules = list({m.name: m for m in (render(make_plan(p)) for p in later)}.values())
    thread = threading.Thread(target=_build_quietly, args=(modules, cache, arch), name="fusetune-prebuild",
                              daemon=True)
    thread.start()
    return thread


def _build_quietly(modules: list, cache: Cache, arch: str | None) -> None:
    """A failed or interrupted prebuild is the search's to meet (its own build says why), never this thread's."""
    from fusetune.build import build_many

    try:
        build_many(modules, cache, arch=arch)
    except Exception as exc:  # noqa: BLE001 - reported by the search that builds it again
        log.debug("fusetune: prebuilding the later regions' modules: %s: %s", type(exc).__name__, exc)
