"""``fusetune report`` from studies the fake benchmarker produced: the page renders, holds everything
it needs (no network), and the data it plots are the study's trials; a headless browser draws it
where one is installed."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fusetune.cache import Cache
from fusetune.cli import main
from fusetune.config import load_config
from fusetune.report import BENCH_METHODS, DATA_ID, MIN_IMPORTANCE_TRIALS, load_study
from fusetune.search import Machine, tune_shape

from conftest import SEEDS
from fake_handlers import MACHINE_FIELDS, FakeBench

plotly = pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")

HERE = Path(__file__).resolve().parent
BENCH = HERE / "report_data" / "bench_groupnorm_fakegpu.json"
SEED = SEEDS["groupnorm"]
#: Enough finished trials for importances on the large shape, too few on the small one.
TRIALS = {1: MIN_IMPORTANCE_TRIALS + 2, 0: 3}
EXTERNAL = re.compile(r"<(?:script|link|img|iframe|source|embed)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//",
                      re.I)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Cache:
    """One config searched at two shapes: the second with enough trials for importances."""
    cache = Cache(tmp_path_factory.mktemp("report") / "cache")
    spec = load_config(SEED)
    for index, trials in TRIALS.items():
        result = tune_shape(spec, spec.shapes[index], cache, Machine(*MACHINE_FIELDS), FakeBench().factory,
                            trials=trials, echo=lambda line: None)
        assert result.status == "tuned"
    return cache


def _render(cache: Cache, tmp_path: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["--cache-dir", str(cache.root), "report", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    data = json.loads(re.search(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', page, re.S)
                      .group(1).replace("<\\/", "</"))
    return page, data


def test_the_report_is_self_contained(tuned, tmp_path):
    page, data = _render(tuned, tmp_path, str(SEED))
    assert EXTERNAL.findall(page) == []
    assert "<script" in page and page.count("<script") == 3  # plotly.js, the data, the plotting
    from plotly.offline import get_plotlyjs
    assert get_plotlyjs()[:2000] in page  # plotly.js itself, not a link to it
    assert len(data["sections"]) == len(TRIALS)


def test_the_plotted_history_and_outcomes_are_the_studys(tuned, tmp_path):
    _, data = _render(tuned, tmp_path, str(SEED))
    for section in data["sections"]:
        study = load_study(tuned, section["key"])
        complete = sorted((t for t in study.get_trials() if t.state.name == "COMPLETE"), key=lambda t: t.number)
        assert complete, "the fake search finished no trial"
        worlds = {t.params.get("producer.impl", "cudnn") for t in complete}
        assert set(section["history"]) == worlds
        for world, h in section["history"].items():
            mine = [t for t in complete if t.params.get("producer.impl", "cudnn") == world]
            assert h["trial"] == [t.number for t in mine]
            assert h["time_ms"] == pytest.approx([t.value for t in mine])
            assert h["best_ms"] == pytest.approx([min(t.value for t in mine[:i + 1]) for i in range(len(mine))])
        history = next(f for f in section["figures"] if f["id"] == "history")
        best = {trace["name"][:-len(" best")]: trace for trace in history["data"] if trace["name"].endswith(" best")}
        assert {w: (t["x"], t["y"]) for w, t in best.items()} == {
            w: (h["trial"], h["best_ms"]) for w, h in section["history"].items()}
        first_best = min(complete, key=lambda t: (t.value, t.number))
        assert section["facts"]["best_found_at"] == f"trial {complete.index(first_best) + 1} of {len(complete)} finished"
        entry = tuned.load(section["key"])
        statuses = [o["status"] for o in entry.outcomes.values()]
        assert section["outcomes"] == {s: statuses.count(s) for s in set(statuses)}
        outcomes = next(f for f in section["figures"] if f["id"] == "outcomes")["data"][0]
        assert dict(zip(outcomes["x"], outcomes["y"])) == section["outcomes"]


def test_importances_where_enough_trials_else_the_reason(tuned, tmp_path):
    _, data = _render(tuned, tmp_path, str(SEED))
    by_trials = {s["facts"]["shape"] == list(load_config(SEED).shapes[1]): s for s in data["sections"]}
    rich, poor = by_trials[True], by_trials[False]
    assert rich["importances"] and all(v > 0 for v in rich["importances"].values())
    names = set(load_study(tuned, rich["key"]).best_trial.params)
    assert set(rich["importances"]) <= names
    assert any(f["id"] == "importances" for f in rich["figures"])
    assert not poor["importances"] and "too few" in poor["importance_note"]
    assert not any(f["id"] == "importances" for f in poor["figures"])


def test_the_winner_beside_eager_and_max_autotune_from_a_bench_file(tuned, tmp_path):
    key = next(e.key for e in tuned.entries() if e.fields["shape"] == [3, 8, 37, 45])
    _, data = _render(tuned, tmp_path, key[:10], "--bench", str(BENCH))
    (section,) = data["sections"]
    row = json.loads(BENCH.read_text())[0]
    assert section["comparison"] == {label: row[k] for k, label in BENCH_METHODS}
    _, plain = _render(tuned, tmp_path, key[:10])
    entry = tuned.load(key)
    assert plain["sections"][0]["comparison"] == {"eager PyTorch": entry.winner["eager_ms"],
                                                  "fusetune": entry.winner["time_ms"]}
    assert "--bench" in plain["sections"][0]["comparison_note"]


def test_report_refusals(tuned, tmp_path, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "r.html"
    unknown = runner.invoke(main, ["--cache-dir", str(tuned.root), "report", "nosuchkey", "-o", str(out)])
    assert unknown.exit_code == 1 and "no cache entry matches" in unknown.stderr
    missing = runner.invoke(main, ["--cache-dir", str(tuned.root), "report", str(tmp_path / "no.yaml"), "-o", str(out)])
    assert missing.exit_code == 2
    monkeypatch.setitem(sys.modules, "plotly.offline", None)  # as if plotly were not installed
    bare = runner.invoke(main, ["--cache-dir", str(tuned.root), "report", str(SEED), "-o", str(out)])
    assert bare.exit_code == 1 and "fusetune[report]" in bare.stderr
    assert not out.exists()


def _browser() -> list[str] | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return [path, "--headless=new", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=10000",
                    "--dump-dom"]
    return None


def test_a_headless_browser_draws_every_figure(tuned, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium or google-chrome on PATH to render the report headless")
    page, data = _render(tuned, tmp_path, str(SEED))
    done = subprocess.run(browser + [(tmp_path / "report.html").as_uri()], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = sum(len(s["figures"]) for s in data["sections"])
    assert f'data-drawn="{expected}"' in done.stdout
    assert done.stdout.count('class="main-svg"') >= expected
