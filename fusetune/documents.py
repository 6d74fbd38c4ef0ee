"""What ``--json`` prints: each command's result as one JSON document (schemas in README.md).

Kept apart from the command line so the shapes of the documents are data a test can check,
and the same for a table and its JSON form. Every value is plain JSON: no NaN, no tuples.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable

from fusetune.cache import Entry


def dumps(document: Any) -> str:
    """The one document a command prints on stdout (a non-finite number, which JSON lacks, as null)."""
    return json.dumps(_finite(document), indent=1, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def counts(entry: Entry) -> dict[str, int]:
    """How many candidates ended with each status."""
    out: dict[str, int] = {}
    for outcome in entry.outcomes.values():
        out[outcome.get("status", "?")] = out.get(outcome.get("status", "?"), 0) + 1
    return dict(sorted(out.items()))


def search_result(config: str, name: str, result: Any) -> dict[str, Any]:
    """One shape of ``fusetune search --json`` (``result``: a ``search.ShapeResult``)."""
    return {"config": config, "name": name, "shape": list(result.shape), "key": result.key, "status": result.status,
            "time_ms": result.time_ms, "eager_ms": result.eager_ms, "speedup": result.speedup,
            "counts": dict(sorted(result.counts.items())), "winner": result.shown, "candidate": result.candidate,
            "seconds": round(result.seconds, 3), "message": result.message}


def search_document(machine: Any, cache_root: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """``fusetune search --json``: the machine, the cache and one result per (config, shape)."""
    return {"machine": {"gpu": machine.gpu, "capability": machine.capability, "cuda": machine.cuda,
                        "torch": machine.torch},
            "cache": str(cache_root), "results": results}


def entry_summary(entry: Entry) -> dict[str, Any]:
    """One entry of ``fusetune cache list --json``."""
    winner = entry.winner
    return {"key": entry.key, "name": entry.fields.get("problem_name"), "config": entry.fields.get("config"),
            "shape": entry.fields.get("shape"), "gpu": entry.fields.get("gpu"), "trials": len(entry.outcomes),
            "counts": counts(entry), "time_ms": winner["time_ms"] if winner else None,
            "eager_ms": winner.get("eager_ms") if winner else None}


def problem_names(entries: Iterable[Entry]) -> list[str]:
    """The config names the entries were tuned under, each once (what a user may name them by)."""
    return sorted({str(e.fields["problem_name"]) for e in entries if e.fields.get("problem_name")})


def sorted_outcomes(entry: Entry) -> list[tuple[str, dict[str, Any]]]:
    """Outcomes fastest first, failures after (as ``cache show`` lists them)."""
    return sorted(entry.outcomes.items(), key=lambda item: item[1].get("time_ms") or float("inf"))


def entry_detail(entry: Entry) -> dict[str, Any]:
    """One entry of ``fusetune cache show --json``: its fields, winner and every outcome with its log."""
    return {"key": entry.key, "fields": entry.fields, "winner": entry.winner,
            "outcomes": [{"candidate_key": ckey, "status": o.get("status"), "time_ms": o.get("time_ms"),
                          "candidate": o.get("candidate"), "log": o.get("log") or ""}
                         for ckey, o in sorted_outcomes(entry)]}


def clear_document(removed: int, keys: Iterable[str] | None) -> dict[str, Any]:
    """``fusetune cache clear --json``: how many entries went, and which (None: everything)."""
    return {"removed": removed, "keys": None if keys is None else sorted(keys)}


def deploy_document(report: Any) -> dict[str, Any]:
    """``fusetune deploy --json`` (``report``: a ``deploy.DeployReport``)."""
    return {"configs": report.configs, "cached": report.cached, "tuned": report.tuned,
            "fallback": report.fallback, "ok": report.ok, "seconds": round(report.seconds, 3)}
