"""Export tuned winners as a self-contained module: model.py, <stage>.cu, binding.cpp, winner.json.

The exported model.py is the very file fusetune verified and timed; winner.json picks the
tuned variant per input shape (the first one also serves shapes not tuned; the kernels fall
back to scalar loads where its vector loads would not fit).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fusetune.cache import Cache, Entry
from fusetune.codegen import render
from fusetune.config import ProblemSpec
from fusetune.errors import FusetuneError
from fusetune.ops import Shape
from fusetune.plan import make_plan


def find_winner(cache: Cache, spec: ProblemSpec, shape: Shape, source_hash: str, gpu: str | None) -> Entry | None:
    """The cached entry with a winner for this problem, shape and sources; on ``gpu`` if given."""
    problem = json.loads(json.dumps(spec.canonical()))  # as stored: tuples become lists
    found = [e for e in cache.entries()
             if e.winner is not None and e.fields.get("problem") == problem
             and tuple(e.fields.get("shape", ())) == tuple(shape) and e.fields.get("sources") == source_hash
             and (gpu is None or e.fields.get("gpu") == gpu)]
    return max(found, key=lambda e: e.updated) if found else None


def export(spec: ProblemSpec, shapes: list[Shape], cache: Cache, out_dir: Path, gpu: str | None = None) -> Path:
    """Write ``out_dir/<name>/``; raises if any requested shape has no tuned winner."""
    rendered = render(make_plan(spec))
    winners: list[dict[str, Any]] = []
    for shape in shapes:
        entry = find_winner(cache, spec, shape, rendered.source_hash, gpu)
        if entry is None or entry.winner is None:
            on = f" on {gpu}" if gpu else ""
            raise FusetuneError(f"{spec.path}: no tuned winner for shape {list(shape)}{on} with the current "
                                f"templates; run `fusetune search {spec.path}` first")
        winners.append({"input_shape": list(shape), "producer_output": list(spec.producer.out_shape(shape)),
                        "variant": entry.winner["variant"], "candidate": entry.winner["candidate"],
                        "time_ms": entry.winner["time_ms"], "eager_ms": entry.winner.get("eager_ms"),
                        "key": entry.key, "gpu": entry.fields.get("gpu"), "cuda": entry.fields.get("cuda"),
                        "torch": entry.fields.get("torch")})
    record = {"config": spec.name, "module": rendered.name, "variant": winners[0]["variant"], "shapes": winners}
    target = out_dir / spec.name
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{spec.name}."))
    try:  # write everything beside, then swap in: never a half-written export
        rendered.write(staging)
        (staging / "winner.json").write_text(json.dumps(record, indent=1) + "\n")
        (staging / "__init__.py").write_text('"""Exported by fusetune."""\nfrom .model import Model, ModelNew, load_kernels\n')
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
