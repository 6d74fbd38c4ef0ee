"""The command line, without a GPU: plan, refusals, cache inspection, export and deploy fallbacks."""
from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from fusetune.cache import Cache, usual_mode
from fusetune.cli import main
from fusetune.codegen import plan_space
from fusetune.worlds import refusals
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.search import Machine, shape_facts, tune_shape
from fusetune.space import candidate_key
from fusetune.winners import render_winners

from conftest import CONFIGS, ROOT, SEEDS
from fake_handlers import FakeBench, fake_time

MACHINE = Machine("FakeGPU", "9.0", "13.0", "2.13")
BAD = Path(__file__).resolve().parent / "bad_configs"
BAD_CASES = [  # file, key the error must name
    ("group_norm_groups_not_dividing.yaml", "epilogue[0].groups"),
    ("search_trials_zero.yaml", "search.trials"),
    ("producer_unknown_key.yaml", "producer.pad_mode"),
]
ALL_CONFIGS = sorted(CONFIGS.glob("*.yaml"))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSETUNE_CACHE_DIR", str(root))
    return root


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def _tune(root: Path, seed: str, shape, trials: int = 3, **bench) -> str:
    spec = load_config(SEEDS[seed])
    result = tune_shape(spec, tuple(shape), Cache(root), MACHINE, FakeBench(**bench).factory, trials=trials,
                        echo=lambda line: None)
    assert result.status == "tuned"
    return result.key


# -- plan -------------------------------------------------------------------------------------


def test_plan_lists_every_stage(runner):
    result = runner.invoke(main, ["plan", *map(str, ALL_CONFIGS)])
    assert result.exit_code == 0, result.output
    for path in ALL_CONFIGS:
        spec = load_config(path)
        plan = make_plan(spec)
        space = plan_space(plan)
        assert f"{spec.name}: {plan.describe()}" in result.output
        assert f"stages={'+'.join(plan.impl_stages['cudnn'])}" in result.output
        if ("direct" in plan.impl_stages):
            assert f"direct={'+'.join(plan.impl_stages.get('direct', ()))}" in result.output
        for impl, reason in refusals(plan).items():  # what stands in the way of each world not offered
            assert f"  no {impl} world: {reason}" in result.output
        for family in space.families:
            for p in family.params:
                assert f"  {family.family}.{p.name}: {list(p.choices)} default {p.default}" in result.output
        assert f"  {len(list(space.all()))} distinct candidates" in result.output
    assert len(re.findall(r"^\S+: stages=", result.output, re.M)) == len(ALL_CONFIGS)


# -- refusals: nothing written ---------------------------------------------------------------


@pytest.mark.parametrize("name, key", BAD_CASES, ids=[c[0][:-5] for c in BAD_CASES])
@pytest.mark.parametrize("command", ["search", "plan", "export"])
def test_bad_config_exits_2_and_writes_nothing(runner, tmp_path, name, key, command):
    path = BAD / name
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    args = ["--cache-dir", str(cache), command]
    if command == "search":
        args += [str(SEEDS["groupnorm"]), str(path)]  # a valid config first: still nothing runs
    elif command == "export":
        args += [str(path), "-o", str(out)]
    else:
        args += [str(path)]
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert str(path) in result.stderr and key in result.stderr
    assert re.search(rf"^error: {re.escape(str(path))}: {re.escape(key)}: ", result.stderr, re.M), result.stderr
    assert not cache.exists(), "the cache directory was created for a refused config"
    assert not out.exists()


@pytest.mark.parametrize("cuda, why", [(None, "is a CPU-only build"), ("13.0", "(CUDA 13.0) sees no CUDA GPU")])
def test_search_without_gpu_exits_3_says_why_and_writes_nothing(runner, tmp_path, no_gpu, monkeypatch, cuda, why):
    import torch

    monkeypatch.setattr(torch.version, "cuda", cuda)  # what decides the message: this torch's build
    cache = tmp_path / "cache"
    result = runner.invoke(main, ["--cache-dir", str(cache), "search", str(SEEDS["groupnorm"])])
    assert result.exit_code == 3, result.output
    assert result.stderr.splitlines()[-1].startswith("error: ") and why in result.stderr
    assert _files(cache) == []


@pytest.mark.parametrize("shape", ["1,8,16,16", "128,8,128"])
def test_search_unknown_shape_exits_2(runner, tmp_path, no_gpu, shape):
    cache = tmp_path / "cache"
    result = runner.invoke(main, ["--cache-dir", str(cache), "search", str(SEEDS["groupnorm"]), "--shape", shape])
    assert result.exit_code == 2, result.output
    assert f"--shape {shape} is not among the configured shapes" in result.stderr
    assert "128,8,128,128; 3,8,37,45" in result.stderr
    assert not cache.exists()


def test_search_malformed_shape_exits_2(runner, tmp_path, no_gpu):
    result = runner.invoke(main, ["--cache-dir", str(tmp_path / "c"), "search", str(SEEDS["groupnorm"]),
                                  "--shape", "128,x"])
    assert result.exit_code == 2
    assert "expected comma-separated integers" in result.output


# -- cache ------------------------------------------------------------------------------------


def test_cache_list_empty(runner, cache_dir):
    result = runner.invoke(main, ["cache", "list"])
    assert result.exit_code == 0
    assert result.output.strip() == "cache is empty"


def test_cache_list_show_clear(runner, cache_dir, monkeypatch):
    spec = load_config(SEEDS["maxpool_gap"])
    shape = (3, 3, 7, 11, 13)
    plan = make_plan(spec)
    space = plan_space(plan)
    facts = shape_facts(spec, plan, shape, MACHINE.capability)
    feasible = sorted((c for c in space.all() if not space.violations(c, facts)), key=fake_time)
    failures = {candidate_key(feasible[0]): "crash", candidate_key(feasible[1]): "timeout"}
    key = _tune(cache_dir, "maxpool_gap", shape, trials=len(feasible), failures=failures)  # all of them
    other = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))

    listed = runner.invoke(main, ["cache", "list"])
    assert listed.exit_code == 0
    lines = listed.output.splitlines()
    assert len(lines) == 2
    mine = next(line for line in lines if line.startswith(key))
    assert spec.name in mine and "3x3x7x11x13" in mine and "FakeGPU" in mine
    assert f"  {len(feasible)} trials  " in mine
    assert f"{fake_time(feasible[2]):.4f} ms" in mine

    shown = runner.invoke(main, ["cache", "show", spec.name])
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith(f"{key}  {spec.name}  ") and other not in shown.output
    for ckey, status in failures.items():
        assert re.search(rf"^  {status} +{re.escape(ckey)}$", shown.output, re.M), status
        assert f"fake {status} of {ckey}" in shown.output
    ok_lines = re.findall(r"^  ok +\d+\.\d{4} ms  \S+$", shown.output, re.M)
    assert len(ok_lines) == len(feasible) - len(failures)
    assert ok_lines[0].endswith(candidate_key(feasible[2]))  # fastest first

    prefix = runner.invoke(main, ["cache", "show", key[:8]])
    assert prefix.exit_code == 0 and prefix.output.startswith(f"{key}  ")

    cleared = runner.invoke(main, ["cache", "clear", spec.name, "--yes"])
    assert cleared.exit_code == 0 and "removed 1 entries" in cleared.output
    assert [e.key for e in Cache(cache_dir).entries()] == [other]
    assert runner.invoke(main, ["cache", "show", spec.name]).exit_code == 1

    monkeypatch.setattr("fusetune.cli._interactive", lambda: True)  # someone answers
    kept = runner.invoke(main, ["cache", "clear"], input="n\n")
    assert kept.exit_code == 0 and [e.key for e in Cache(cache_dir).entries()] == [other]

    everything = runner.invoke(main, ["cache", "clear", "--yes"])
    assert everything.exit_code == 0 and "removed 1 entries" in everything.output
    assert runner.invoke(main, ["cache", "list"]).output.strip() == "cache is empty"
    assert [p for p in _files(cache_dir) if "locks" not in p.parts] == []


def test_cache_show_and_clear_unknown(runner, cache_dir):
    shown = runner.invoke(main, ["cache", "show", "nothing"])
    assert shown.exit_code == 1 and "no cache entry matches 'nothing'" in shown.stderr
    cleared = runner.invoke(main, ["cache", "clear", "nothing"])
    assert cleared.exit_code == 1 and "no cache entry matches 'nothing'" in cleared.stderr


# -- export -----------------------------------------------------------------------------------


def test_export_without_winner_exits_1(runner, cache_dir, tmp_path, no_gpu):
    out = tmp_path / "out"
    result = runner.invoke(main, ["export", str(SEEDS["groupnorm"]), "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "no tuned winner" in result.stderr and str(SEEDS["groupnorm"]) in result.stderr
    assert not out.exists()


def test_export_tuned_winner(runner, cache_dir, tmp_path, no_gpu):
    spec = load_config(SEEDS["groupnorm"])
    out = tmp_path / "out"
    key0 = _tune(cache_dir, "groupnorm", spec.shapes[0])

    # one shape tuned: exporting all shapes is refused, that shape alone works
    partial = runner.invoke(main, ["export", str(SEEDS["groupnorm"]), "-o", str(out), "--gpu", "FakeGPU"])
    assert partial.exit_code == 1 and "no tuned winner for shape [3, 8, 37, 45] on FakeGPU" in partial.stderr
    other_gpu = runner.invoke(main, ["export", str(SEEDS["groupnorm"]), "-o", str(out), "--gpu", "OtherGPU",
                                     "--shape", "128,8,128,128"])
    assert other_gpu.exit_code == 1 and "on OtherGPU" in other_gpu.stderr

    key1 = _tune(cache_dir, "groupnorm", spec.shapes[1], times=lambda c: 3.0 - fake_time(c))  # another winner
    result = runner.invoke(main, ["export", str(SEEDS["groupnorm"]), "-o", str(out), "--gpu", "FakeGPU"])
    assert result.exit_code == 0, result.output
    target = out / spec.name
    assert f"exported {spec.name} to {target}" in result.output
    cache = Cache(cache_dir)
    winners = [cache.load(key0).winner, cache.load(key1).winner]
    rendered = render_winners(make_plan(spec), [w["variant"] for w in winners])  # the winners' variants alone
    assert sorted(p.name for p in target.iterdir()) == sorted(
        ["model.py", *rendered.cuda_sources, "binding.cpp", "winner.json", "__init__.py"])
    assert [p.name for p in out.iterdir()] == [spec.name]  # no staging folder left behind
    assert stat.S_IMODE(target.stat().st_mode) == usual_mode(folder=True)  # not mkdtemp's 0700
    for name in ("model.py", *rendered.cuda_sources, "binding.cpp"):
        assert (target / name).read_text() == rendered.files[name]
    record = json.loads((target / "winner.json").read_text())
    assert winners[0]["variant"] != winners[1]["variant"]
    assert record["config"] == spec.name and record["module"] == rendered.name
    assert record["variant"] == winners[0]["variant"]
    assert set(record["variant"]) == {"producer", *make_plan(spec).stages}
    assert [s["input_shape"] for s in record["shapes"]] == [list(s) for s in spec.shapes]
    assert [s["variant"] for s in record["shapes"]] == [w["variant"] for w in winners]
    assert [s["key"] for s in record["shapes"]] == [key0, key1]
    assert record["shapes"][1]["producer_output"] == [3, 64, 35, 43]
    assert all(s["gpu"] == "FakeGPU" for s in record["shapes"])
    assert "ModelNew" in (target / "__init__.py").read_text()

    # again, without --gpu on a machine without one: any GPU's winner; the old export is replaced
    (target / "stale.txt").write_text("x")
    again = runner.invoke(main, ["export", str(SEEDS["groupnorm"]), "-o", str(out), "--shape", "3,8,37,45"])
    assert again.exit_code == 0, again.output
    assert not (target / "stale.txt").exists()
    assert [s["key"] for s in json.loads((target / "winner.json").read_text())["shapes"]] == [key1]


# -- deploy -----------------------------------------------------------------------------------


def test_deploy_without_gpu_falls_back(runner, cache_dir, no_gpu):
    result = runner.invoke(main, ["deploy", str(CONFIGS)])
    assert result.exit_code == 0, result.output
    shapes = [(load_config(p).name, s) for p in ALL_CONFIGS for s in load_config(p).shapes]
    assert f"tune-on-deploy: 0 cached, 0 tuned, {len(shapes)} on eager PyTorch" in result.output
    for name, shape in shapes:
        assert f"  fallback: {name} {list(shape)}: no CUDA GPU visible" in result.output
    assert [p for p in _files(cache_dir) if "locks" not in p.parts] == []


def test_deploy_strict_without_gpu_exits_1(runner, cache_dir, no_gpu):
    result = runner.invoke(main, ["deploy", str(CONFIGS), "--strict"])
    assert result.exit_code == 1, result.output
    assert "on eager PyTorch" in result.output and "fallback:" in result.output


def test_deploy_reports_a_bad_config_as_a_fallback(runner, cache_dir, tmp_path, no_gpu):
    folder = tmp_path / "configs"
    folder.mkdir()
    shutil.copy(SEEDS["groupnorm"], folder / "good.yaml")
    shutil.copy(BAD / "search_trials_zero.yaml", folder / "bad.yaml")
    result = runner.invoke(main, ["deploy", str(folder)])
    assert result.exit_code == 0, result.output
    assert "3 on eager PyTorch" in result.output
    assert f"fallback: {folder / 'bad.yaml'}: " in result.output and "search.trials" in result.output
    assert runner.invoke(main, ["deploy", str(folder), "--strict"]).exit_code == 1


def test_deploy_bounds_the_benchmarker_by_the_budget_left(tmp_path):
    """ensure_tuned hands each benchmarker the seconds left, so builds and set-up are bounded too."""
    from fusetune.deploy import ensure_tuned
    from fusetune.search import Machine

    from fake_handlers import FakeBench

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "one.yaml").write_text(
        "name: one\nproducer: {op: conv2d, in_channels: 3, out_channels: 4, kernel_size: 3}\n"
        "epilogue: [{op: relu}]\nshapes: [[2, 3, 9, 11]]\nsearch: {trials: 2}\n")
    seen: list[float] = []

    def make_bench_for(cache, machine, seconds_left):
        seen.append(seconds_left)
        return FakeBench().factory

    report = ensure_tuned(tmp_path / "configs", Cache(tmp_path / "cache"), 50.0, make_bench_for,
                          Machine("FakeGPU", "9.0", "13.0", "2.13"), echo=lambda s: None)
    assert report.tuned == ["one [2, 3, 9, 11]"] and report.ok
    assert len(seen) == 1 and 0 < seen[0] <= 50.0


# -- warnings, clearing by prefix, deploy of an empty or missing folder -----------------------------


def test_cache_warning_is_one_line_without_a_source_line(runner, cache_dir):
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    path = Cache(cache_dir).entry_path(key)
    path.write_text(path.read_text()[:100])  # truncated
    result = runner.invoke(main, ["cache", "list"])
    assert result.exit_code == 0, result.output
    warning_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert warning_lines == [f"fusetune: warning: ignoring unreadable cache entry {path} "
                             f"({warning_lines[0].split('(', 1)[1]}"]
    assert "UserWarning" not in result.stderr and "warnings.warn" not in result.stderr
    assert ".py:" not in result.stderr and "cache is empty" in result.output


def test_cache_clear_prefix_lists_the_matches_and_asks(runner, cache_dir, monkeypatch):
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    other = _tune(cache_dir, "maxpool_gap", (3, 3, 7, 11, 13))
    monkeypatch.setattr("fusetune.cli._interactive", lambda: True)
    name = load_config(SEEDS["groupnorm"]).name
    kept = runner.invoke(main, ["cache", "clear", name], input="n\n")
    assert kept.exit_code == 0, kept.output
    assert kept.output.splitlines()[0].startswith(f"{key}  {name}")
    assert "remove these 1 entries and their studies? [y/N]" in kept.output and "nothing removed" in kept.output
    assert sorted(e.key for e in Cache(cache_dir).entries()) == sorted([key, other])
    removed = runner.invoke(main, ["cache", "clear", key[:6]], input="y\n")
    assert removed.exit_code == 0 and "removed 1 entries" in removed.output
    assert [e.key for e in Cache(cache_dir).entries()] == [other]


def test_cache_clear_prefix_without_yes_refuses_where_nobody_can_answer(runner, cache_dir):
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    result = runner.invoke(main, ["cache", "clear", key[:4]])  # CliRunner's stdin is not a terminal
    assert result.exit_code == 2, result.output
    assert "pass --yes" in result.stderr and key in result.output  # what would have gone is listed
    assert [e.key for e in Cache(cache_dir).entries()] == [key]
    assert runner.invoke(main, ["cache", "clear", key[:4], "--yes"]).exit_code == 0
    assert Cache(cache_dir).entries() == []


@pytest.mark.parametrize("args", [[""], ["", "--yes"], [" "], ["nothing", ""]])
def test_cache_clear_empty_prefix_is_refused(runner, cache_dir, args):
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    result = runner.invoke(main, ["cache", "clear", *args])
    assert result.exit_code == 2, result.output
    assert "an empty KEY matches every entry" in result.stderr
    assert [e.key for e in Cache(cache_dir).entries()] == [key]


def test_deploy_missing_folder_exits_2(runner, cache_dir, tmp_path, no_gpu):
    for strict in ([], ["--strict"]):
        result = runner.invoke(main, ["deploy", str(tmp_path / "confgis"), *strict])
        assert result.exit_code == 2, result.output
        assert "does not exist" in result.output


def test_deploy_folder_without_configs(runner, cache_dir, tmp_path, no_gpu):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "README.txt").write_text("not a config")
    strict = runner.invoke(main, ["deploy", str(folder), "--strict"])
    assert strict.exit_code == 1, strict.output
    assert f"error: no configs (*.yaml, *.yml) in {folder}" in strict.stderr
    relaxed = runner.invoke(main, ["deploy", str(folder)])
    assert relaxed.exit_code == 0, relaxed.output
    assert f"fusetune: warning: no configs (*.yaml, *.yml) in {folder}" in relaxed.stderr


def test_deploy_reports_undecodable_and_duplicate_key_configs_and_tunes_the_rest(runner, cache_dir, tmp_path,
                                                                                   no_gpu):
    from fusetune.deploy import ensure_tuned

    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "good.yaml").write_text(
        "name: one\nproducer: {op: conv2d, in_channels: 3, out_channels: 4, kernel_size: 3}\n"
        "epilogue: [{op: relu}]\nshapes: [[2, 3, 9, 11]]\nsearch: {trials: 2}\n")
    shutil.copy(BAD / "not_utf8.yaml", folder / "latin1.yaml")
    shutil.copy(BAD / "duplicate_key_shapes.yaml", folder / "twice.yaml")
    result = runner.invoke(main, ["deploy", str(folder)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "unexpected error" not in result.stderr
    assert f"fallback: {folder / 'latin1.yaml'}: not UTF-8 text: byte 0xe9 at byte offset" in result.output
    assert f"fallback: {folder / 'twice.yaml'}: shapes: duplicate key 'shapes' at line 17" in result.output
    assert "fallback: one [2, 3, 9, 11]: no CUDA GPU visible" in result.output
    report = ensure_tuned(folder, Cache(tmp_path / "c2"), 50.0, lambda *a: FakeBench().factory, MACHINE,
                          echo=lambda s: None)
    assert report.tuned == ["one [2, 3, 9, 11]"] and len(report.fallback) == 2 and not report.ok


def test_plan_json_is_the_regions_and_worlds_as_data():
    """`fusetune plan --json`: one document a config, the fused ops and the PyTorch tail by config entry,
    why the kernels stop, the worlds offered (with their stages) and not (with why)."""
    chain = ROOT / "tests" / "centring" / "centre_channels_pytorch.yaml"
    result = CliRunner().invoke(main, ["plan", "--json", str(SEEDS["groupnorm"]), str(chain)])
    assert result.exit_code == 0, result.output
    seed, tail = json.loads(result.output)
    assert seed["name"] == "conv2d_groupnorm_scale_maxpool_clamp" and seed["pytorch"] == [] and seed["ends"] is None
    assert [s["op"] for s in seed["fused"]] == ["group_norm", "mul", "max_pool", "clamp"]
    assert seed["worlds"]["gemm_extrema"] == ["gemm_stats", "finalize", "extrema_map"] and seed["worlds"]["eager"] == []
    assert tail["fused"] == [] and [s["op"] for s in tail["pytorch"]] == ["sub"]
    centre, relu = tail["later"]  # the mean centring over the channels in PyTorch, then a later region of kernels
    assert centre["runs"] == "pytorch" and "a mean centring over dims [1] of [2, 8, 9, 11]: not its" in centre["why"]
    assert relu["runs"] == "kernels" and [s["op"] for s in relu["ops"]] == ["relu"] and relu["region"] == 2
    assert relu["tuned_as"] == "centre_channels_pytorch_r2" and relu["worlds"] == ["cudnn", "eager"]
    assert "a mean centring over dims [1]" in tail["ends"] and tail["candidates"] > 1


# -- issue 27: a new user's mistakes, said before any work ---------------------------------------------


@pytest.mark.parametrize("text, why", [("128,x", "expected comma-separated integers"), ("128x8x128x128", "expected "
                                       "comma-separated integers"), ("0,8,16,16", "expected positive sizes")])
@pytest.mark.parametrize("command", ["search", "export", "bench", "import"])
def test_a_malformed_shape_option_is_a_usage_error_naming_the_option(runner, tmp_path, no_gpu, command, text, why):
    """click parses --shape (and import's --inputs) before the command runs: the error names the option, and
    no progress line ('reading the configs') or cache comes before it."""
    cache = tmp_path / "cache"
    model = ROOT / "tests" / "models" / "conv2d_gelu_two_pools.py"
    target = [str(model), "-o", str(tmp_path / "out"), "--inputs", text] if command == "import" else [
        str(SEEDS["groupnorm"]), "--shape", text] + (["-o", str(tmp_path / "out")] if command == "export" else [])
    result = runner.invoke(main, ["--cache-dir", str(cache), command, *target])
    assert result.exit_code == 2, result.output
    option = "--inputs" if command == "import" else "--shape"
    assert f"Invalid value for '{option}': {why}" in result.stderr and repr(text) in result.stderr
    assert "reading the configs" not in result.stderr and "Traceback" not in result.output
    assert not cache.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, options", [(["cache", "show"], []), (["cache", "clear"], ["--yes"]),
                                              (["report"], ["-o", "r.html"])])
def test_a_prefix_of_a_config_name_suggests_the_whole_name(runner, cache_dir, tmp_path, command, options):
    """A config name is matched whole (a key by its prefix): a user who types the start of a name is told the
    name it starts, and nothing is removed or written."""
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    name = load_config(SEEDS["groupnorm"]).name
    result = runner.invoke(main, [*command, name[:16], *[str(tmp_path / o) if o.endswith(".html") else o
                                                         for o in options]])
    assert not (tmp_path / "r.html").exists()
    assert result.exit_code == 1, result.output
    assert f"no cache entry matches '{name[:16]}'" in result.stderr
    assert f"a config name is matched whole: did you mean '{name}'?" in result.stderr
    near = runner.invoke(main, ["cache", "show", name.replace("group", "grup")])
    assert near.exit_code == 1 and f"did you mean '{name}'?" in near.stderr
    assert [e.key for e in Cache(cache_dir).entries()] == [key]


def test_clearing_an_empty_cache_asks_nothing(runner, cache_dir):
    """Nobody is asked (or refused for want of --yes) to remove nothing."""
    plain = runner.invoke(main, ["cache", "clear"])  # CliRunner's stdin is not a terminal: a question is refused
    assert plain.exit_code == 0, plain.output
    assert f"nothing to remove: the cache {cache_dir} is empty" in plain.output
    as_json = runner.invoke(main, ["cache", "clear", "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == {"removed": 0, "keys": None}
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    refused = runner.invoke(main, ["cache", "clear"])  # something to remove: asked, so refused here
    assert refused.exit_code == 2 and "pass --yes" in refused.stderr
    assert [e.key for e in Cache(cache_dir).entries()] == [key]


def test_plan_shortens_a_long_parameter_description_unless_verbose(runner):
    """producer.impl's description tells every world (3,000 characters): one line of plan's, in full with -v."""
    spec = load_config(SEEDS["groupnorm"])
    impl = next(p for f in plan_space(make_plan(spec)).families for p in f.params if p.name == "impl")
    assert len(impl.doc) > 1000
    short = runner.invoke(main, ["plan", str(SEEDS["groupnorm"])])
    line = next(x for x in short.output.splitlines() if x.startswith("  producer.impl: "))
    assert line.endswith("... (fusetune -v plan: in full)") and len(line) < 500 and impl.doc not in short.output
    full = runner.invoke(main, ["-v", "plan", str(SEEDS["groupnorm"])])
    assert full.exit_code == 0 and f"- {impl.doc}" in full.output


@pytest.mark.parametrize("quiet", [False, True])
def test_import_says_at_once_what_it_is_doing_on_stderr(runner, tmp_path, quiet):
    """Building, tracing and checking a model takes seconds with nothing else shown: one line on stderr first
    (none under -q), the configs and the map on stdout."""
    model = ROOT / "tests" / "models" / "conv2d_gelu_two_pools.py"
    result = runner.invoke(main, ["-q"] * quiet + ["import", str(model), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    said = "fusetune import: building the model, tracing it and checking the trace on its example inputs"
    assert result.stderr.splitlines()[:1] == ([] if quiet else [said])
    assert said not in result.stdout and "chain0 -> " in result.stdout


@pytest.mark.parametrize("cuda, why", [(None, "is a CPU-only build"), ("13.0", "(CUDA 13.0) sees no CUDA GPU")])
def test_deploy_without_gpu_says_why_once(runner, cache_dir, tmp_path, no_gpu, monkeypatch, cuda, why):
    """A deploy without a GPU falls back (exit 0) and says why as search would (a CPU-only torch is not
    'no GPU visible'), once, not per shape."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", cuda)
    result = runner.invoke(main, ["deploy", str(CONFIGS)])
    assert result.exit_code == 0, result.output
    warnings_ = [line for line in result.stderr.splitlines() if line.startswith("fusetune: warning: ")]
    assert len(warnings_) == 1 and why in warnings_[0] and warnings_[0].endswith("every shape stays on eager PyTorch")
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["plan", "search"])
def test_a_config_that_is_not_there_names_the_one_beside_it(runner, tmp_path, no_gpu, command):
    """`fusetune plan my.yml` beside my.yaml: exit 2, the file named and the config it may have meant;
    a folder mistyped too is said so."""
    shutil.copy(SEEDS["groupnorm"], tmp_path / "my.yaml")
    cache = tmp_path / "cache"
    for typed, said in [(tmp_path / "my.yml", f"no such file; did you mean {tmp_path / 'my.yaml'}?"),
                        (tmp_path / "nothing_like_it.yaml", "no such file"),
                        (tmp_path / "confgs" / "my.yaml",
                         f"no such file: the folder {tmp_path / 'confgs'} does not exist either")]:
        result = runner.invoke(main, ["--cache-dir", str(cache), command, str(typed)])
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines()[-1] == f"error: {typed}: {said}"
    assert not cache.exists()


def test_cache_clear_names_a_key_that_matched_nothing_beside_one_that_did(runner, cache_dir):
    key = _tune(cache_dir, "groupnorm", (3, 8, 37, 45))
    result = runner.invoke(main, ["cache", "clear", key[:6], "nothing", "--yes"])
    assert result.exit_code == 0 and "removed 1 entries" in result.stdout
    assert "fusetune: warning: no cache entry matches 'nothing'" in result.stderr
    assert Cache(cache_dir).entries() == []


def test_a_short_prefix_offers_a_few_of_the_names_it_starts():
    from fusetune.errors import NAMES_SHOWN, no_cache_entry

    names = [load_config(p).name for p in ALL_CONFIGS] + [f"conv_{i}" for i in range(NAMES_SHOWN + 2)]  # all "conv.."
    said = no_cache_entry("conv", names)
    offered = said.split("did you mean one of ", 1)[1]
    assert offered.count(",") == NAMES_SHOWN - 1 and offered.endswith(f" (and {len(names) - NAMES_SHOWN} more)?")
