"""CLI conventions without a GPU (a fake benchmarker stands in): -q and -v, --json documents alone on
stdout, search over a folder or a glob, and each documented exit status from the path that gives it."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from fusetune.cli import main
from fusetune.config import load_config
from fusetune.errors import EXIT_CODES
from fusetune.search import Machine

from conftest import ROOT, SEEDS
from fake_handlers import MACHINE_FIELDS, FakeBench

SEED = SEEDS["maxpool_gap"]
TRIALS = "3"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSETUNE_CACHE_DIR", str(root))
    return root


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine with a GPU as far as the command line can tell: the FakeBench times candidates.
    Returns the settings each new FakeBench gets (a test may add failures or an interrupt)."""
    import torch

    settings: dict = {}
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine(*MACHINE_FIELDS)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 << 30, 80 << 30))
    monkeypatch.setattr("fusetune.runner.GpuBenchmarker",
                        lambda plan, shape, *args, **kwargs: FakeBench(**settings).factory(plan, shape))
    monkeypatch.setattr("fusetune.runner.LazyGpuBenchmarker",  # runner.SearchFactory's, in batches
                        lambda plan, shape, *args, **kwargs: FakeBench(**settings).factory(plan, shape))
    return settings


def _configs(tmp_path, names=("maxpool_gap", "groupnorm")):
    folder = tmp_path / "configs"
    folder.mkdir()
    for name in names:
        shutil.copy(SEEDS[name], folder / SEEDS[name].name)
    (folder / "notes.txt").write_text("not a config\n")
    return folder


# -- --json: one document on stdout, nothing else ----------------------------------------------

def test_search_json_is_the_only_thing_on_stdout(runner, cache_dir, fake_gpu):
    result = runner.invoke(main, ["search", str(SEED), "--trials", TRIALS, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["machine"]["gpu"] == MACHINE_FIELDS[0] and document["cache"] == str(cache_dir)
    assert [r["shape"] for r in document["results"]] == [list(s) for s in _shapes(SEED)]
    for r in document["results"]:
        assert r["status"] == "tuned" and r["config"] == str(SEED) and r["time_ms"] > 0
        assert r["speedup"] == pytest.approx(r["eager_ms"] / r["time_ms"]) and sum(r["counts"].values()) >= 1
    assert "trial" in result.stderr  # progress went to stderr


def _shapes(path):
    return load_config(path).shapes


def test_quiet_prints_only_the_result_and_verbose_adds_each_trial(runner, cache_dir, fake_gpu):
    quiet = runner.invoke(main, ["-q", "search", str(SEED), "--trials", TRIALS])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert quiet.stdout.splitlines()[0].split()[:3] == ["config", "shape", "status"]  # the summary alone
    assert len(quiet.stdout.splitlines()) == 1 + len(_shapes(SEED))
    again = runner.invoke(main, ["-v", "search", str(SEED), "--trials", TRIALS, "--force"])
    assert again.exit_code == 0, again.output
    assert "-> " in again.stderr and "  time: " in again.stderr  # debug lines
    normal = runner.invoke(main, ["search", str(SEED), "--trials", TRIALS, "--force"])
    assert "  trial " in normal.stderr and "-> " not in normal.stderr
    assert runner.invoke(main, ["-q", "-v", "cache", "list"]).exit_code == 2


def test_cache_list_show_clear_json(runner, cache_dir, fake_gpu, monkeypatch):
    assert runner.invoke(main, ["search", str(SEED), "--trials", TRIALS]).exit_code == 0
    listed = json.loads(runner.invoke(main, ["cache", "list", "--json"]).stdout)
    assert len(listed) == len(_shapes(SEED)) and all(e["time_ms"] > 0 and e["trials"] >= 1 for e in listed)
    shown = runner.invoke(main, ["cache", "show", listed[0]["key"], "--json"])
    detail = json.loads(shown.stdout)
    assert [d["key"] for d in detail] == [listed[0]["key"]]
    times = [o["time_ms"] for o in detail[0]["outcomes"] if o["time_ms"] is not None]
    assert times == sorted(times) and detail[0]["winner"]["time_ms"] == listed[0]["time_ms"]
    cleared = runner.invoke(main, ["cache", "clear", listed[0]["key"], "--yes", "--json"])
    assert cleared.exit_code == 0
    assert json.loads(cleared.stdout) == {"removed": 1, "keys": [listed[0]["key"]]}
    assert listed[0]["key"] in cleared.stderr  # the list of what goes is a message
    assert json.loads(runner.invoke(main, ["cache", "clear", "--yes", "--json"]).stdout)["keys"] is None


def test_deploy_json(runner, cache_dir, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder = _configs(tmp_path, ("maxpool_gap",))
    result = runner.invoke(main, ["deploy", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["configs"] == [str(folder / SEED.name)] and document["ok"] is False
    assert len(document["fallback"]) == len(_shapes(SEED)) and document["tuned"] == []
    shapes = _shapes(SEED)
    progress = [line for line in result.stderr.splitlines() if line.startswith("deploy ")]
    assert progress == [f"deploy {k}/{len(shapes)}: {load_config(SEED).name} {list(s)}" for k, s in enumerate(shapes, 1)]


# -- a folder or a glob -------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["folder", "glob"])
def test_search_a_folder_or_a_glob_searches_each_config_sorted(runner, cache_dir, fake_gpu, tmp_path, form):
    folder = _configs(tmp_path)
    argument = str(folder) if form == "folder" else str(folder / "*.yaml")
    result = runner.invoke(main, ["search", argument, "--trials", "2", "--json"])
    assert result.exit_code == 0, result.output
    configs = [r["config"] for r in json.loads(result.stdout)["results"]]
    expected = sorted(str(p) for p in folder.glob("*.yaml"))
    assert list(dict.fromkeys(configs)) == expected


@pytest.mark.parametrize("argument", ["empty", "empty/*.yaml", "missing/*.yml"])
def test_a_folder_or_glob_that_finds_nothing_is_bad_input(runner, cache_dir, tmp_path, argument):
    (tmp_path / "empty").mkdir()
    result = runner.invoke(main, ["search", str(tmp_path / argument)])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1].startswith(f"error: {tmp_path / argument}: no ")
    assert not cache_dir.exists()


# -- exit status --------------------------------------------------------------------------------

def test_each_exit_status_is_documented_in_help_and_readme(runner):
    epilog = runner.invoke(main, ["-h"]).stdout
    readme = (ROOT / "README.md").read_text()
    for code, what in EXIT_CODES.items():
        assert f"  {code:<4d} {what}" in epilog
        assert f"| {code} |" in readme, f"README.md lacks exit status {code}"


def test_each_exit_status_comes_from_its_path(runner, cache_dir, fake_gpu, monkeypatch, tmp_path):
    import torch

    def status(*args: str) -> int:
        return runner.invoke(main, list(args)).exit_code

    assert status("search", str(SEED), "--trials", TRIALS) == 0
    bad = ROOT / "tests" / "bad_configs" / "search_trials_zero.yaml"
    assert status("search", str(bad)) == 2
    assert status("search", str(SEED), "--no-such-option") == 2
    fake_gpu["interrupt_after"] = 1
    assert status("search", str(SEED), "--trials", TRIALS, "--force") == 130
    fake_gpu.clear()
    monkeypatch.setattr(FakeBench, "confirm", lambda self, candidate: {"status": "wrong_result", "log": "fake"})
    assert status("search", str(SEED), "--trials", TRIALS, "--force") == 1  # nothing passes verification
    monkeypatch.undo()
    monkeypatch.setenv("FUSETUNE_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert status("search", str(SEED)) == 3



@pytest.mark.parametrize("strict", [(), ("--strict",)], ids=["relaxed", "strict"])
def test_ctrl_c_in_deploy_exits_130(runner, cache_dir, tmp_path, monkeypatch, strict):
    """deploy swallows a failure (everything falls back to eager PyTorch) but not Ctrl-C: 130, as for
    every command."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fusetune.deploy.ensure_tuned", interrupted)
    result = runner.invoke(main, ["deploy", str(_configs(tmp_path)), *strict])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.stderr


def test_json_documents_are_strict_json(runner, cache_dir, tmp_path, monkeypatch):
    """A non-finite number (a column that could not run) is null in what --json writes, never NaN,
    which JSON lacks: `bench --json FILE` and `plan --json`."""
    import fusetune.bench

    monkeypatch.setattr(fusetune.bench, "run_bench", lambda spec, shape, cache, **kw: {
        "shape": list(shape), "compile_ms": float("nan"), "speedup": float("inf")})
    monkeypatch.setattr(fusetune.bench, "table", lambda results: "a table")
    out = tmp_path / "bench.json"
    result = runner.invoke(main, ["bench", str(SEED), "--json", str(out)])
    assert result.exit_code == 0, result.output
    strict = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in {out}"))
    assert strict[0]["compile_ms"] is None and strict[0]["speedup"] is None
    plan = runner.invoke(main, ["plan", "--json", str(SEED)])
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout, parse_constant=lambda name: pytest.fail(name))[0]["config"] == str(SEED)
