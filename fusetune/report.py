"""``fusetune report``: one self-contained HTML page per config or cache key.

What it shows, per cached (problem, shape, GPU): the best time over the trials of each world
(``producer.impl``), so that one sees whether the budget was enough; how the candidates ended
(ok, wrong result, compile error, ...); which choices mattered (optuna's PED-ANOVA importances,
which need no scikit-learn); and the winner beside eager PyTorch and ``torch.compile``
max-autotune where a ``fusetune bench --json`` file has them.

Why one file with plotly.js inside: a report is mailed, attached to an issue or opened on a
machine without a network; a page that fetches its script from a CDN shows nothing there.
The figures' data sit in one JSON block that the page plots, so a test reads exactly what is drawn.
"""
from __future__ import annotations

import dataclasses
import html
import json
import warnings
from pathlib import Path
from typing import Any, Iterable

from fusetune.cache import Cache, Entry
from fusetune.documents import counts, problem_names
from fusetune.errors import ConfigError, FusetuneError, MissingDependencyError, no_cache_entry
from fusetune.paths import CONFIG_SUFFIXES
from fusetune.worlds import DEFAULT, won_note

#: The world a candidate belongs to, and the name of the eager world that is PyTorch itself.
WORLD_PARAM = "producer.impl"
DEFAULT_WORLD = DEFAULT
#: Fewer finished trials than this give importances that are noise: say so instead of plotting them.
MIN_IMPORTANCE_TRIALS = 10
#: What a bench JSON calls each method, in the order they are drawn.
BENCH_METHODS = (("eager_ms", "eager PyTorch"), ("compile_default_ms", "torch.compile"),
                 ("compile_max-autotune-no-cudagraphs_ms", "torch.compile max-autotune"),
                 ("fusetune_ms", "fusetune"))
DATA_ID = "fusetune-report-data"


@dataclasses.dataclass
class Section:
    """What the report shows for one cache entry (plain data: it is also the page's JSON)."""

    key: str
    title: str
    facts: dict[str, Any]
    history: dict[str, dict[str, list[float]]]  # world -> {"trial": [...], "best_ms": [...], "time_ms": [...]}
    outcomes: dict[str, int]
    importances: dict[str, float]
    importance_note: str
    comparison: dict[str, float]  # method label -> ms
    comparison_note: str


def find_entries(target: str, cache: Cache) -> list[Entry]:
    """The entries ``target`` names: a config file (every shape and GPU of its problem) or a key
    prefix or config name, as ``fusetune cache show`` takes them."""
    path = Path(target)
    if path.suffix in CONFIG_SUFFIXES or path.is_file():
        from fusetune.config import load_config

        spec = load_config(path)
        problem = json.loads(json.dumps(spec.canonical()))
        found = [e for e in cache.entries() if e.fields.get("problem") == problem]
        if not found:
            raise FusetuneError(f"{target}: nothing of this config is in the cache {cache.root}; "
                                f"run `fusetune search {target}` first")
        return found
    found = cache.find(target)
    if not found:
        raise FusetuneError(no_cache_entry(target, problem_names(cache.entries())))
    return found


def load_study(cache: Cache, key: str, storage: Any | None = None) -> Any | None:
    """The entry's optuna study, read without changing it: from ``storage`` (``--storage``, a fleet's
    database) where it holds the key, else from the cache's journal; None if there is none."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage is not None:
        try:
            return optuna.load_study(study_name=key, storage=storage.optuna_storage())
        except KeyError:  # not in the database: this cache's own search
            pass
    path = cache.study_path(key)
    if not path.exists():
        return None
    try:
        return optuna.load_study(study_name=key, storage=JournalStorage(JournalFileBackend(str(path))))
    except Exception as exc:  # a damaged journal costs the history, not the report
        warnings.warn(f"fusetune: cannot read the study {path} ({type(exc).__name__}: {exc}); "
                      "the report lacks its history", stacklevel=2)
        return None


def history(trials: Iterable[Any]) -> dict[str, dict[str, list[float]]]:
    """Per world, in trial order: each finished trial's number and time, and the best time so far."""
    out: dict[str, dict[str, list[float]]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.value is None or trial.state.name != "COMPLETE":
            continue
        world = out.setdefault(str(trial.params.get(WORLD_PARAM, DEFAULT_WORLD)), {"trial": [], "time_ms": [],
                                                                                  "best_ms": []})
        best = min([float(trial.value)] + world["best_ms"][-1:])
        world["trial"].append(trial.number)
        world["time_ms"].append(float(trial.value))
        world["best_ms"].append(best)
    return dict(sorted(out.items()))


def best_found_at(trials: Iterable[Any]) -> str | None:
    """``trial k of n``: when the search last found a faster candidate. Late (k near n) says a larger
    trial budget might find a faster one still; early says the budget was enough."""
    finished = sorted((t for t in trials if t.value is not None and t.state.name == "COMPLETE"),
                      key=lambda t: t.number)
    if not finished:
        return None
    best = min(finished, key=lambda t: (t.value, t.number))
    return f"trial {finished.index(best) + 1} of {len(finished)} finished"


def importances(study: Any) -> tuple[dict[str, float], str]:
    """Parameter importances (PED-ANOVA) and a note; empty with the reason when they cannot be told."""
    import optuna

    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return {}, (f"{len(complete)} finished trials: too few to tell which choices matter "
                    f"(at least {MIN_IMPORTANCE_TRIALS} are needed)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            evaluator = optuna.importance.PedAnovaImportanceEvaluator()
            found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except Exception as exc:  # e.g. every trial made the same choices
        return {}, f"importances could not be computed: {type(exc).__name__}: {exc}"
    found = {name: float(value) for name, value in found.items() if value > 0}
    if not found:
        return {}, "no choice made a difference among the finished trials"
    return found, (f"PED-ANOVA importance of each choice for reaching the best 10% of {len(complete)} "
                   "finished trials (optuna.importance)")


def load_bench(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The results of ``fusetune bench --json`` files (each a list of results)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(path, "", f"not a readable `fusetune bench --json` file: {exc}") from None
        rows += [r for r in (data if isinstance(data, list) else [data]) if isinstance(r, dict)]
    return rows


def comparison(entry: Entry, bench: list[dict[str, Any]]) -> tuple[dict[str, float], str]:
    """The winner beside eager and torch.compile from a bench result of the same config, shape and
    GPU; else the winner beside the eager time the search measured."""
    name, shape, gpu = entry.fields.get("problem_name"), entry.fields.get("shape"), entry.fields.get("gpu")
    for row in bench:
        if row.get("config") == name and row.get("shape") == shape and row.get("gpu") == gpu:
            return ({label: float(row[k]) for k, label in BENCH_METHODS if row.get(k) is not None},
                    f"fusetune bench on {gpu} (median of timed runs, one process)")
    winner = entry.winner or {}
    shown = {label: float(winner[k]) for k, label in (("eager_ms", "eager PyTorch"), ("time_ms", "fusetune"))
             if winner.get(k) is not None}
    return shown, ("times the search measured; no bench result for this config, shape and GPU: run "
                   "`fusetune bench CONFIG --json FILE` and pass `--bench FILE` to compare with torch.compile")


def section(entry: Entry, cache: Cache, bench: list[dict[str, Any]], storage: Any | None = None) -> Section:
    """Everything the report shows for one entry."""
    study = load_study(cache, entry.key, storage)
    trials = study.get_trials(deepcopy=False) if study is not None else []
    ranked, note = importances(study) if study is not None else ({}, "no study journal: no history")
    compared, compared_note = comparison(entry, bench)
    fields = entry.fields
    winner = entry.winner or {}
    facts = {"config": fields.get("config"), "shape": fields.get("shape"), "gpu": fields.get("gpu"),
             "cuda": fields.get("cuda"), "torch": fields.get("torch"), "trials": len(trials),
             "best_found_at": best_found_at(trials), "winner_ms": winner.get("time_ms"),
             "eager_ms": winner.get("eager_ms"),
             "winner": winner.get("candidate")}
    if won_note(winner.get("candidate")):  # eager or inductor won: no kernels of fusetune's
        facts["winner_world"] = won_note(winner.get("candidate"))
    shape = "x".join(map(str, fields.get("shape", [])))
    return Section(key=entry.key, title=f"{fields.get('problem_name', entry.key)} {shape} on {fields.get('gpu', '?')}",
                   facts=facts, history=history(trials), outcomes=counts(entry), importances=ranked,
                   importance_note=note, comparison=compared, comparison_note=compared_note)


def figures(s: Section) -> list[dict[str, Any]]:
    """The plotly figures of one section, as plain JSON (data and layout), built from its data alone."""
    out = []
    if s.history:
        traces = []
        for world, h in s.history.items():
            traces.append({"type": "scatter", "mode": "lines+markers", "name": f"{world} best",
                           "x": h["trial"], "y": h["best_ms"], "line": {"shape": "hv"}, "legendgroup": world})
            traces.append({"type": "scatter", "mode": "markers", "name": f"{world} trials", "x": h["trial"],
                           "y": h["time_ms"], "opacity": 0.35, "legendgroup": world, "showlegend": False})
        out.append({"id": "history", "data": traces,
                    "layout": {"title": {"text": "Best time over trials, per world (producer.impl)"},
                               "xaxis": {"title": {"text": "trial"}},
                               "yaxis": {"title": {"text": "ms"}, "type": "log"}}})
    if s.outcomes:
        out.append({"id": "outcomes", "data": [{"type": "bar", "x": list(s.outcomes), "y": list(s.outcomes.values())}],
                    "layout": {"title": {"text": "Outcomes of the candidates tried"},
                               "yaxis": {"title": {"text": "candidates"}}}})
    if s.importances:
        names = list(s.importances)[::-1]  # the most important on top
        out.append({"id": "importances", "data": [{"type": "bar", "orientation": "h", "y": names,
                                                   "x": [s.importances[n] for n in names]}],
                    "layout": {"title": {"text": "Parameter importances"}, "margin": {"l": 220}}})
    if s.comparison:
        out.append({"id": "comparison", "data": [{"type": "bar", "x": list(s.comparison),
                                                  "y": list(s.comparison.values())}],
                    "layout": {"title": {"text": "The winner beside PyTorch"}, "yaxis": {"title": {"text": "ms"}}}})
    return out


def plotly_js() -> str:
    """plotly.js itself, to embed (the ``report`` extra installs it)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise MissingDependencyError("fusetune report draws with plotly, which is not installed: "
                                     "pip install 'fusetune[report]' (or pip install plotly)") from None
    return get_plotlyjs()


def _json_for_script(value: Any) -> str:
    """JSON that cannot end the <script> element it sits in."""
    return json.dumps(value, allow_nan=False).replace("</", "<\\/")


def render_html(sections: list[Section], title: str) -> str:
    """One page: plotly.js, the data of every figure as JSON, a few lines that plot it."""
    js = plotly_js()
    data = {"sections": [{**dataclasses.asdict(s), "figures": figures(s)} for s in sections]}
    body = []
    for i, s in enumerate(sections):
        facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fact(v))}</td></tr>"
                        for k, v in s.facts.items())
        plots = "".join(f'<div class="plot" id="fig-{i}-{f["id"]}"></div>' for f in figures(s))
        notes = (f"<p>{html.escape(s.importance_note)}</p>" if not s.importances else "") + \
            f"<p class=\"note\">{html.escape(s.comparison_note)}</p>"
        body.append(f"<section><h2>{html.escape(s.title)}</h2><p class=\"key\">{html.escape(s.key)}</p>"
                    f"<table>{facts}</table>{plots}{notes}</section>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}} th{{text-align:left;padding-right:1em}}
td{{font-family:monospace}} .plot{{height:420px}} .key,.note{{color:#666}}</style>
<script type="text/javascript">{js}</script></head>
<body><h1>{html.escape(title)}</h1>
{''.join(body)}
<script type="application/json" id="{DATA_ID}">{_json_for_script(data)}</script>
<script type="text/javascript">
(function () {{
  var data = JSON.parse(document.getElementById("{DATA_ID}").textContent), drawn = 0;
  data.sections.forEach(function (s, i) {{
    s.figures.forEach(function (f) {{
      Plotly.newPlot("fig-" + i + "-" + f.id, f.data, f.layout, {{responsive: true, displaylogo: false}});
      drawn += 1;
    }});
  }});
  document.body.setAttribute("data-drawn", String(drawn));
}})();
</script></body></html>
"""


def _fact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return "-" if value is None else str(value)


def write_report(target: str, cache: Cache, out: Path, bench_files: Iterable[str] = (),
                 storage: Any | None = None) -> list[Section]:
    """Write the report of ``target`` (a config or a key) to ``out``; the sections it shows.
    ``storage``: a ``fusetune.storage.Storage`` whose studies are read first."""
    plotly_js()  # a missing plotly is said before anything is read
    bench = load_bench(bench_files)
    sections = [section(e, cache, bench, storage) for e in find_entries(target, cache)]
    from fusetune.cache import atomic_write_text

    atomic_write_text(Path(out), render_html(sections, f"fusetune report: {target}"))
    return sections
