"""What a tuned module needs at run time, and no more: the winners' compile-time variants only, and
prebuilt extensions matched to the machine.

Why: a search builds every variant of a plan (often 90+ translation units, minutes on a small
machine); a service that runs one winner per shape needs one variant per stage per winner, built
once into the cache directory (never into a package folder, which may be read-only), or none at
all where ``fusetune export --prebuilt`` shipped the built extension for this GPU.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from fusetune.codegen import RenderedModule, plan_space, render
from fusetune.plan import Plan

Variant = Mapping[str, Mapping[str, Any]]  # stage -> parameter values (PlanSpace.stage_values)

#: The prebuilt extensions' manifest in an export folder; the generated model.py reads it.
PREBUILT_MANIFEST = "prebuilt.json"
#: What a prebuilt extension (or a finished build, fusetune.build.BUILD_STAMP) must match to be loaded
#: instead of built: the GPU's compute capability, torch's version (its C++ ABI), the CUDA it was built
#: for and Python's major.minor (the extension's ABI tag).
PREBUILT_KEYS = ("arch", "torch", "cuda", "python")


def winners_only(plan: Plan, variants: Iterable[Variant]) -> dict[str, list[dict[str, Any]]]:
    """``render``'s ``only``: per stage with compiled variants, the compile-time values the winners use
    (in the order first used). Stages without compile-time parameters are rendered whole anyway."""
    space = plan_space(plan)
    only: dict[str, list[dict[str, Any]]] = {}
    variants = list(variants)
    for family in space.families:
        if family.family not in plan.stages or not family.compile_params:
            continue
        wanted: list[dict[str, Any]] = []
        for variant in variants:
            values = variant.get(family.family) or family.default()
            picked = {p.name: values.get(p.name, p.default) for p in family.compile_params}
            if picked not in wanted:
                wanted.append(picked)
        only[family.family] = wanted
    return only


def render_winners(plan: Plan, variants: Iterable[Variant]) -> RenderedModule:
    """The module of the winners' variants alone (its own name: the sources differ from the search's)."""
    return render(plan, winners_only(plan, variants))


def software_fields() -> dict[str, str]:
    """This process's values of PREBUILT_KEYS other than the GPU's (needs no GPU)."""
    import sys

    import torch

    return {"torch": torch.__version__.split("+")[0], "cuda": str(torch.version.cuda),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}"}


def machine_fields() -> dict[str, str]:
    """This machine's values of PREBUILT_KEYS (a CUDA GPU must be visible)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"arch": f"{major}.{minor}", **software_fields()}


def prebuilt_entry(module: str, so_path: Path, fields: Mapping[str, str]) -> dict[str, str]:
    """One manifest entry: the extension file (relative to the export folder) and what it was built for."""
    return {"module": module, "file": f"prebuilt/sm{fields['arch'].replace('.', '')}/{so_path.name}",
            **{k: str(fields[k]) for k in PREBUILT_KEYS}}


def pick_prebuilt(manifest: Mapping[str, Any], module: str, fields: Mapping[str, str]) -> dict[str, str] | None:
    """The manifest's entry for ``module`` built for exactly this machine (PREBUILT_KEYS), else None.
    The generated model.py does the same (it must not need fusetune): tests check that they agree."""
    for entry in manifest.get("prebuilt", []):
        if entry.get("module") == module and all(str(entry.get(k)) == str(fields[k]) for k in PREBUILT_KEYS):
            return dict(entry)
    return None


def write_manifest(folder: Path, entries: list[dict[str, str]]) -> None:
    (folder / PREBUILT_MANIFEST).write_text(json.dumps({"prebuilt": entries}, indent=1) + "\n")
