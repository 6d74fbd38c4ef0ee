"""Progress without a GPU: the plain reporter's lines for a fake search, a running build's heartbeat,
and which reporter each setting gets."""
from __future__ import annotations

import io
import re
import time

import pytest

from fusetune import build as build_module
from fusetune.cache import Cache
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.progress import (NORMAL, QUIET, VERBOSE, PlainReporter, RichReporter, SilentReporter, eta_seconds,
                               format_seconds, make_reporter, rich_available)
from fusetune.search import Machine, tune_shape

from conftest import SEEDS
from fake_handlers import MACHINE_FIELDS, FakeBench, SlowEvaluator, fake_time

MACHINE = Machine(*MACHINE_FIELDS)
TRIAL = re.compile(r"^  trial +(\d+)/(\d+)  (\S+(?: ms)?) +best (\S+) ms  eta (\S+(?: s)?)$")


def _search(tmp_path, level: int, trials: int = 5):
    lines: list[str] = []
    bench = FakeBench()
    spec = load_config(SEEDS["maxpool_gap"])
    result = tune_shape(spec, (3, 3, 7, 11, 13), Cache(tmp_path / "cache"), MACHINE, bench.factory, trials=trials,
                        reporter=PlainReporter(lines.append, level))
    return lines, bench, result


def test_plain_trial_lines_count_trials_and_carry_the_best_so_far(tmp_path):
    lines, bench, result = _search(tmp_path, NORMAL)
    trial_lines = [line for line in lines if line.startswith("  trial")]
    parsed = [TRIAL.match(line) for line in trial_lines]
    assert all(parsed), trial_lines
    evaluated = bench.search_evaluations()
    assert [int(m.group(1)) for m in parsed] == list(range(1, len(evaluated) + 1))
    assert {int(m.group(2)) for m in parsed} == {5}
    # the best so far is the running minimum of what the fake benchmarker answered, in trial order
    times = {key: fake_time(c) for key, c in _candidates(bench, tmp_path, result).items()}
    running = [min(times[k] for k in evaluated[:i + 1]) for i in range(len(evaluated))]
    assert [float(m.group(4)) for m in parsed] == pytest.approx(running, abs=1e-4)
    assert parsed[-1].group(5) == "0 s"  # nothing left
    assert not any("->" in line for line in lines), "candidates are debug lines (-v)"


def _candidates(bench, tmp_path, result):
    entry = Cache(tmp_path / "cache").load(result.key)
    return {key: outcome["candidate"] for key, outcome in entry.outcomes.items()}


def test_verbose_adds_each_trials_candidate_and_outcome(tmp_path):
    lines, bench, _ = _search(tmp_path, VERBOSE)
    outcomes = [line for line in lines if "->" in line]
    assert len(outcomes) == len(bench.search_evaluations())
    assert all(re.search(r"producer\.impl=\S+ .*-> \d+\.\d{4} ms$", line) for line in outcomes), outcomes


def test_silent_reporter_shows_nothing(tmp_path, capsys):
    bench = FakeBench()
    spec = load_config(SEEDS["maxpool_gap"])
    tune_shape(spec, (3, 3, 7, 11, 13), Cache(tmp_path / "cache"), MACHINE, bench.factory, trials=3,
               reporter=SilentReporter())
    assert capsys.readouterr() == ("", "")


def test_a_slow_build_beats_within_the_interval(tmp_path, monkeypatch):
    """The issue's bound (a line as the build starts, then at least every 5 s) scaled down: a build of
    BUILD_S seconds with a heartbeat INTERVAL shows a line before its compiler starts and never falls
    silent for much longer than the interval (slack for a busy CI machine)."""
    build_s, interval = 1.5, 0.1
    child: dict[str, float] = {}

    def slow_child(cmd, env, timeout):
        child["start"] = time.monotonic()
        time.sleep(build_s)
        child["end"] = time.monotonic()
        return True, False, ""
    monkeypatch.setattr(build_module, "_run_child", slow_child)
    stamps: list[tuple[float, str]] = []
    reporter = PlainReporter(lambda text: stamps.append((time.monotonic(), text)), interval=interval)
    rendered = render(make_plan(load_config(SEEDS["groupnorm"])))
    cache = Cache(tmp_path / "cache")
    result = build_module.build(rendered, cache, arch="9.0", reporter=reporter)
    assert result.ok and not result.cached
    assert stamps and stamps[0][0] <= child["start"] and stamps[0][1] == f"  building {rendered.name} ..."
    beats = [t for t, text in stamps if re.fullmatch(rf"  building {rendered.name}: \d+ s", text)]
    assert len(beats) >= build_s / interval / 3
    times = [stamps[0][0]] + beats + [child["end"]]
    assert max(b - a for a, b in zip(times, times[1:])) < interval * 8
    stamps.clear()
    again = build_module.build(rendered, cache, arch="9.0", reporter=reporter)
    assert again.cached and stamps == []  # a build found done shows nothing


def test_eta_and_time_formats():
    assert eta_seconds(10.0, 2, 6) == pytest.approx(20.0)
    assert eta_seconds(10.0, 2, 6, time_left=5.0) == pytest.approx(5.0)  # the timeout ends it sooner
    assert eta_seconds(10.0, 6, 6) == 0.0 and eta_seconds(0.0, 0, 6) is None
    assert [format_seconds(s) for s in (4.4, 187, 3727)] == ["4 s", "3:07", "1:02:07"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_factory_picks_by_level_terminal_and_wish():
    assert isinstance(make_reporter(QUIET, stream=_Terminal()), SilentReporter)
    assert isinstance(make_reporter(NORMAL, stream=io.StringIO()), PlainReporter)  # a pipe or a file
    assert isinstance(make_reporter(NORMAL, progress=False, stream=_Terminal()), PlainReporter)  # --no-progress
    if rich_available():
        assert isinstance(make_reporter(NORMAL, stream=_Terminal()), RichReporter)


@pytest.mark.skipif(not rich_available(), reason="rich is not installed")
def test_the_rich_display_draws_a_search_and_leaves_the_terminal_as_it_was():
    terminal = _Terminal()
    reporter = make_reporter(NORMAL, stream=terminal)
    reporter.search_started("conv [1, 2]", 4, 60.0)
    for n in range(1, 5):
        reporter.trial_done("conv [1, 2]", n, 4, "1.0000 ms", 2.0 / n)
    reporter.search_finished("conv [1, 2]")
    reporter.line("done")
    reporter.close()
    out = terminal.getvalue()
    assert "conv [1, 2]" in out and "4/4" in out and "best 0.5000 ms" in out and "done" in out
    assert out.rstrip().endswith("\x1b[?25h") or out.rfind("\x1b[?25h") > out.rfind("\x1b[?25l")  # cursor shown


@pytest.mark.skipif(not rich_available(), reason="rich is not installed")
def test_the_rich_display_shows_a_slow_wait_and_not_a_quick_one(monkeypatch):
    from fusetune import progress

    monkeypatch.setattr(progress, "WAIT_SHOWN_S", 0.2)
    terminal = _Terminal()
    reporter = make_reporter(NORMAL, stream=terminal)
    with reporter.waiting("a quick job"):
        pass
    time.sleep(0.4)  # past the delay: a timer left running would show the quick job now
    with reporter.waiting("a slow job"):
        time.sleep(0.8)
    reporter.close()
    out = terminal.getvalue()
    assert "a slow job" in out and "a quick job" not in out
    assert out.rfind("\x1b[?25h") > out.rfind("\x1b[?25l")  # the display stopped, the cursor shown


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (and nvcc)")
def test_a_real_search_shows_a_line_within_1_s_and_every_5_s_of_a_cold_build(tmp_path):
    """The issue's numbers on the real thing: ``fusetune --no-progress search`` with an empty cache
    (a cold nvcc build of the module), its stderr lines timed as they arrive."""
    import subprocess
    import sys

    from conftest import ROOT

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fusetune", "--no-progress", "--cache-dir", str(tmp_path / "c"),
                             "search", str(SEEDS["groupnorm"]), "--shape", "3,8,37,45", "--trials", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stamps = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stderr]
    proc.wait(timeout=900)
    assert proc.returncode == 0, "\n".join(text for _, text in stamps)
    assert stamps[0][0] < 1.0, stamps[0]
    begun = next(i for i, (_, text) in enumerate(stamps) if text.startswith("  building "))
    ended = next(i for i, (_, text) in enumerate(stamps) if i > begun and text.startswith("  module "))
    during = [t for t, _ in stamps[begun:ended + 1]]
    assert stamps[ended][0] - stamps[begun][0] > 5.0, "the build was too short to tell"
    assert max(b - a for a, b in zip(during, during[1:])) <= 5.0, stamps[begun:ended + 1]


def test_a_slow_job_of_the_evaluation_process_beats_and_a_quick_one_is_silent(tmp_path):
    """Issue 27 for what the evaluation process does (the float64 reference of a large shape, a torch.compile
    max-autotune in the inductor world's first forward) scaled down: a job that outlasts the interval says
    what it is at least every interval; a quick one, most trials, adds no line."""
    from fusetune.build import BuildResult
    from fusetune.codegen import plan_space
    from fusetune.runner import GpuBenchmarker, _job_label
    from fusetune.worlds import WORLDS

    job_s, interval = 0.6, 0.1
    spec = load_config(SEEDS["groupnorm"])
    plan = make_plan(spec)
    candidate = next(c for c in plan_space(plan).all() if c["producer.impl"] == "direct")
    evaluator = SlowEvaluator({"open": job_s, "evaluate": job_s})
    stamps: list[tuple[float, str]] = []
    reporter = PlainReporter(lambda text: stamps.append((time.monotonic(), text)), interval=interval)
    bench = GpuBenchmarker(plan, spec.shapes[-1], Cache(tmp_path / "cache"), MACHINE, evaluator, reporter=reporter)
    bench.main = BuildResult(name="m", ok=True, seconds=0.0, log="", module_dir=tmp_path, build_dir=tmp_path)
    assert bench.evaluate(candidate)["status"] == "ok"
    for kind, label in [("open", "setting up the float64 reference and eager's error"),
                        ("evaluate", "verifying and timing direct")]:
        [(start, end)] = [(s, e) for k, s, e in evaluator.ran if k == kind]
        beats = [t for t, text in stamps if re.fullmatch(rf"  {re.escape(label)}: \d+ s", text)]
        assert len(beats) >= job_s / interval / 3, (kind, stamps)
        times = [start] + beats + [end]
        assert all(start <= t <= end for t in beats) and max(b - a for a, b in zip(times, times[1:])) < interval * 8
    stamps.clear()
    assert bench.eager_ms() == 1.0 and stamps == []  # quick jobs: no line
    inductor = {**candidate, "producer.impl": "inductor"}
    mode = WORLDS["inductor"].compile_mode
    assert _job_label("evaluate", inductor) == f"verifying and timing inductor (torch.compile {mode})"
