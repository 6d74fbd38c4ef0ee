"""The ``fusetune`` command line."""
from __future__ import annotations

import contextlib
import functools
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import click

from fusetune.cache import Cache, CacheWarning, default_root
from fusetune.config import ProblemSpec, load_config
from fusetune.errors import ConfigError, FusetuneError
from fusetune.ops import Shape


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
    return click.confirm(question)


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
    return wrapper


def _parse_shape(text: str) -> Shape:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 128,3,16,32,32, got {text!r}") from None


def _select_shapes(spec: ProblemSpec, wanted: tuple[str, ...]) -> list[Shape]:
    if not wanted:
        return list(spec.shapes)
    shapes = []
    for text in wanted:
        shape = _parse_shape(text)
        if shape not in spec.shapes:
            configured = "; ".join(",".join(map(str, s)) for s in spec.shapes)
            raise ConfigError(spec.path, "shapes", f"--shape {text} is not among the configured shapes ({configured})")
        shapes.append(shape)
    return shapes


def _select_for_all(specs: list[ProblemSpec], wanted: tuple[str, ...]) -> list[tuple[ProblemSpec, list[Shape]]]:
    """With several configs, each ``--shape`` applies to the configs that list it, and must match one."""
    if len(specs) == 1 or not wanted:
        return [(spec, _select_shapes(spec, wanted)) for spec in specs]
    parsed = [_parse_shape(text) for text in wanted]
    for text, shape in zip(wanted, parsed):
        if not any(shape in spec.shapes for spec in specs):
            raise ConfigError(", ".join(s.path for s in specs), "shapes", f"--shape {text} is in none of the configs")
    return [(spec, [s for s in parsed if s in spec.shapes]) for spec in specs]


def _cache(ctx: click.Context) -> Cache:
    return Cache(ctx.obj["cache_dir"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cache-dir", type=click.Path(file_okay=False), envvar="FUSETUNE_CACHE_DIR", default=None,
              help=f"Cache directory (default: $FUSETUNE_CACHE_DIR or {default_root()}).")
@click.version_option(package_name="fusetune")
@click.pass_context
def main(ctx: click.Context, cache_dir: str | None) -> None:
    """Autotune fused convolution epilogues on NVIDIA GPUs."""
    ctx.ensure_object(dict)
    ctx.obj["cache_dir"] = cache_dir


@main.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="One JSON document: per config its regions, worlds and space.")
@_fail_cleanly
def plan(configs: tuple[str, ...], as_json: bool) -> None:
    """Show how each config's chain is fused and the space searched (no GPU needed)."""
    from fusetune.codegen import plan_space
    from fusetune.plan import make_plan

    documents = []
    for spec in [load_config(c) for c in configs]:
        plan_ = make_plan(spec)
        space = plan_space(plan_)
        if as_json:
            documents.append(_plan_document(spec, plan_, space))
            continue
        click.echo(f"{spec.name}: {plan_.describe()}")
        for line in plan_.regions():
            click.echo(f"  {line}")
        for impl, reason in plan_.unoffered.items():
            click.echo(f"  no {impl} world: {reason}")
        for family in space.families:
            for p in family.params:
                kind = "compile-time" if p.compile_time else "run-time"
                when = f" [when {p.when or family.when}]" if (p.when or family.when) else ""
                click.echo(f"  {family.family}.{p.name}: {list(p.choices)} default {p.default} ({kind}){when} - {p.doc}")
        click.echo(f"  {sum(1 for _ in space.all())} distinct candidates (before each shape's constraints)")
    if as_json:
        click.echo(json.dumps(documents, indent=1))


def _plan_document(spec, plan_, space) -> dict:
    """What ``fusetune plan`` shows, as data: the fused region and the PyTorch tail (each op with the
    config entries it stands for), why the kernels stop, the worlds offered with their stages, the
    worlds not offered with why, and the size of the space."""
    def steps(region) -> list[dict]:
        return [{"op": step.op.kind, "entries": list(step.entries)} for step in region]
    return {"config": spec.path, "name": spec.name, "fused": steps(plan_.head), "pytorch": steps(plan_.tail),
            "ends": plan_.ends, "worlds": {impl: list(stages) for impl, stages in plan_.impl_stages.items()},
            "not_offered": plan_.unoffered, "candidates": sum(1 for _ in space.all())}


@main.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path())
@click.option("--shape", "shapes", multiple=True, help="Tune only this configured shape (N,C,...); repeatable.")
@click.option("--trials", type=click.IntRange(min=1), help="Trials per shape (default: the config's).")
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds per shape (default: the config's).")
@click.option("--force", is_flag=True, help="Ignore cached winners and re-run known outcomes.")
@click.option("--job-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds one candidate may take to verify and time before its worker is killed.")
@click.pass_context
@_fail_cleanly
def search(ctx: click.Context, configs: tuple[str, ...], shapes: tuple[str, ...], trials: int | None,
           timeout: float | None, force: bool, job_timeout: float) -> None:
    """Tune every shape of each CONFIG and cache the winners."""
    from fusetune.runner import GpuBenchmarker
    from fusetune.search import Machine, check_memory, tune_shape
    from fusetune.worker import Worker

    specs = [load_config(c) for c in configs]  # all configs valid before any work starts
    selected = _select_for_all(specs, shapes)
    machine = Machine.detect()  # before the cache: a machine without a GPU is left as it was
    cache = _cache(ctx)
    import torch

    free, _ = torch.cuda.mem_get_info()
    for spec, spec_shapes in selected:
        for shape in spec_shapes:
            check_memory(spec, shape, free)
    click.echo(f"fusetune: {machine.gpu} (sm_{machine.capability.replace('.', '')}), CUDA {machine.cuda}, "
               f"torch {machine.torch}; cache {cache.root}")
    rows = []
    with Worker() as worker:
        for spec, spec_shapes in selected:
            for shape in spec_shapes:
                click.echo(f"{spec.name} {list(shape)}")

                def make(plan_, shape_, spec_=spec):
                    return GpuBenchmarker(plan_, shape_, cache, machine, worker, job_timeout=job_timeout,
                                          force=force, echo=click.echo)
                result = tune_shape(spec, shape, cache, machine, make, trials=trials, timeout=timeout,
                                    force=force, echo=click.echo)
                rows.append((spec.name, result))
                if result.timings:
                    click.echo("  time: " + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in result.timings.items()))
    click.echo(_summary(rows))
    if any(r.status == "failed" for _, r in rows):
        sys.exit(1)


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
@click.option("--shape", "shapes", multiple=True, help="Export this configured shape's winner (default: all).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--gpu", default=None, help="Export winners tuned on this GPU (default: this machine's, if any).")
@click.pass_context
@_fail_cleanly
def export_cmd(ctx: click.Context, config: str, shapes: tuple[str, ...], out_dir: str, gpu: str | None) -> None:
    """Write CONFIG's tuned kernels as a self-contained module."""
    from fusetune.export import export

    spec = load_config(config)
    chosen = _select_shapes(spec, shapes)
    if gpu is None:
        gpu = _this_gpu()
    target = export(spec, chosen, _cache(ctx), Path(out_dir), gpu)
    click.echo(f"exported {spec.name} to {target} (import {target.name}.model and use ModelNew)")


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
@click.pass_context
@_fail_cleanly
def cache_list(ctx: click.Context) -> None:
    """One line per cached (problem, shape, machine)."""
    entries = _cache(ctx.parent).entries()
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
@click.pass_context
@_fail_cleanly
def cache_show(ctx: click.Context, key: str) -> None:
    """Everything stored for KEY (a key prefix or a config name): fields, winner, each outcome."""
    found = _cache(ctx.parent).find(key)
    if not found:
        raise FusetuneError(f"no cache entry matches {key!r}; see `fusetune cache list`")
    for e in found:
        click.echo(json.dumps({"key": e.key, "fields": e.fields, "winner": e.winner}, indent=1))
        for ckey, o in sorted(e.outcomes.items(), key=lambda item: item[1].get("time_ms") or float("inf")):
            t = f"{o['time_ms']:.4f} ms" if o.get("time_ms") else ""
            log = (o.get("log") or "").strip().splitlines()
            click.echo(f"  {o['status']:13s} {t:>12s}  {ckey}" + (f"\n      {log[-1][:400]}" if log else ""))


@cache_group.command(name="clear")
@click.argument("keys", nargs=-1)
@click.option("--yes", is_flag=True, help="Do not ask (needed where nobody can answer, as in a script).")
@click.pass_context
@_fail_cleanly
def cache_clear(ctx: click.Context, keys: tuple[str, ...], yes: bool) -> None:
    """Remove the entries matching KEYS (prefixes or config names), or everything; lists them and
    asks first unless --yes."""
    if any(not k.strip() for k in keys):  # a prefix of every key
        raise _Refused("an empty KEY matches every entry; to remove everything, run `fusetune cache clear` "
                       "without KEY")
    cache = _cache(ctx.parent)
    if keys:
        found = {e.key: e for k in keys for e in cache.find(k)}
        if not found:
            raise FusetuneError(f"no cache entry matches {', '.join(keys)}")
        for key in sorted(found):
            click.echo(_entry_line(found[key]))
        if not _confirm(f"remove these {len(found)} entries and their studies?", yes):
            click.echo("nothing removed")
            return
        click.echo(f"removed {cache.clear(sorted(found))} entries")
        return
    if not _confirm(f"remove everything under {cache.root}?", yes):
        return
    click.echo(f"removed {cache.clear()} entries")


@main.command()
@click.argument("config_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--budget", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds for tuning all untuned shapes together.")
@click.option("--strict", is_flag=True, help="Exit 1 if any shape falls back to eager PyTorch, or there is no config.")
@click.pass_context
@_one_line_warnings
def deploy(ctx: click.Context, config_dir: str, budget: float, strict: bool) -> None:
    """Make sure every shape of every config in CONFIG_DIR is tuned for this GPU."""
    from fusetune.deploy import ensure_tuned
    from fusetune.search import Machine

    if not Path(config_dir).is_dir():  # click checks it too; a folder gone since is as mistyped
        click.echo(f"error: {config_dir}: no such folder of configs", err=True)
        sys.exit(2)
    try:
        cache = _cache(ctx)
        try:
            machine = Machine.detect()
        except FusetuneError:
            machine = None
        worker_box: list = []

        def make_bench_for(cache_, machine_, seconds_left):
            from fusetune.runner import GpuBenchmarker
            from fusetune.worker import Worker
            if not worker_box:
                worker_box.append(Worker())
            return lambda plan_, shape_: GpuBenchmarker(plan_, shape_, cache_, machine_, worker_box[0],
                                                        build_timeout=max(1.0, seconds_left),
                                                        open_timeout=max(1.0, seconds_left), echo=click.echo)
        report = ensure_tuned(Path(config_dir), cache, budget, make_bench_for, machine, echo=click.echo)
        for w in worker_box:
            w.close()
    except Exception as exc:  # never break a deploy unless asked to
        if strict:
            raise
        click.echo(f"tune-on-deploy: unexpected error, everything falls back to eager PyTorch: {exc}", err=True)
        sys.exit(0)
    click.echo(f"tune-on-deploy: {len(report.cached)} cached, {len(report.tuned)} tuned, "
               f"{len(report.fallback)} on eager PyTorch")
    for line in report.fallback:
        click.echo(f"  fallback: {line}")
    if not report.configs:
        why = f"no configs (*.yaml, *.yml) in {config_dir}: nothing was tuned (is it the right folder?)"
        click.echo(f"error: {why}" if strict else f"fusetune: warning: {why}", err=True)
    sys.exit(1 if strict and not report.ok else 0)


@main.command()
@click.argument("config", type=click.Path())
@click.option("--shape", "shapes", multiple=True, help="Benchmark this configured shape (default: the first).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the results here.")
@click.option("--reps", type=click.IntRange(min=5), default=50, show_default=True, help="Timed runs per method.")
@click.pass_context
@_fail_cleanly
def bench(ctx: click.Context, config: str, shapes: tuple[str, ...], json_path: str | None, reps: int) -> None:
    """Time eager PyTorch, torch.compile and the tuned winner in one process."""
    from fusetune.bench import run_bench, table

    spec = load_config(config)
    chosen = _select_shapes(spec, shapes) if shapes else [spec.shapes[0]]
    results = [run_bench(spec, shape, _cache(ctx), reps=reps, echo=click.echo) for shape in chosen]
    click.echo(table(results))
    if json_path:
        from fusetune.cache import atomic_write_text
        atomic_write_text(Path(json_path), json.dumps(results, indent=1) + "\n")


@main.command("import")
@click.argument("model")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the configs (<stem>_chain<i>.yaml) and the map (<stem>.map.json).")
@click.option("--inputs", "inputs", multiple=True,
              help="Example input shape N,C,H,W (for package.module:factory; repeatable, one per input).")
@_fail_cleanly
def import_(model: str, out_dir: str, inputs: tuple[str, ...]) -> None:
    """Find MODEL's convolution chains and write one config per chain (MODEL: a KernelBench-style
    file, or package.module:factory with --inputs)."""
    from fusetune.importer import import_model

    result = import_model(model, Path(out_dir), [_parse_shape(text) for text in inputs])
    for line in result.lines:
        click.echo(line)


if __name__ == "__main__":
    main()
