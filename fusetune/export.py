"""Export tuned winners as a self-contained module: model.py, <stage>.cu, binding.cpp, winner.json.

The exported kernels are the winners' variants alone (the templates fusetune verified and timed,
rendered for those variants: a module of every variant takes minutes to build); winner.json picks
the tuned variant per input shape (the first one also serves shapes not tuned; the kernels fall
back to scalar loads where its vector loads would not fit). With ``prebuilt``, the extension built
for this GPU goes along (prebuilt/sm<arch>/, listed in prebuilt.json), so that a service on the
same GPU architecture, torch and CUDA starts without a compiler; elsewhere model.py builds it.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fusetune.cache import Cache, Entry, usual_mode
from fusetune.codegen import render
from fusetune.config import ProblemSpec
from fusetune.errors import FusetuneError
from fusetune.ops import Shape
from fusetune.pipeline import later_segments, region_shapes
from fusetune.plan import make_plan
from fusetune.worlds import reference_won
from fusetune.winners import machine_fields, prebuilt_entry, render_winners, write_manifest


def find_winner(cache: Cache, spec: ProblemSpec, shape: Shape, source_hash: str, gpu: str | None) -> Entry | None:
    """The cached entry with a winner for this problem, shape and sources, searched with the worlds the
    config leaves out (search.exclude_worlds: none, or the same); on ``gpu`` if given."""
    problem = json.loads(json.dumps(spec.canonical()))  # as stored: tuples become lists
    excluded = list(spec.search.exclude_worlds)
    found = [e for e in cache.entries()
             if e.winner is not None and e.fields.get("problem") == problem
             and tuple(e.fields.get("shape", ())) == tuple(shape) and e.fields.get("sources") == source_hash
             and e.fields.get("exclude_worlds", []) == excluded and (gpu is None or e.fields.get("gpu") == gpu)]
    return max(found, key=lambda e: e.updated) if found else None


def export(spec: ProblemSpec, shapes: list[Shape], cache: Cache, out_dir: Path, gpu: str | None = None,
           prebuilt: bool = False) -> Path:
    """Write ``out_dir/<name>/``; raises if any requested shape has no tuned winner, or (``prebuilt``)
    if the extension cannot be built here. Each later region (fusetune/pipeline.py) tuned at those
    shapes goes in a folder of its own inside (``r1/``, ...), which the model runs; one that is not
    runs in PyTorch, and winner.json says which."""
    target = out_dir / spec.name
    first = _winners_module(spec, shapes, cache, gpu, prebuilt)  # raises before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{spec.name}."))
    staging.chmod(usual_mode(folder=True))  # mkdtemp's 0700 would stay the export's
    try:  # write everything beside, then swap in: never a half-written export
        record = _write_module(first, staging)
        later = {}
        for segment in later_segments(make_plan(spec)):
            if segment.spec is None:
                continue
            try:
                at = region_shapes(spec, segment.spec, shapes)
                module = _winners_module(segment.spec, at, cache, gpu, prebuilt)
                if all(reference_won(w["candidate"]) for w in module[1]["shapes"]):
                    later[f"r{segment.index}"] = f"{segment.where}: PyTorch (its search found nothing faster)"
                    continue
                _write_module(module, staging / f"r{segment.index}")
                later[f"r{segment.index}"] = f"{segment.where}: tuned kernels"
            except FusetuneError as exc:
                shutil.rmtree(staging / f"r{segment.index}", ignore_errors=True)
                later[f"r{segment.index}"] = f"{segment.where}: PyTorch ({str(exc).splitlines()[0]})"
        if later:
            record["later_regions"] = later
            (staging / "winner.json").write_text(json.dumps(record, indent=1) + "\n")
        (staging / "__init__.py").write_text('"""Exported by fusetune."""\nfrom .model import Model, ModelNew, load_kernels\n')
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _winners_module(spec: ProblemSpec, shapes: list[Shape], cache: Cache, gpu: str | None,
                    prebuilt: bool) -> tuple[Any, dict[str, Any], tuple[Path, dict[str, str]] | None]:
    """One problem's module of its winners' variants, winner.json's record and (``prebuilt``) the extension
    built for this GPU; FusetuneError where a shape has no winner or the build fails."""
    plan = make_plan(spec)
    rendered = render(plan)
    winners: list[dict[str, Any]] = []
    for shape in shapes:
        entry = find_winner(cache, spec, shape, rendered.source_hash, gpu)
        if entry is None or entry.winner is None:
            on = f" on {gpu}" if gpu else ""
            region = "" if spec.producer.convolves else f" of later region {spec.name}"
            raise FusetuneError(f"{spec.path}: no tuned winner{region} for shape {list(shape)}{on} with the "
                                f"current templates; run `fusetune search {spec.path}` first")
        winners.append({"input_shape": list(shape), "producer_output": list(spec.producer.out_shape(shape)),
                        "variant": entry.winner["variant"], "candidate": entry.winner["candidate"],
                        "time_ms": entry.winner["time_ms"], "eager_ms": entry.winner.get("eager_ms"),
                        "key": entry.key, "gpu": entry.fields.get("gpu"), "cuda": entry.fields.get("cuda"),
                        "torch": entry.fields.get("torch")})
    shipped = render_winners(plan, [w["variant"] for w in winners])
    record = {"config": spec.name, "module": shipped.name, **spec.numerics(), "variant": winners[0]["variant"],
              "shapes": winners}
    return shipped, record, _build_for_here(shipped, cache) if prebuilt else None


def _write_module(module: tuple[Any, dict[str, Any], tuple[Path, dict[str, str]] | None], folder: Path) -> dict[str, Any]:
    """Write ``_winners_module``'s module, winner.json and prebuilt extension into ``folder``; returns the record."""
    shipped, record, library = module
    folder.mkdir(parents=True, exist_ok=True)
    shipped.write(folder)
    if library is not None:
        so, fields = library
        entry = prebuilt_entry(shipped.name, so, fields)
        (folder / entry["file"]).parent.mkdir(parents=True)
        shutil.copy2(so, folder / entry["file"])
        write_manifest(folder, [entry])
    (folder / "winner.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _build_for_here(rendered, cache: Cache) -> tuple[Path, dict[str, str]]:
    """Build the exported module for this GPU (or reuse the cache's build): its extension file and
    what it was built for."""
    import torch

    from fusetune.build import build

    if not torch.cuda.is_available():
        raise FusetuneError("--prebuilt builds the extension for this machine's GPU, and no CUDA GPU is visible; "
                            "export on the GPU kind the service runs on (or leave --prebuilt out)")
    fields = machine_fields()
    built = build(rendered, cache, arch=fields["arch"])
    if not built.ok:
        raise FusetuneError(f"module {rendered.name} failed to build for --prebuilt:\n{built.log[-2000:]}")
    so = built.build_dir / f"{rendered.name}.so"
    if not so.is_file():
        raise FusetuneError(f"the build of {rendered.name} left no {so.name} in {built.build_dir}")
    return so, fields
