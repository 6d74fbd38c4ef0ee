"""scripts/random-chains, the chain fuzzer, and what its chains must satisfy on the CPU.

For fixed seeds the generator writes chains over the whole vocabulary (every REGISTRY op has a sampler, and each is
drawn and kept; no op is refused by the config parser most of the times it is drawn, which would mean its sampler
asks for what the parser refuses). Every chain written then: loads from its file, plans into regions without
raising ("nothing refused": what the kernels do not take runs in PyTorch with a reason), as does each later region;
renders under strict Jinja; ``fusetune plan`` takes it; and the plan's rewritten chain computes the reference
Model's output in float64 -- the first region's steps as PyTorch runs them (Step.forward_code: the rewrites' reordered,
composed and dropped ops, on the convolution's output without its bias where a norm cancels it), then the generated
ModelNew's tail with each later region's plan emulated alike -- with the norms moved off their identity as
verification moves them. The kernels themselves need a GPU:
``scripts/verify-chains`` runs the same chains there.
"""
from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from fusetune.build import load_generated
from fusetune.cli import main
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.evaluate import _perturb_norms
from fusetune.ops import REGISTRY
from fusetune.ops.reduce import Softmax
from fusetune.pipeline import later_segments, problems
from fusetune.plan import Plan, make_plan
from fusetune.producers import KINDS

from conftest import ROOT

#: The chains every test below reads: (seed, count, dtype), written by the script's command line.
BATCHES = ((2026, 14, "mixed"), (7, 10, "float32"), (31, 8, "bfloat16"))
#: The chains drawn (without the CPU check: fast) to measure the samplers: every op drawn, kept, rarely refused.
COVERAGE = (5, 500)
#: Largest share of an op's draws the parser may refuse.
MOST_REFUSED = 0.5
#: The rewritten chain against the reference, relative L2 error in float64: the same values up to rounding.
EXACT = 1e-9
#: ... but for a softmax's cast (its dtype written), times that dtype's epsilon: the float64 reference casts as the
#: user's model does, and a later region need not where the cast is no cast at the model's dtype.
CAST_ROUNDING = 8


def _script():
    """scripts/random-chains as a module, registered under its name (its dataclasses look their module up)."""
    import importlib.machinery
    import importlib.util
    import sys

    if "random_chains" not in sys.modules:
        loader = importlib.machinery.SourceFileLoader("random_chains", str(ROOT / "scripts" / "random-chains"))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        sys.modules[loader.name] = module
        loader.exec_module(module)
    return sys.modules["random_chains"]


@pytest.fixture(scope="module")
def chains(tmp_path_factory) -> list[Path]:
    """The batches' chain files, written by ``scripts/random-chains --seed S --count N --out DIR --dtype D``."""
    script = _script()
    paths: list[Path] = []
    for seed, count, dtype in BATCHES:
        out = tmp_path_factory.mktemp(f"rand{seed}")
        assert script.main(["--seed", str(seed), "--count", str(count), "--out", str(out), "--dtype", dtype,
                            "--quiet"]) == 0
        written = sorted(out.glob("*.yaml"))
        assert len(written) == count
        paths += written
    return paths


def test_the_op_table_covers_the_vocabulary():
    script = _script()
    assert sorted(script.OPS) == sorted(REGISTRY)
    assert {entry.group for entry in script.OPS.values()} == set(script.GROUP_WEIGHTS)
    assert set(script.UNARY_FN) >= set(script.GATE_CHOICES) | set(script.EXPRESSION_FUNCTIONS)


def test_the_samplers_draw_every_op_and_the_parser_takes_them():
    """Over many chains: every op and producer kind kept, the other parts of a config too (parameters, inputs,
    two shapes, outputs [chain, producer], each dtype), and no op refused by the parser most of the times it is
    drawn where it applies."""
    script = _script()
    tally = script.Tally()
    raws = script.generate(*COVERAGE, "mixed", tally, check=False)
    assert sorted(op for op in REGISTRY if not tally.kept[op]) == [], "\n".join(tally.lines())
    for op in REGISTRY:
        applied = tally.drawn[op] - tally.inapplicable[op]
        assert tally.rejected[op] <= MOST_REFUSED * applied, "\n".join(tally.lines())
    assert {raw["producer"]["op"] for raw in raws} == set(KINDS)
    assert {raw["dtype"] for raw in raws} == set(script.DTYPE_CHOICES)
    kinds = Counter(key for raw in raws for key in ("parameters", "inputs", "outputs") if key in raw)
    assert min(kinds[key] for key in ("parameters", "inputs", "outputs")) >= 10, kinds
    assert any(len(raw["shapes"]) == 2 for raw in raws)
    producers = [raw["producer"] for raw in raws]
    for key in ("stride", "dilation", "groups", "output_padding", "padding_mode", "bias"):
        assert any(key in p for p in producers), key
    assert any(p.get("padding") == "same" for p in producers)
    norms = [sum(e["op"].endswith("norm") for e in raw["epilogue"]) for raw in raws]
    assert max(norms) >= 2  # more than one norm in a chain


def test_the_same_seed_writes_the_same_chains(tmp_path):
    script = _script()
    first = script.generate(3, 4, "mixed", check=False)
    assert first == script.generate(3, 4, "mixed", check=False)
    assert first != script.generate(4, 4, "mixed", check=False)
    assert script.generate(3, 2, "mixed", check=False, first=2) == first[2:]  # each chain its own stream
    assert len({raw["name"] for raw in first}) == len(first)
    with pytest.raises(SystemExit):
        script.parse_args(["--seed", "1", "--count", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.parse_args(["--seed", "1", "--count", "2", "--out", str(tmp_path), "--dtype", "float64"])


def test_the_check_redraws_a_chain_whose_reference_is_no_test():
    """An instance norm's output averaged over its own plane is 0 up to rounding, and a group norm of those zeros
    normalises rounding: eager's error there is noise."""
    script = _script()
    raw = yaml.safe_load((Path(__file__).parent / "chains" / "conv2d_relu_maxpool_maxpool.yaml").read_text())
    assert script.check_conditioning(raw, 0) is None
    raw["epilogue"] = [{"op": "instance_norm"}, {"op": "adaptive_avg_pool"}, {"op": "group_norm", "num_groups": 8,
                                                                             "affine": False}]
    assert script.check_conditioning(raw, 0) == "ill-conditioned at float32"


def test_every_chain_loads_plans_and_renders(chains):
    """Each chain and each later region: planned (never raising), its regions named, rendered under strict Jinja."""
    for path in chains:
        spec = load_config(path)
        assert spec.name == path.stem
        for region in problems(spec):
            plan = make_plan(region)
            assert plan.regions() and plan.regions()[0].startswith("region 0"), path.name
            assert (plan.ends is None) == (not plan.tail), (path.name, plan.ends)
            module = render(plan)
            assert "model.py" in module.files and module.cuda_sources, path.name


def test_fusetune_plan_takes_every_chain(chains):
    result = CliRunner().invoke(main, ["plan", *map(str, chains)])
    assert result.exit_code == 0, result.output[-3000:] + repr(result.exception)
    for path in chains:
        assert f"{path.stem}: " in result.output


_modules = itertools.count()


def _tolerance(spec) -> float:
    casts = [op.dtype for op in spec.epilogue if isinstance(op, Softmax) and op.dtype is not None]
    return max([EXACT, *(CAST_ROUNDING * torch.finfo(getattr(torch, dtype)).eps for dtype in casts)])


def _generated(plan: Plan, folder: Path):
    return load_generated(render(plan).write(folder / f"m{next(_modules)}"))


def _produced(plan: Plan, reference, x: torch.Tensor) -> torch.Tensor:
    """The convolution's output as the first region's kernels read it: without its bias where the plan drops it
    (Plan.drop_bias: a norm cancels it, rule norm_cancels_bias), so that the check covers that rule too."""
    produced = reference.producer(x)
    if plan.drop_bias and not plan.bias_in_producer:
        produced = produced - reference.producer.bias.view(1, -1, *[1] * (produced.dim() - 2))
    return produced


def _fused_region(plan: Plan, generated, reference, x: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    """What the first region's kernels compute, as PyTorch computes its steps (the rewritten chain's head) on the
    reference's own modules, from the convolution's output as the kernels read it (_produced)."""
    produced = _produced(plan, reference, x)
    scope: dict[str, Any] = {**vars(generated), "self": reference, "y": produced, **dict(zip(plan.spec.inputs, inputs))}
    value = produced
    for step in plan.head:
        value = eval(step.forward_code("x", plan.spec.scalar_parameters), {**scope, "x": value})  # noqa: S307
    return value


def _rewritten(plan: Plan, generated, reference, x: torch.Tensor, inputs: list[torch.Tensor],
               folder: Path) -> torch.Tensor:
    """The chain as the plan computes it: the first region's steps, then ModelNew's tail, each later region of
    kernels attached as its own plan emulated alike (on the modules the tail shares with it)."""
    value = _fused_region(plan, generated, reference, x, inputs)
    if not plan.tail:
        return value
    model = generated.ModelNew().double().share_from(reference)
    for segment in later_segments(plan):
        if segment.kernels:
            region = make_plan(segment.spec)
            assert not region.tail, segment.where  # a later region plans whole
            attached = _generated(region, folder)

            class Emulated(attached.Model):
                def forward(self, x, *extra, _plan=region, _generated=attached):
                    return _rewritten(_plan, _generated, self, x, list(extra), folder)
            model.attach_later(segment.index, Emulated().double())
    return model.tail(value, *inputs)


def _check_rewritten(path: Path, seed: int, folder: Path) -> None:
    """The plan's rewritten chain against the reference Model in float64 at the config's first shape (its chain's
    output, wherever ``outputs:`` puts it), the norms moved off their identity, the torch generator seeded."""
    spec = load_config(path)
    plan = make_plan(spec)
    generated = _generated(plan, folder)
    torch.manual_seed(seed)
    reference = generated.Model().double()
    _perturb_norms(reference)
    shape = spec.shapes[0]
    x = torch.rand(shape, dtype=torch.float64)
    inputs = [torch.randn(s, dtype=torch.float64) for s in spec.input_shapes(shape)]
    with torch.no_grad():
        want = reference(x, *inputs)
        got = _rewritten(plan, generated, reference, x, inputs, folder)
    wants = want if isinstance(want, tuple) else (want,)
    assert [tuple(w.shape) for w in wants] == [tuple(s) for s in spec.output_shapes(shape)], path.name
    assert all(torch.isfinite(w).all() for w in wants), f"{path.name}: the reference is not finite"
    chain = wants[spec.outputs.index("chain")]
    error = ((got - chain).norm() / (chain.norm() or 1.0)).item()  # (a chain of small values may give 0)
    assert error <= _tolerance(spec), f"{path.name}: rules {plan.rules}, relative error {error:.3g}\n" + "\n".join(
        plan.regions())


def test_the_rewritten_chain_computes_the_reference_in_float64(chains, tmp_path):
    for k, path in enumerate(chains):
        _check_rewritten(path, k, tmp_path)


def test_the_rewritten_chain_computes_the_reference_where_a_norm_cancels_the_bias(tmp_path):
    """The corpus chains (tests/chains/) whose plan drops the convolution's bias (norm_cancels_bias), which the
    batches' chains seldom reach: their rewritten chain, from the convolution without its bias, is the reference."""
    dropping = [path for path in sorted((ROOT / "tests" / "chains").glob("*.yaml"))
                if make_plan(load_config(path)).drop_bias]
    assert len(dropping) >= 5
    for k, path in enumerate(dropping):
        _check_rewritten(path, k, tmp_path)
