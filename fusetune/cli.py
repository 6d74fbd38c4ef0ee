"""The ``fusetune`` command line."""
from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import click

from fusetune.cache import Cache, CacheWarning, default_root
from fusetune.config import ProblemSpec, load_config
from fusetune.errors import EXIT_CODES, ConfigError, FusetuneError, no_cache_entry
from fusetune.ops import Shape
from fusetune.paths import expand_configs
from fusetune.progress import NORMAL, QUIET, VERBOSE, Reporter, configure_logging, make_reporter


@contextlib.contextmanager
def _warnings_in_one_line() -> Any:
    """Our warnings (a ``CacheWarning``, or any whose text starts ``fusetune:``) as one line
    ``fusetune: warning: ...`` on stderr, each text once, without the warnings module's source line;
    other warnings as Python shows them."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", CacheWarning)  # shown once per text below, not once per call site
        original = warnings.showwarning
        shown: set[str] = set()

        def show(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
            text = str(message)
            if not (issubclass(category, CacheWarning) or text.startswith("fusetune:")):
                original(message, category, filename, lineno, file, line)
                return
            text = " ".join(text.removeprefix("fusetune:").split())
            if text not in shown:
                shown.add(text)
                click.echo(f"fusetune: warning: {text}", err=True)
        warnings.showwarning = show
        yield


def _one_line_warnings(fn: Callable) -> Callable:
    """Run a command under ``_warnings_in_one_line``."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _warnings_in_one_line():
            return fn(*args, **kwargs)
    return wrapper


class _Refused(FusetuneError):
    """A command refused to do what was asked as asked (exit status 2, like a usage error)."""

    exit_code = 2


def _interactive() -> bool:
    """Whether someone can answer a question (tests patch this)."""
    return sys.stdin.isatty()


def _confirm(question: str, yes: bool) -> bool:
    """True with ``--yes``; else ask, or refuse in a non-interactive run (nobody can answer)."""
    if yes:
        return True
    if not _interactive():
        raise _Refused(f"{question} Not asked in a non-interactive run: pass --yes to remove without asking")
    return click.confirm(question, err=True)  # on stderr: stdout holds the result (--json)


def _fail_cleanly(fn: Callable) -> Callable:
    """Turn our errors into one line on stderr and their exit status; Ctrl-C into 130; our
    warnings into one line each."""
    @functools.wraps(fn)
    @_one_line_warnings
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FusetuneError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("\ninterrupted: finished trials are saved; run the same command to resume", err=True)
            sys.exit(130)
        except Exception as exc:
            from fusetune.storage import database_trouble
            if database_trouble(exc) is None:
                raise
            click.echo(f"error: {database_trouble(exc)}", err=True)
            sys.exit(1)
    return wrapper


class _ShapeType(click.ParamType):
    """An option's shape, N,C,... as positive integers: parsed by click before the command runs, so that a
    malformed one is a usage error naming the option (exit 2), before any progress line or work."""

    name = "N,C,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Shape:
        if isinstance(value, tuple):  # a default, or a value already converted
            return value
        try:
            shape = tuple(int(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"expected comma-separated integers like 128,3,16,32,32, got {value!r}", param, ctx)
        if any(size < 1 for size in shape):
            self.fail(f"expected positive sizes, got {value!r}", param, ctx)
        return shape


SHAPE = _ShapeType()


def _shape_text(shape: Shape) -> str:
    """A shape as ``--shape`` takes it."""
    return ",".join(map(str, shape))


def _select_shapes(spec: ProblemSpec, wanted: tuple[Shape, ...]) -> list[Shape]:
    if not wanted:
        return list(spec.shapes)
    for shape in wanted:
        if shape not in spec.shapes:
            configured = "; ".join(map(_shape_text, spec.shapes))
            raise ConfigError(spec.path, "shapes", f"--shape {_shape_text(shape)} is not among the configured shapes "
                                                   f"({configured})")
    return list(wanted)


def _select_for_all(specs: list[ProblemSpec], wanted: tuple[Shape, ...]) -> list[tuple[ProblemSpec, list[Shape]]]:
    """With several configs, each ``--shape`` applies to the configs that list it, and must match one."""
    if len(specs) == 1 or not wanted:
        return [(spec, _select_shapes(spec, wanted)) for spec in specs]
    for shape in wanted:
        if not any(shape in spec.shapes for spec in specs):
            raise ConfigError(", ".join(s.path for s in specs), "shapes",
                              f"--shape {_shape_text(shape)} is in none of the configs")
    return [(spec, [s for s in wanted if s in spec.shapes]) for spec in specs]


def _cache(ctx: click.Context) -> Cache:
    return Cache(ctx.obj["cache_dir"])


_storage_option = click.option(
    "--storage", metavar="URL", envvar="FUSETUNE_STORAGE", default=None,
    help="PostgreSQL URL shared by a fleet (postgresql://user:pass@host/db): studies, winners and jobs live "
         "there (default: $FUSETUNE_STORAGE, else none: studies stay in the local cache).")


def _storage(url: str | None, lazy: bool = False) -> Any:
    """The ``fusetune.storage.Storage`` for ``--storage`` (``lazy``: see Storage), or None without one."""
    if not url:
        return None
    from fusetune.storage import Storage
    return Storage(url, lazy=lazy)


def _storage_for_deploy(url: str | None, strict: bool) -> Any:
    """A deploy whose database cannot be reached tunes without it (unless --strict): never broken by it. Lazy:
    a deploy whose winners are all stored reads them through psycopg alone (no SQLAlchemy, no optuna)."""
    try:
        return _storage(url, lazy=True)
    except FusetuneError as exc:
        if strict:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        click.echo(f"fusetune: warning: {exc}; tuning without the shared database", err=True)
        return None


def _reporter(ctx: click.Context) -> Reporter:
    """This command's progress display, from the global -q/-v/--no-progress (on stderr)."""
    obj = ctx.find_root().obj or {}
    return make_reporter(obj.get("verbosity", NORMAL), obj.get("progress", True),
                         stream=sys.stderr, echo=lambda text: click.echo(text, err=True))


def _exit_codes_epilog() -> str:
    rows = "\n".join(f"  {code:<4d} {what}" for code, what in EXIT_CODES.items())
    return f"\b\nExit status:\n{rows}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_codes_epilog())
@click.option("--cache-dir", type=click.Path(file_okay=False), envvar="FUSETUNE_CACHE_DIR", default=None,
              help=f"Cache directory (default: $FUSETUNE_CACHE_DIR or {default_root()}).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final result.")
@click.option("-v", "--verbose", is_flag=True, help="Also debug lines: each trial's candidate and outcome.")
@click.option("--no-progress", is_flag=True, help="Plain lines instead of a live display, even on a terminal.")
@click.version_option(package_name="fusetune")
@click.pass_context
def main(ctx: click.Context, cache_dir: str | None, quiet: bool, verbose: bool, no_progress: bool) -> None:
    """Autotune fused convolution epilogues on NVIDIA GPUs."""
    if quiet and verbose:
        raise click.UsageError("-q and -v contradict each other: pass one")
    ctx.ensure_object(dict)
    ctx.obj["cache_dir"] = cache_dir
    ctx.obj["verbosity"] = QUIET if quiet else VERBOSE if verbose else NORMAL
    ctx.obj["progress"] = not no_progress
    configure_logging(ctx.obj["verbosity"])


#: The longest description of a search parameter ``fusetune plan`` prints before ``-v``: a line to read,
#: not a page (``producer.impl``'s describes every world, 3,000 characters).
PLAN_DOC_CHARS = 200


def _brief(doc: str, verbosity: int) -> str:
    """A parameter's description as ``plan`` prints it: in full under ``-v``, else cut at a word near
    ``PLAN_DOC_CHARS`` and saying where the rest is."""
    import textwrap

    if verbosity >= VERBOSE or len(doc) <= PLAN_DOC_CHARS:
        return doc
    return textwrap.shorten(doc, PLAN_DOC_CHARS, placeholder=" ... (fusetune -v plan: in full)")


@main.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="One JSON document: per config its regions, worlds and space.")
@click.pass_context
@_fail_cleanly
def plan(ctx: click.Context, configs: tuple[str, ...], as_json: bool) -> None:
    """Show how each config's chain is fused and the space searched (no GPU needed)."""
    from fusetune.codegen import plan_space
    from fusetune.plan import make_plan
    from fusetune.worlds import machine_refusals, refusals

    verbosity = (ctx.find_root().obj or {}).get("verbosity", NORMAL)
    found = []
    for spec in [load_config(c) for c in expand_configs(configs)]:
        plan_ = make_plan(spec)
        space = plan_space(plan_)
        if as_json:
            found.append(_plan_document(spec, plan_, space))
            continue
        click.echo(f"{spec.name}: {plan_.describe()}")
        click.echo(f"  numerics: {spec.describe_numerics()}")
        for line in plan_.regions():
            click.echo(f"  {line}")
        if plan_.rules:
            click.echo(f"  rewrites: {', '.join(plan_.rules)}")
        for impl, reason in refusals(plan_).items():
            click.echo(f"  no {impl} world: {reason}")
        for impl, reason in machine_refusals(plan_).items():
            click.echo(f"  {impl} world offered, but not on this machine (the search leaves it out): {reason}")
        for family in space.families:
            for p in family.params:
                kind = "compile-time" if p.compile_time else "run-time"
                when = f" [when {p.when or family.when}]" if (p.when or family.when) else ""
                click.echo(f"  {family.family}.{p.name}: {list(p.choices)} default {p.default} ({kind}){when} - "
                           f"{_brief(p.doc, verbosity)}")
        click.echo(f"  {sum(1 for _ in space.all())} distinct candidates (before each shape's constraints)")
    if as_json:
        from fusetune import documents
        click.echo(documents.dumps(found))


def _exact_at_shapes_only(plan_) -> list[str]:
    """The worlds whose kernels compute the chain exactly at the config's shapes only (ModelNew runs PyTorch's
    forward at any other where one of them won): every world with kernels of fusetune's where a rewrite holds
    there only (Plan.at_shapes), else those that pool an adaptive pool as its one window there."""
    from fusetune.worlds import WORLDS

    if plan_.at_shapes:
        return [impl for impl in plan_.impl_stages if not WORLDS[impl].runs_reference]
    return list(plan_.at_shapes_worlds)


def _plan_document(spec, plan_, space) -> dict:
    """What ``fusetune plan`` shows, as data: the fused region and the PyTorch tail (each op with the
    config entries it stands for, and its name in the messages), the entries the rewrites dropped, why the
    kernels stop, the worlds offered with their stages, the
    worlds not offered with why (and those this machine cannot run), the rewrite rules that fired, and
    the size of the space."""
    from fusetune.worlds import machine_refusals, refusals

    from fusetune.pipeline import later_segments
    from fusetune.plan import make_plan

    def steps(region) -> list[dict]:
        return [{"op": step.op.kind, "entries": list(step.entries), "where": step.where} for step in region]
    later = [{"region": s.index, "runs": "kernels" if s.kernels else "pytorch", "ops": steps(s.steps),
              **({"tuned_as": s.spec.name, "shapes": [list(x) for x in s.spec.shapes],
                  "worlds": list(make_plan(s.spec).impl_stages), "view": s.view_document()}
                 if s.kernels else {"why": s.why})}
             for s in later_segments(plan_)]
    return {"config": spec.path, "name": spec.name, **spec.numerics(), "fused": steps(plan_.head),
            "pytorch": [op for s in later if s["runs"] == "pytorch" for op in s["ops"]], "later": later,
            "dropped": steps(plan_.dropped),
            "ends": plan_.ends, "worlds": {impl: list(stages) for impl, stages in plan_.impl_stages.items()},
            "not_offered": refusals(plan_), "not_on_this_machine": machine_refusals(plan_), "rules": list(plan_.rules),
            "exact_at_shapes_only": _exact_at_shapes_only(plan_), "candidates": sum(1 for _ in space.all()),
            "inputs": list(spec.inputs), "kernel_input": plan_.extra,
            **({"input_kinds": dict(spec.input_kinds)} if spec.input_kinds else {})}  # the broadcast ones' kinds


@main.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path())
@click.option("--shape", "shapes", type=SHAPE, multiple=True,
              help="Tune only this configured shape (N,C,...); repeatable.")
@click.option("--trials", type=click.IntRange(min=1), help="Trials per shape (default: the config's).")
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds per shape (default: the config's).")
@click.option("--budget-s", "budget_s", type=click.FloatRange(min=1), default=None,
              help="Seconds per shape, its builds included: the search builds in batches, starts timing with the "
                   "first, stops at the budget and names the best so far (candidates not built by then are left for "
                   "a later search). Without it, the module of every variant is built first.")
@click.option("--force", is_flag=True, help="Ignore cached winners and re-run known outcomes.")
@click.option("--job-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds one candidate may take to verify and time before its worker is killed (a world that "
                   "compiles first, inductor, gets its warm-up on top).")
@click.option("--json", "as_json", is_flag=True, help="The results as one JSON document on stdout.")
@_storage_option
@click.option("--gpus", default=None, help="Spread the shapes over this host's GPUs: all, a count N, or indices "
              "like 0,1 (a search process per GPU at a time; default: this process on the current GPU).")
@click.pass_context
@_fail_cleanly
def search(ctx: click.Context, configs: tuple[str, ...], shapes: tuple[Shape, ...], trials: int | None,
           timeout: float | None, budget_s: float | None, force: bool, job_timeout: float, as_json: bool,
           storage: str | None, gpus: str | None) -> None:
    """Tune every shape of each CONFIG (a file, a folder of configs or a quoted glob) and cache the winners."""
    reporter = _reporter(ctx)
    # At once, before anything imports torch (the search's modules, checking a config): seconds otherwise.
    reporter.line("fusetune search: reading the configs, looking for a CUDA GPU")
    from fusetune import documents
    from fusetune.runner import SearchFactory
    from fusetune.later import prebuild
    from fusetune.pipeline import expand
    from fusetune.search import Machine, check_memory, tune_shape
    from fusetune.worker import Worker

    specs = [load_config(c) for c in expand_configs(configs)]  # all configs valid before any work starts
    selected = _select_for_all(specs, shapes)
    machine = Machine.detect()  # before the cache: a machine without a GPU is left as it was
    cache = _cache(ctx)
    store = _storage(storage)
    import torch

    free, _ = torch.cuda.mem_get_info()
    for spec, spec_shapes in selected:
        for shape in spec_shapes:
            check_memory(spec, shape, free)
    reporter.line(f"fusetune: {machine.gpu} (sm_{machine.capability.replace('.', '')}), CUDA {machine.cuda}, "
                  f"torch {machine.torch}; cache {cache.root}; {len(specs)} config(s), "
                  f"{sum(len(s) for _, s in selected)} shape(s)")
    if gpus is not None:
        options = ([f"--trials={trials}"] if trials else []) + ([f"--timeout={timeout}"] if timeout else []) + (
            [f"--budget-s={budget_s}"] if budget_s else []) + (["--force"] if force else []) + [
            f"--job-timeout={job_timeout}"]
        with reporter:
            code = _search_on_gpus(ctx, selected, gpus, machine, str(cache.root), options, as_json, reporter,
                                   storage)
        sys.exit(code)
    rows, results = [], []
    problems = [item for pair in selected for item in expand(*pair)]  # each config's first region, then its later ones
    prebuild([spec for spec, _ in problems], cache, machine.capability)  # the later regions' builds, meanwhile
    with reporter, Worker() as worker, SearchFactory(cache, machine, worker, job_timeout=job_timeout, force=force,
                                                     echo=reporter.line, reporter=reporter,
                                                     lazy=budget_s is not None) as make:
        for spec, spec_shapes in problems:
            for shape in spec_shapes:
                reporter.line(f"{spec.name} {list(shape)}")
                result = tune_shape(spec, shape, cache, machine, make, trials=trials, timeout=timeout,
                                    force=force, reporter=reporter, storage=store, budget_s=budget_s)
                rows.append((spec.name, result))
                results.append(documents.search_result(spec.path, spec.name, result))
                if result.timings:
                    reporter.debug("  time: " + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in result.timings.items()))
    click.echo(documents.dumps(documents.search_document(machine, str(cache.root), results)) if as_json
               else _summary(rows))
    if any(r.status == "failed" for _, r in rows):
        sys.exit(1)


def _search_on_gpus(ctx: click.Context, selected: list, gpus: str, machine: Any, cache_root: str,
                    options: list[str], as_json: bool, reporter: Reporter, storage: str | None) -> int:
    """``search --gpus``: each (config, shape) in a child search on the next free GPU; the summary (or
    the one JSON document) of them all; the exit status. The storage URL reaches the children in
    their environment: on a command line, its password would show in ps."""
    import torch

    from fusetune import documents, fleet
    from fusetune.search import ShapeResult

    devices = fleet.parse_gpus(gpus, torch.cuda.device_count())
    items = [(spec.path, spec.name, shape) for spec, spec_shapes in selected for shape in spec_shapes]
    searched = fleet.search_on_gpus(items, devices, [f"--cache-dir={cache_root}"], options, echo=reporter.line,
                                    env=fleet.storage_env(storage))
    found = searched.results
    if as_json:
        click.echo(documents.dumps(documents.search_document(machine, cache_root, found)))
    else:
        click.echo(_summary([(r.get("name") or Path(r["config"]).stem, ShapeResult(
            shape=tuple(r["shape"]), key=r["key"], status=r["status"], candidate=r["candidate"], time_ms=r["time_ms"],
            eager_ms=r["eager_ms"], counts=r["counts"], message=r["message"], shown=r["winner"])) for r in found]))
    for r in found:
        if r["status"] == "failed" and r.get("message"):
            click.echo(f"{r['config']} {r['shape']}: {r['message']}", err=True)
    return searched.exit_status()


def _summary(rows: list) -> str:
    header = ("config", "shape", "status", "time ms", "eager ms", "speed-up", "outcomes", "winner")
    lines = [header]
    for name, r in rows:
        counts = " ".join(f"{k}:{v}" for k, v in sorted(r.counts.items()))
        winner = " ".join(f"{k}={v}" for k, v in (r.shown or r.candidate or {}).items())
        lines.append((name, "x".join(map(str, r.shape)), r.status, f"{r.time_ms:.4f}" if r.time_ms else "-",
                      f"{r.eager_ms:.4f}" if r.eager_ms else "-", f"{r.speedup:.2f}x" if r.speedup else "-",
                      counts, winner))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


@main.command(name="export")
@click.argument("config", type=click.Path())
@click.option("--shape", "shapes", type=SHAPE, multiple=True,
              help="Export this configured shape's winner (default: all).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--gpu", default=None, help="Export winners tuned on this GPU (default: this machine's, if any).")
@click.option("--prebuilt", is_flag=True, help="Include the extension built for this GPU's architecture, so that a "
                                               "service with the same torch and CUDA starts without nvcc.")
@click.pass_context
@_fail_cleanly
def export_cmd(ctx: click.Context, config: str, shapes: tuple[Shape, ...], out_dir: str, gpu: str | None,
               prebuilt: bool) -> None:
    """Write CONFIG's tuned kernels (the winners' variants only) as a self-contained module."""
    from fusetune.export import export

    spec = load_config(config)
    chosen = _select_shapes(spec, shapes)
    if gpu is None:
        gpu = _this_gpu()
    target = export(spec, chosen, _cache(ctx), Path(out_dir), gpu, prebuilt=prebuilt)
    click.echo(f"exported {spec.name} to {target} (import {target.name}.model and use ModelNew)")
    import json

    from fusetune.worlds import won_note

    for shape_winner in json.loads((target / "winner.json").read_text())["shapes"]:
        note = won_note(shape_winner["candidate"])
        if note:  # no kernels of fusetune's there: say what runs instead
            click.echo(f"  {list(shape_winner['input_shape'])}: {note}")


def _this_gpu() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # no usable driver: any GPU's winner will do
        return None


@main.group(name="cache")
def cache_group() -> None:
    """Inspect or clear the cache."""


@cache_group.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="The entries as one JSON document on stdout.")
@click.pass_context
@_fail_cleanly
def cache_list(ctx: click.Context, as_json: bool) -> None:
    """One line per cached (problem, shape, machine)."""
    entries = _cache(ctx.parent).entries()
    if as_json:
        from fusetune import documents
        click.echo(documents.dumps([documents.entry_summary(e) for e in entries]))
        return
    if not entries:
        click.echo("cache is empty")
    for e in entries:
        click.echo(_entry_line(e))


def _entry_line(e: Any) -> str:
    w = e.winner
    best = f"{w['time_ms']:.4f} ms" if w else "no winner"
    return (f"{e.key}  {e.fields.get('problem_name', '?'):40s} {'x'.join(map(str, e.fields.get('shape', [])))}"
            f"  {e.fields.get('gpu', '?')}  {len(e.outcomes)} trials  {best}")


@cache_group.command(name="show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="The entries, every outcome and its log as one JSON document.")
@click.pass_context
@_fail_cleanly
def cache_show(ctx: click.Context, key: str, as_json: bool) -> None:
    """Everything stored for KEY (a key prefix or a config name): fields, winner, each outcome."""
    from fusetune import documents

    cache = _cache(ctx.parent)
    found = cache.find(key)
    if not found:
        raise FusetuneError(no_cache_entry(key, documents.problem_names(cache.entries())))
    if as_json:
        click.echo(documents.dumps([documents.entry_detail(e) for e in found]))
        return
    for e in found:
        click.echo(f"{e.key}  {e.fields.get('problem_name', '?')}  {'x'.join(map(str, e.fields.get('shape', [])))}"
                   f"  {e.fields.get('gpu', '?')}")
        for name, value in sorted(e.fields.items()):
            if name not in ("problem", "problem_name", "shape", "gpu"):
                click.echo(f"  {name}: {value}")
        w = e.winner
        click.echo(f"  winner: {w['time_ms']:.4f} ms (eager {w.get('eager_ms') or 0:.4f} ms) "
                   + " ".join(f"{k}={v}" for k, v in w["candidate"].items()) if w else "  winner: none")
        for ckey, o in documents.sorted_outcomes(e):
            t = f"{o['time_ms']:.4f} ms" if o.get("time_ms") else ""
            log = (o.get("log") or "").strip().splitlines()
            click.echo(f"  {o['status']:13s} {t:>12s}  {ckey}" + (f"\n      {log[-1][:400]}" if log else ""))


@cache_group.command(name="clear")
@click.argument("keys", nargs=-1)
@click.option("--yes", is_flag=True, help="Do not ask (needed where nobody can answer, as in a script).")
@click.option("--json", "as_json", is_flag=True, help="What was removed as one JSON document on stdout.")
@click.pass_context
@_fail_cleanly
def cache_clear(ctx: click.Context, keys: tuple[str, ...], yes: bool, as_json: bool) -> None:
    """Remove the entries matching KEYS (prefixes or config names), or everything; lists them and
    asks first unless --yes."""
    from fusetune import documents

    def result(removed: int, which: list[str] | None) -> None:
        click.echo(documents.dumps(documents.clear_document(removed, which)) if as_json
                   else f"removed {removed} entries")

    if any(not k.strip() for k in keys):  # a prefix of every key
        raise _Refused("an empty KEY matches every entry; to remove everything, run `fusetune cache clear` "
                       "without KEY")
    cache = _cache(ctx.parent)
    if keys:
        matched = {k: cache.find(k) for k in keys}
        found = {e.key: e for entries in matched.values() for e in entries}
        missed = [k for k, entries in matched.items() if not entries]
        names = documents.problem_names(cache.entries()) if missed else []  # every entry read once, where needed
        unmatched = [no_cache_entry(k, names) for k in missed]
        if not found:
            raise FusetuneError("; ".join(unmatched))
        for why in unmatched:  # a KEY that matched nothing beside others that did: said, not silently passed over
            click.echo(f"fusetune: warning: {why}", err=True)
        for key in sorted(found):
            click.echo(_entry_line(found[key]), err=as_json)
        if not _confirm(f"remove these {len(found)} entries and their studies?", yes):
            click.echo("nothing removed", err=as_json)
            if as_json:
                result(0, [])
            return
        result(cache.clear(sorted(found)), sorted(found))
        return
    if _holds_nothing(cache.root):  # nothing to ask about (a script without --yes is not refused for it)
        click.echo(f"nothing to remove: the cache {cache.root} is empty", err=as_json)
        if as_json:
            result(0, None)
        return
    if not _confirm(f"remove everything under {cache.root}?", yes):
        if as_json:
            result(0, [])
        return
    result(cache.clear(), None)


def _holds_nothing(root: Path) -> bool:
    """Whether a cache folder holds no entry, study, module or build (its lock files are no content)."""
    return not any(p.is_file() and "locks" not in p.relative_to(root).parts for p in Path(root).rglob("*"))


@main.command()
@click.argument("config_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--budget", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds for tuning all untuned shapes together.")
@click.option("--strict", is_flag=True, help="Exit 1 if any shape falls back to eager PyTorch, or there is no config.")
@click.option("--json", "as_json", is_flag=True, help="The outcome as one JSON document on stdout.")
@click.option("--timings", is_flag=True, help="Also where the command's time went, phase by phase, on stderr.")
@_storage_option
@click.pass_context
@_fail_cleanly
def deploy(ctx: click.Context, config_dir: str, budget: float, strict: bool, as_json: bool, timings: bool,
           storage: str | None) -> None:
    """Make sure every shape of every config in CONFIG_DIR is tuned for this GPU."""
    import time

    entered = time.perf_counter()
    from fusetune import documents
    from fusetune.deploy import DeployReport, Phases, ensure_tuned, process_seconds
    from fusetune.search import Machine

    phases = Phases()
    age = process_seconds()
    if age is not None:
        phases.add("start", age - (time.perf_counter() - entered))
    phases.add("imports", time.perf_counter() - entered)
    if not Path(config_dir).is_dir():  # click checks it too; a folder gone since is as mistyped
        click.echo(f"error: {config_dir}: no such folder of configs", err=True)
        sys.exit(2)
    reporter = _reporter(ctx)
    try:
        cache = _cache(ctx)
        try:
            with phases("machine"):
                machine = Machine.detect()
        except FusetuneError as exc:  # why (a CPU-only torch, no device visible), said once: not an error here
            click.echo(f"fusetune: warning: {exc}; every shape stays on eager PyTorch", err=True)
            machine = None
        worker_box: list = []  # the evaluation worker, then the searches' factory (runner.SearchFactory)

        def make_bench_for(cache_, machine_, seconds_left):
            from fusetune.runner import SearchFactory
            from fusetune.worker import Worker
            if not worker_box:
                worker_box.append(Worker())
                worker_box.append(SearchFactory(cache_, machine_, worker_box[0], echo=reporter.line, reporter=reporter))
            factory = worker_box[1]
            factory.build_timeout = factory.open_timeout = max(1.0, seconds_left)
            return factory
        with reporter:
            with phases("storage") if storage else contextlib.nullcontext():
                store = _storage_for_deploy(storage, strict)
            report = ensure_tuned(Path(config_dir), cache, budget, make_bench_for, machine, reporter=reporter,
                                  storage=store, phases=phases)
        with phases("close"):
            for w in reversed(worker_box):
                w.close()
            if store is not None:
                store.close()
    except Exception as exc:  # never break a deploy unless asked to
        if strict:
            raise
        click.echo(f"tune-on-deploy: unexpected error, everything falls back to eager PyTorch: {exc}", err=True)
        if as_json:
            click.echo(documents.dumps(documents.deploy_document(DeployReport(fallback=[f"unexpected error: {exc}"]))))
        _show_timings(phases, timings)
        sys.exit(0)
    with phases("output"):
        if as_json:
            click.echo(documents.dumps(documents.deploy_document(report)))
        else:
            click.echo(f"tune-on-deploy: {len(report.cached)} cached, {len(report.tuned)} tuned, "
                       f"{len(report.fallback)} on eager PyTorch ({report.seconds:.2f} s)")
            for line in report.fallback:
                click.echo(f"  fallback: {line}")
    if not report.configs:
        why = f"no configs (*.yaml, *.yml) in {config_dir}: nothing was tuned (is it the right folder?)"
        click.echo(f"error: {why}" if strict else f"fusetune: warning: {why}", err=True)
    _show_timings(phases, timings)
    sys.exit(1 if strict and not report.ok else 0)


def _show_timings(phases: Any, shown: bool) -> None:
    """``deploy --timings``: each phase's seconds (``fusetune.deploy.Phases``) on stderr."""
    if shown:
        click.echo("fusetune deploy: timings", err=True)
        for line in phases.lines():
            click.echo(line, err=True)


@main.command()
@click.argument("config", type=click.Path())
@click.option("--shape", "shapes", type=SHAPE, multiple=True,
              help="Benchmark this configured shape (default: the first).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the results here.")
@click.option("--reps", type=click.IntRange(min=5), default=50, show_default=True, help="Timed runs per method.")
@click.pass_context
@_fail_cleanly
def bench(ctx: click.Context, config: str, shapes: tuple[Shape, ...], json_path: str | None, reps: int) -> None:
    """Time eager PyTorch, torch.compile and the tuned winner in one process."""
    from fusetune.bench import run_bench, table

    spec = load_config(config)
    chosen = _select_shapes(spec, shapes) if shapes else [spec.shapes[0]]
    reporter = _reporter(ctx)
    results = [run_bench(spec, shape, _cache(ctx), reps=reps, echo=reporter.line) for shape in chosen]
    click.echo(table(results))
    if json_path:
        from fusetune import documents
        from fusetune.cache import atomic_write_text
        atomic_write_text(Path(json_path), documents.dumps(results) + "\n")


@main.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path())
@click.option("--storage", metavar="URL", envvar="FUSETUNE_STORAGE", required=True,
              help="The fleet's PostgreSQL URL (default: $FUSETUNE_STORAGE).")
@click.option("--shape", "shapes", type=SHAPE, multiple=True,
              help="Queue only this configured shape (N,C,...); repeatable.")
@click.option("--gpu", "gpus", multiple=True,
              help="GPU type to tune for, as torch.cuda.get_device_name() says it; repeatable (default: this GPU's).")
@_fail_cleanly
def submit(configs: tuple[str, ...], storage: str, shapes: tuple[Shape, ...], gpus: tuple[str, ...]) -> None:
    """Queue every shape of each CONFIG for the fleet's workers (`fusetune worker`)."""
    from fusetune.fleet import Queue

    specs = [load_config(c) for c in expand_configs(configs)]
    selected = _select_for_all(specs, shapes)
    if not gpus:
        from fusetune.search import Machine
        try:
            gpus = (Machine.detect().gpu,)  # the name a worker on such a GPU claims by
        except FusetuneError:
            raise _Refused("no GPU here to name the jobs' GPU type: pass --gpu NAME as "
                           "torch.cuda.get_device_name() says it (e.g. 'NVIDIA H100 80GB HBM3')") from None
    queue = Queue(_storage(storage))
    added = already = 0
    for spec, spec_shapes in selected:
        counts = queue.submit(spec, Path(spec.path).read_text(encoding="utf-8"), spec_shapes, gpus)
        added, already = added + counts[0], already + counts[1]
    click.echo(f"queued {added} jobs ({already} already queued or running) for {', '.join(gpus)}")


@main.command()
@click.option("--storage", metavar="URL", envvar="FUSETUNE_STORAGE", required=True,
              help="The fleet's PostgreSQL URL (default: $FUSETUNE_STORAGE).")
@click.option("--gpus", default="all", show_default=True,
              help="Which GPUs get a worker process: all, a count N, or indices like 0,1.")
@click.option("--trials", type=click.IntRange(min=1), help="Trials per shape (default: the config's).")
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds per shape (default: the config's).")
@click.option("--job-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds one candidate may take to verify and time before its process is killed.")
@click.option("--wait", is_flag=True, help="Keep waiting for new jobs instead of ending when the queue is empty.")
@click.option("--one", is_flag=True, hidden=True, help="Run in this process on its visible GPU (per-GPU children).")
@click.pass_context
@_fail_cleanly
def worker(ctx: click.Context, storage: str, gpus: str, trials: int | None, timeout: float | None,
           job_timeout: float, wait: bool, one: bool) -> None:
    """Tune the fleet's queued jobs of this host's GPU type(s), one process per GPU, until none is left."""
    from fusetune import fleet
    from fusetune.search import Machine, check_memory

    if not one:
        import torch

        Machine.detect()  # no GPU here: said as search says it (exit 3), before any child starts
        devices = fleet.parse_gpus(gpus, torch.cuda.device_count())
        args = ([f"--cache-dir={ctx.obj['cache_dir']}"] if ctx.obj["cache_dir"] else []) + [
            "worker", "--one", f"--job-timeout={job_timeout}"] + (
            [f"--trials={trials}"] if trials else []) + ([f"--timeout={timeout}"] if timeout else []) + (
            ["--wait"] if wait else [])
        sys.exit(fleet.run_per_gpu(devices, args, echo=click.echo, env=fleet.storage_env(storage)))
    from fusetune.runner import SearchFactory
    from fusetune.worker import Worker

    machine, cache, store = Machine.detect(), _cache(ctx), _storage(storage)
    # Plain lines on stdout with the worker's others, never a live display: a worker per GPU shares the terminal.
    alive = make_reporter(ctx.obj["verbosity"], progress=False, echo=click.echo)  # builds' and slow jobs' heartbeat
    with Worker() as evaluator, SearchFactory(cache, machine, evaluator, job_timeout=job_timeout, echo=click.echo,
                                              reporter=alive, lazy=False) as factory:
        def make(plan_, shape_):
            import torch

            check_memory(plan_.spec, shape_, torch.cuda.mem_get_info()[0])  # too large: this job fails, not all
            return factory(plan_, shape_)
        summary = fleet.work(store, machine, cache, make, trials=trials, timeout=timeout, wait=wait, echo=click.echo)
    click.echo(f"worker done: {len(summary.done)} jobs done, {len(summary.failed)} failed, "
               f"{len(summary.lost)} finished by another worker")
    sys.exit(1 if summary.failed else 0)


@main.command()
@click.option("--storage", metavar="URL", envvar="FUSETUNE_STORAGE", required=True,
              help="The fleet's PostgreSQL URL (default: $FUSETUNE_STORAGE).")
@click.option("--json", "as_json", is_flag=True, help="The jobs by state and the winners as one JSON document.")
@_fail_cleanly
def queue(storage: str, as_json: bool) -> None:
    """The fleet's jobs by state (queued, running with its worker and lease, done, failed) and winners."""
    from fusetune import documents, queue_status
    from fusetune.storage import redact

    status = queue_status.queue_status(_storage(storage))
    if as_json:
        click.echo(documents.dumps(queue_status.status_document(status, redact(storage))))
        return
    for line in queue_status.status_lines(status, redact(storage)):
        click.echo(line)


@main.command()
@click.argument("target", metavar="CONFIG|KEY")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="The HTML file to write.")
@click.option("--bench", "bench_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A `fusetune bench --json` file: the winner beside eager and torch.compile; repeatable.")
@_storage_option
@click.pass_context
@_fail_cleanly
def report(ctx: click.Context, target: str, out: str, bench_files: tuple[str, ...], storage: str | None) -> None:
    """Write one self-contained HTML page (no network needed) on the search of CONFIG or a cache KEY:
    best time over trials per world, outcomes, parameter importances, the winner beside PyTorch."""
    from fusetune.report import write_report

    sections = write_report(target, _cache(ctx), Path(out), bench_files, _storage(storage))
    click.echo(f"wrote {out}: {len(sections)} cache entr{'y' if len(sections) == 1 else 'ies'} "
               f"({', '.join(s.title for s in sections)})")


@main.command("import")
@click.argument("model")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the configs (<stem>_chain<i>.yaml) and the map (<stem>.map.json).")
@click.option("--inputs", "inputs", type=SHAPE, multiple=True,
              help="Example input shape N,C,H,W (for package.module:factory; repeatable, one per input).")
@click.option("--force", is_flag=True,
              help="Overwrite configs edited since an earlier import wrote them (or that no import recorded).")
@click.option("--eval", "eval_mode", is_flag=True,
              help="Import the model in eval mode (model.eval(): batch norms from their running statistics, dropout "
                   "off), as inference runs it; by default, the mode it is built in (training, for a new module).")
@click.pass_context
@_fail_cleanly
def import_(ctx: click.Context, model: str, out_dir: str, inputs: tuple[Shape, ...], force: bool,
            eval_mode: bool) -> None:
    """Find MODEL's convolution chains and write one config per chain (MODEL: a KernelBench-style
    file, or package.module:factory with --inputs).

    Importing into a folder again overwrites the configs an earlier import wrote and the map, but refuses
    (exit 2, nothing written) where a config differs from what that import wrote (the map records each
    config's sha256): an edit of yours, or a file no import wrote. --force overwrites them, said. A config
    the earlier import wrote that this one does not is left as it is, said."""
    # At once, on stderr: torch's import, the model's construction, tracing and checking the trace take
    # seconds (a ResNet's tens) in which nothing else would show.
    _reporter(ctx).line("fusetune import: building the model, tracing it and checking the trace on its example inputs")
    from fusetune.importer import import_model

    result = import_model(model, Path(out_dir), list(inputs), force=force, eval_mode=eval_mode)
    for line in result.lines:
        click.echo(line)


if __name__ == "__main__":
    main()
