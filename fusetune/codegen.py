"""Render a plan into the files of one extension module: <stage>.cu per stage, binding.cpp, model.py.

All compile-time variants of every stage go into one module (chosen at run time by
index), so a search builds once per plan, not once per trial. The module name carries
the hash of its sources: builds are reused by content, and two plans never share a
build directory.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from fusetune import __version__, broadcast
from fusetune.cache import atomic_write_text
from fusetune.dtypes import DTYPES
from fusetune.launch_abi import SLOTS, STATUSES
from fusetune.ops import Elementwise
from fusetune.ops.channel import channel_finish, channel_value
from fusetune.ops.pool import ADAPTIVE_BOUNDS
from fusetune.plan import Plan
from fusetune.regions import reference_attr
from fusetune.space import Constraint, FamilySpace, ParamSpec, PlanSpace, load_family
from fusetune.templates import environment
from fusetune.tiles import (FOOTPRINT_MAX, WIDE_BLOCK, WIDE_BN, gemm_keeps_b, gemm_tile, wide_axes,
                            wide_channel_chunk, wide_cin_padded, wide_depth, wide_folds, wide_folds_aligned, wide_planes,
                            wide_slab_stride, wide_workspace_words)
from fusetune.worlds import DEFAULT, WORLDS, all_facts, launches, refusals
from fusetune.worlds.facts import gemm_terms

#: Flags for nvcc; part of every cache key. No fast-math: it changes rounding of rsqrt and division. No
#: -lineinfo: the line tables cost ptxas time in every build and change no instruction (profile a kernel's
#: source lines by building it with -lineinfo yourself).
CUDA_FLAGS = ("-O3", "-std=c++17")
STRATEGIES = {"warp": 0, "smem": 1}


@dataclasses.dataclass(frozen=True)
class RenderedModule:
    name: str  # extension module name, unique per source content
    files: dict[str, str]  # file name -> text: <stage>.cu (one per stage), binding.cpp, model.py

    @property
    def cuda_sources(self) -> dict[str, str]:
        """The torch-free CUDA translation units, one per stage."""
        return {name: text for name, text in self.files.items() if name.endswith(".cu")}
    source_hash: str

    def write(self, directory: Path) -> Path:
        """Write the files (atomically each) into ``directory``; returns it."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            target = directory / name
            if not (target.exists() and target.read_text() == text):
                atomic_write_text(target, text)  # unique temporary names: concurrent writers are safe
        return directory


def plan_space(plan: Plan) -> PlanSpace:
    """The producer's own choices (where the convolution runs: a world of the registry; cuDNN's layout
    and form), then each kernel stage's declared space, active under the worlds whose stages hold it."""
    offered = plan.impl_stages
    stages = tuple(_stage_family(load_family(stage), offered) for stage in plan.stages)
    return PlanSpace(families=(producer_family(plan),) + stages, plan_facts=plan_facts(plan))


def producer_family(plan: Plan) -> FamilySpace:
    """templates/producer.yaml's choices (cuDNN's layout and form, gemm_store's store), after
    producer.impl: one choice per world (fusetune.worlds.WORLDS, in its order), a world that does not
    take the region refused by a constraint that says the world's own why, and a world on a GPU older
    than its kernels need by one that says so."""
    declared = load_family("producer")
    impl = ParamSpec(name="impl", choices=tuple(WORLDS), default=DEFAULT, compile_time=False,
                     doc="where the convolution runs (fusetune/worlds/): "
                         + "; ".join(f"{name}: {world.doc}" for name, world in WORLDS.items()))
    refused = tuple(Constraint(expr=f"impl != {name!r}", why=f"the {name} world does not take this region: {why}")
                    for name, why in refusals(plan).items())
    by_sm: dict[int, list[str]] = {}
    for name, world in WORLDS.items():
        if world.min_sm and name in plan.impl_stages:
            by_sm.setdefault(world.min_sm, []).append(name)
    gpus = tuple(Constraint(expr=f"impl not in {tuple(names)!r} or sm >= {sm}",
                            why=f"{', '.join(names)} need a GPU of compute capability {sm // 10}.{sm % 10} or newer")
                 for sm, names in sorted(by_sm.items()))
    return dataclasses.replace(declared, params=(impl,) + declared.params,
                               constraints=refused + gpus + declared.constraints)


def _stage_family(family: FamilySpace, offered: dict[str, tuple[str, ...]]) -> FamilySpace:
    """A stage's declared space, active where the chosen world runs it (and where its own ``when``, if
    it declares one, holds)."""
    worlds = tuple(name for name, stages in offered.items() if family.family in stages)
    when = f"impl in {worlds!r}"
    return dataclasses.replace(family, when=f"({when}) and ({family.when})" if family.when else when)


def plan_facts(plan: Plan) -> dict[str, Any]:
    """What the plan offers, by name, for the spaces' ``when`` and constraints: the region's own facts,
    the worlds that take it, and each world's facts (fusetune.worlds)."""
    return {"family": plan.family or "none", "offered_impls": tuple(plan.impl_stages),
            "pool_sh": plan.pool_window[1][1], "pool_sw": plan.pool_window[1][2],
            "forward_form": int(plan.spec.producer.has_forward_form),
            "spatial_dims": plan.spec.producer.spatial_dims,  # 1: torch has no channels-last format
            **all_facts(plan)}


def _chain(ops: Sequence[Elementwise], v: str, slots: dict[str, int], plain: bool = False,
           scalars: frozenset[str] = frozenset()) -> str:
    """The ops applied to ``v`` as a CUDA expression; channel c's parameters read through the read-only
    cache (__ldg), or with ``plain`` as plain loads, which the compiler merges where one channel's
    values are taken in a row (__ldg is an asm statement it keeps every copy of). A scalar parameter
    (``scalars``) is its one value, whatever the channel."""
    def load(name: str) -> str:
        if name in scalars:
            return f"a.p[{slots[name]}][0]" if plain else f"__ldg(a.p[{slots[name]}])"
        return f"a.p[{slots[name]}][c]" if plain else f"__ldg(a.p[{slots[name]}] + c)"
    expr = v
    for op in ops:
        expr = op.cuda(expr, load)
    return expr


def _pool_window(plan: Plan) -> dict[str, Any]:
    """The region's pool for the templates (pool.j2): its fixed window (an adaptive pool's: the one window it
    is at the config's shapes, else zeros; Plan.pool_window), padding, and an adaptive pool's output sizes
    and window bounds; ``shifted``: each window's origin is computed (padded, or adaptive) rather than the
    output index times the stride; a max pool's dilation (``dilated``: some is not 1) and an average's
    divisor (its divisor_override, else None: the window's size)."""
    kernel, stride = plan.pool_window
    padding = plan.pool_padding
    adaptive = plan.pool_output is not None
    return {"mode": plan.pool.mode if plan.pool else "max", "kernel": kernel, "stride": stride, "padding": padding,
            "padded": any(padding), "adaptive": adaptive, "output": plan.pool_output,
            "shifted": any(padding) or adaptive, "bounds": ADAPTIVE_BOUNDS, "dilation": plan.pool_dilation,
            "dilated": plan.pool_dilation != (1, 1, 1), "divisor": plan.pool_divisor}


def _without_path(text: str | None, path: str) -> str | None:
    """A planner's message without the config's path in front: model.py is part of the cache key, and a
    config moved or copied elsewhere is the same problem."""
    if text is not None and text.startswith(f"{path}: "):
        return text[len(path) + 2:]
    return text


def _later(plan: Plan) -> list[dict[str, Any]]:
    """The segments after the first region (fusetune/pipeline.py) as the generated model runs them: each
    one's PyTorch lines, and for a later region of kernels its folder (where an export writes its tuned
    module), its index, the reference's attributes it reads under its own names, the parameters, and the
    view of its input it runs on (fusetune/views.py's fact, None for the tensor as it is)."""
    from fusetune.pipeline import later_segments

    scalars = plan.spec.scalar_parameters
    return [{"index": s.index, "kernels": s.kernels, "folder": f"r{s.index}", "attrs": [list(a) for a in s.attrs],
             "params": list(s.params), "inputs": list(s.extra_inputs), "where": s.where, "why": s.why,
             "view": s.view.fact() if s.view is not None else None,
             "lines": [step.forward_code("x", scalars) for step in s.steps]}
            for s in later_segments(plan)]


def _reference_code(plan: Plan) -> tuple[list[tuple[str, str]], list[str], str]:
    """Submodule definitions and forward lines of the reference model, and the norm's attribute."""
    spec = plan.spec
    submodules: list[tuple[str, str]] = []
    lines: list[str] = []
    norm_attr = ""
    for i, op in enumerate(spec.epilogue):
        attr = reference_attr(spec, i)
        if attr is not None:
            submodules.append((attr, op.module_code(spec.channels_at(i), spec.producer.spatial_dims)))
        if op is plan.norm:
            norm_attr = attr
        lines.append(op.forward_code("x", attr))
    return submodules, lines, norm_attr


#: Stages compiled one unit per variant: their fully unrolled kernels take ptxas seconds each, or their
#: compile_if rules out variants for every plan (spectral_stats: those that would spill).
PER_VARIANT_UNITS = ("direct_stats", "direct_main", "gemm_stats", "gemm_main", "gemm_cluster", "spectral_stats",
                     "wide_stats", "wide_main")


def _units(env, plan: Plan, variants: dict[str, list[dict[str, Any]]], context: dict[str, Any]) -> dict[str, str]:
    """The CUDA translation units: one per stage (with the shared header), and for the slow-to-compile
    stages one per variant plus a small dispatcher. ninja compiles them in parallel."""
    units: dict[str, str] = {}
    for stage in plan.stages:
        header = env.get_template("common.cuh.j2").render(stage=stage, **context) + "\n"
        template = env.get_template(f"{stage}.cu.j2")
        if stage not in PER_VARIANT_UNITS:
            units[f"{stage}.cu"] = header + template.render(variants=variants[stage], stage=stage, **context)
            continue
        family = load_family(stage)
        names = {"C": plan.spec.producer.out_channels, **plan_facts(plan)}
        compiled = [family.compiles(variant, names) for variant in variants[stage]]
        units[f"{stage}.cu"] = env.get_template("dispatch.cu.j2").render(stage=stage, variants=variants[stage],
                                                                         compiled=compiled, dtype=context["dtype"],
                                                                         statuses=context["statuses"])
        for i, variant in enumerate(variants[stage]):
            if compiled[i]:
                units[f"{stage}_{i}.cu"] = header + template.render(variants=[variant], unit=i, stage=stage, **context)
    return units


def render(plan: Plan, only: dict[str, list[dict[str, Any]]] | None = None) -> RenderedModule:
    """Render every compile-time variant of every stage, or just those in ``only`` (per stage).

    ``only`` isolates one variant in a module of its own, when the module of all variants
    fails to build: one bad variant must not cost the others.
    """
    env = environment()
    space = plan_space(plan)
    slots = {name: i for i, name in enumerate(plan.param_names)}
    scalars = plan.spec.scalar_parameters
    variants = {f.family: f.variants() if f.params else [] for f in space.families if f.family in plan.stages}
    tunable = [stage for stage, values in variants.items() if values]  # [] in VARIANTS there: none compiled
    for stage, wanted in (only or {}).items():
        variants[stage] = [v for v in variants[stage] if v in wanted]
    norm = plan.norm
    conv = plan.spec.producer.geometry()
    facts = plan_facts(plan)
    elem, terms = DTYPES[plan.spec.dtype].bytes, gemm_terms(plan)  # the K-tiled kernels' values and weight terms
    mid_reads = any(op.uses_producer() for op in plan.mid)
    post_reads = any(op.reads_input() for op in plan.post)
    final_reads = any(op.reads_input() for op in plan.final)
    context: dict[str, Any] = {
        "plan": plan, "spec": plan.spec, "version": __version__, "py": repr,
        "abi_slots": SLOTS, "statuses": STATUSES,  # what _launch and the binding agree on (fusetune/launch_abi.py)
        "facts": facts,  # what the worlds offer (codegen.plan_facts): the templates' world-specific branches
        "dtype": DTYPES[plan.spec.dtype],  # the tensors' element type in the kernels, the binding and model.py
        "chain": lambda ops, v: _chain(ops, v, slots, scalars=scalars),
        "chain_plain": lambda ops, v: _chain(ops, v, slots, plain=True, scalars=scalars),
        # channel_softmax's map of a value from its position's accumulator, finished once a position
        # (fusetune/ops/channel.py); a layer norm's per-channel weight and bias read as the chains read parameters.
        "channel_value": lambda x, acc, c: channel_value(plan.channel_map, x, acc, c,
                                                         lambda name, ch: f"__ldg(a.p[{slots[name]}] + {ch})"),
        "channel_finish": lambda acc: channel_finish(plan.channel_map, acc),
        "pool": _pool_window(plan), "strategy_id": STRATEGIES.__getitem__,
        "norm": norm,
        "pre_reads_producer": any(op.uses_producer() for op in plan.pre),
        # The mid chain reads the convolution's output (by: producer): ft_mid then takes the raw value (no
        # bias) of the element too; mid_call spells the call either way, so other chains' code is unchanged.
        "mid_reads_producer": mid_reads,
        "mid_call": lambda v, raw, c: f"ft_mid({v}, {raw}, {c}, a)" if mid_reads else f"ft_mid({v}, {c}, a)",
        # An op of the post or final chain reads the extra input (Plan.extra) at the index the value is stored at:
        # that chain then takes the index too (ft_o); post_call and final_call spell the call at a store site
        # either way, so other chains' code is unchanged. A site that does not store (a reduction's step)
        # calls them without it: the plan puts no such op there (plan.INPUT_SLOTS).
        "post_reads_input": post_reads, "final_reads_input": final_reads,
        # A broadcast input (fusetune/broadcast.py): the chain reads it at this index of the stored one (ft_stored).
        "input_index": {chain: broadcast.read_index(plan, chain) for chain in ("post", "final")},
        "input_kind": getattr(broadcast.kind_of(plan.spec, plan.extra), "name", None),
        "post_call": lambda v, c, o: f"ft_post({v}, {c}, a, {o})" if post_reads else f"ft_post({v}, {c}, a)",
        "final_call": lambda v, c, o: f"ft_final({v}, {c}, a, {o})" if final_reads else f"ft_final({v}, {c}, a)",
        "channels_per_group": norm.groups_of(plan.spec.producer.out_channels) if norm else 1,
        "cuda_flags": list(CUDA_FLAGS),
        "conv": conv,
        # Whether a warp of a gemm variant keeps the B fragments in registers (gemm.cuh.j2's FtGemmB::CACHED):
        # where they fit (tiles.gemm_keeps_b at its taps), unless the variant reads them every pass (bregs 0).
        "gemm_b_cached": lambda variant: variant.get("bregs", 1) == 1 and gemm_keeps_b(
            conv, DTYPES[plan.spec.dtype].bytes, gemm_terms(plan), variant.get("taps", 1)),
        "footprint_max": FOOTPRINT_MAX,
        # The box of a gemm variant: whole pooling windows for the main kernel, single outputs for statistics;
        # its K as the variant packs it (its taps a half k step: TF32 m16n8k8 at float32, FP16/BF16 m16n8k16 at 2
        # bytes), which gemm.cuh.j2 renders per variant.
        "gemm_tile": lambda variant, pooled: gemm_tile(conv, *(plan.pool_window if pooled else ((1, 1, 1),) * 2),
                                                       variant["tw"], variant["th"], DTYPES[plan.spec.dtype].bytes,
                                                       taps=variant.get("taps", 1)),
        # The K-tiled kernels (wide_stats, wide_main): the convolution's axes as they compute it, a stage's input
        # channels, whether wide_main folds a pool's windows class by class (aligned: each window one output
        # of each class, its window and stride the classes' stride on every axis), and per variant its
        # staged input's capacity per channel and its pipeline depth (wide_main's beside that fold). ck and
        # cin_pad count planes: words of the padded input a position (a channel, or a pair at 2 bytes).
        "wide": {"axes": wide_axes(conv), "ck": wide_planes(wide_channel_chunk(conv["cin"], elem), elem),
                 "cin_pad": wide_planes(wide_cin_padded(conv["cin"], elem), elem), "block": WIDE_BLOCK,
                 "bn_min": min(WIDE_BN), "terms": terms,
                 "workspace": wide_workspace_words(conv, elem, terms) if facts["wide"] or facts["wide_main"] else 0,
                 "folds": plan.pool is not None and wide_folds(conv),
                 "fold_aligned": plan.pool is not None and wide_folds_aligned(conv, plan.pool_window)},
        "wide_tile": lambda variant, fold=False: {"cs": wide_slab_stride(conv, variant["bm"], variant["staging"]),
                                                  "depth": wide_depth(conv, variant["bm"], variant["bn"],
                                                                      variant["blocks"], variant["staging"], fold,
                                                                      elem, terms)},
    }
    sources = _units(env, plan, variants, context)
    binding = env.get_template("binding.cpp.j2").render(**context)
    # By content alone, configs that differ only in name or path share builds and keys; the problem is part of
    # it because model.py is: two problems whose kernels read the same (a later region's, whose .cu holds no
    # convolution: fusetune/pipeline.py) must not share a module folder or a generated module's import name.
    problem = json.dumps(plan.spec.canonical(), sort_keys=True, default=list)
    digest = hashlib.sha256(("".join(sources[k] for k in sorted(sources)) + binding + repr(CUDA_FLAGS)
                             + problem).encode())
    name = f"ft_{digest.hexdigest()[:12]}"
    submodules, lines, norm_attr = _reference_code(plan)
    later = _later(plan)
    model = env.get_template("model.py.j2").render(
        module_name=name, variants=variants, tunable=tunable, default_variant=space.stage_values(space.default()),
        submodules=submodules, forward_lines=lines, norm_attr=norm_attr, cuda_sources=list(sources),
        tail_lines=[step.forward_code("x", scalars) for step in plan.tail], later=later,
        tail_why=_without_path(plan.ends, plan.spec.path),
        later_regions=[{k: s[k] for k in ("index", "folder", "attrs", "params")} for s in later if s["kernels"]],
        reads_producer=any(op.uses_producer() for op in plan.spec.epilogue),
        # what a forward returns, in the config's order (outputs:), from its chain's and its convolution's values
        returned=lambda chain, producer: ", ".join({"chain": chain, "producer": producer}[o]
                                                   for o in plan.spec.outputs),
        tail_reads_producer=any(step.op.uses_producer() for step in plan.tail), worlds=launches(plan),
        default_world=DEFAULT, input_params="".join(f", {name}: torch.Tensor" for name in plan.spec.inputs),
        input_args="".join(f", {name}" for name in plan.spec.inputs), **context)
    files = {**sources, "binding.cpp": binding, "model.py": model}
    full = hashlib.sha256("".join(files[k] for k in sorted(files)).encode()).hexdigest()[:16]
    return RenderedModule(name=name, files=files, source_hash=full)
