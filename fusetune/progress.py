"""What a long command shows while it works: builds, trials and tune-on-deploy.

One reporter per command, made by ``make_reporter`` from the global ``-q``/``-v``/``--no-progress``
options and passed down (search, build, deploy call its hooks; nothing here is global state):

* ``RichReporter``: a live display on a terminal (spinner and elapsed time while a build runs,
  a bar with n of N, the best time so far and an ETA while trials run);
* ``PlainReporter``: one line per event, for logs and pipes; while a build runs (or a job of the
  evaluation process outlasts it), a heartbeat line every ``interval`` seconds, so a 40-second nvcc
  build or a torch.compile max-autotune is never silent for long;
* ``SilentReporter``: ``-q``, where only errors and the final result are printed.

Everything a reporter writes goes to stderr: stdout holds a command's result (a table or ``--json``).
"""
from __future__ import annotations

import abc
import contextlib
import logging
import sys
import threading
import time
from typing import Callable, Iterator, TextIO

#: Verbosity levels: ``-q``, the default, ``-v``.
QUIET, NORMAL, VERBOSE = 0, 1, 2
#: Seconds between a running build's heartbeat lines (plain output): the issue's bound is 5 s.
HEARTBEAT_S = 4.0
#: Seconds a wait (a job of the evaluation process) lasts before the live display shows it.
WAIT_SHOWN_S = 1.0
#: The ``logging`` level each verbosity level sets on the ``fusetune`` logger.
LOG_LEVELS = {QUIET: logging.ERROR, NORMAL: logging.INFO, VERBOSE: logging.DEBUG}


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3:07`` or ``1:02:07``: short, and readable at a glance."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta_seconds(elapsed: float, done: int, total: int, time_left: float | None = None) -> float | None:
    """Seconds until ``total`` trials at the pace so far, no later than ``time_left`` (the search's timeout)."""
    if done <= 0 or total <= done:
        return 0.0 if total <= done else time_left
    eta = elapsed / done * (total - done)
    return min(eta, time_left) if time_left is not None else eta


class Reporter(abc.ABC):
    """The hooks a command's work calls. Subclasses decide how (and whether) each is shown."""

    def __init__(self, level: int = NORMAL) -> None:
        self.level = level
        self._searches: dict[str, tuple[float, float | None]] = {}  # label -> (start, timeout)

    # -- lines ---------------------------------------------------------------------------
    @abc.abstractmethod
    def line(self, text: str) -> None:
        """An informational line (shown unless ``-q``)."""

    def debug(self, text: str) -> None:
        """A detail shown with ``-v`` only (each trial's outcome, timings)."""
        if self.level >= VERBOSE:
            self.line(text)

    # -- builds --------------------------------------------------------------------------
    @contextlib.contextmanager
    def building(self, name: str) -> Iterator[None]:
        """Around one build that runs now (not one found built): shows that it is alive."""
        yield

    @contextlib.contextmanager
    def waiting(self, name: str) -> Iterator[None]:
        """Around a wait that is mostly short but may be long (a job of the evaluation process: the
        float64 reference, torch.compile's max-autotune): said only once it has lasted a while."""
        yield

    # -- trials --------------------------------------------------------------------------
    def search_started(self, label: str, total: int, timeout: float | None = None) -> None:
        """``total`` trials of ``label`` are about to run, within ``timeout`` seconds."""
        self._searches[label] = (time.monotonic(), timeout)

    def trial_done(self, label: str, number: int, total: int, result: str, best_ms: float | None) -> None:
        """Trial ``number`` of ``total`` finished with ``result`` (``1.2345 ms`` or a failure status)."""

    def search_finished(self, label: str) -> None:
        self._searches.pop(label, None)

    def eta(self, label: str, done: int, total: int) -> float | None:
        start, timeout = self._searches.get(label, (time.monotonic(), None))
        elapsed = time.monotonic() - start
        return eta_seconds(elapsed, done, total, None if timeout is None else max(0.0, timeout - elapsed))

    # -- tune on deploy ------------------------------------------------------------------
    def deploy_item(self, number: int, total: int, label: str) -> None:
        """Tune-on-deploy reached shape ``number`` of ``total`` (a config's shape)."""

    def close(self) -> None:
        """Stop any live display; called once the command's work is done."""

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SilentReporter(Reporter):
    """``-q``: nothing but errors (printed by the command line) and the final result."""

    def __init__(self) -> None:
        super().__init__(QUIET)

    def line(self, text: str) -> None:
        pass

    def debug(self, text: str) -> None:
        pass


class PlainReporter(Reporter):
    """One line per event through ``echo``, for logs, pipes and ``--no-progress``."""

    def __init__(self, echo: Callable[[str], None] = print, level: int = NORMAL, interval: float = HEARTBEAT_S) -> None:
        super().__init__(level)
        self.echo, self.interval = echo, interval
        self._lock = threading.Lock()  # builds run in threads (build_many): one line at a time

    def line(self, text: str) -> None:
        with self._lock:
            self.echo(text)

    @contextlib.contextmanager
    def building(self, name: str) -> Iterator[None]:
        self.line(f"  building {name} ...")
        with self._beating(f"building {name}"):
            yield

    @contextlib.contextmanager
    def waiting(self, name: str) -> Iterator[None]:
        """No line for a wait shorter than the interval (most jobs): a trial's line says it ended."""
        with self._beating(name):
            yield

    @contextlib.contextmanager
    def _beating(self, what: str) -> Iterator[None]:
        """A line ``what: 8 s`` every ``interval`` until the block ends."""
        start = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.interval):
                self.line(f"  {what}: {format_seconds(time.monotonic() - start)}")
        ticker = threading.Thread(target=beat, name=f"fusetune-heartbeat-{what}", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def trial_done(self, label: str, number: int, total: int, result: str, best_ms: float | None) -> None:
        best = f"best {best_ms:.4f} ms" if best_ms is not None else "best -"
        eta = self.eta(label, number, total)
        left = f"eta {format_seconds(eta)}" if eta is not None else "eta ?"
        self.line(f"  trial {number:>3}/{total}  {result:<16s} {best}  {left}")

    def deploy_item(self, number: int, total: int, label: str) -> None:
        self.line(f"deploy {number}/{total}: {label}")


class RichReporter(Reporter):
    """A live display on a terminal (stderr): a spinner per running build, a bar per search.

    The display runs only while something is in progress, so an error raised between two
    searches is printed on a terminal left as it was (cursor shown, no display half drawn)."""

    def __init__(self, level: int = NORMAL, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        super().__init__(level)
        console = Console(file=stream or sys.stderr)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
                                 MofNCompleteColumn(), TextColumn("{task.fields[best]}"), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=console, refresh_per_second=4)
        self._tasks: dict[str, int] = {}
        self._live = 0  # tasks shown now
        self._lock = threading.RLock()

    def line(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _add(self, description: str, total: int | None) -> int:
        with self._lock:
            if self._live == 0:
                self.progress.start()
            self._live += 1
            return self.progress.add_task(description, total=total, best="")

    def _remove(self, task: int) -> None:
        with self._lock:
            if task not in self.progress.task_ids:  # closed already (an interrupt)
                return
            self.progress.remove_task(task)
            self._live -= 1
            if self._live == 0:
                self.progress.stop()

    @contextlib.contextmanager
    def building(self, name: str) -> Iterator[None]:
        task = self._add(f"building {_short(name)}", None)
        try:
            yield
        finally:
            self._remove(task)

    @contextlib.contextmanager
    def waiting(self, name: str) -> Iterator[None]:
        """A spinner row with its elapsed time once the wait has lasted ``WAIT_SHOWN_S``: most jobs end
        before it, and a row that came and went with each trial would make the display flicker."""
        shown: list[int] = []
        ended = threading.Event()

        def show() -> None:
            with self._lock:
                if not ended.is_set():
                    shown.append(self._add(_short(name), None))
        timer = threading.Timer(WAIT_SHOWN_S, show)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            with self._lock:
                ended.set()
                for task in shown:
                    self._remove(task)

    def search_started(self, label: str, total: int, timeout: float | None = None) -> None:
        super().search_started(label, total, timeout)
        self._tasks[label] = self._add("trials", total)  # the label is the line above

    def trial_done(self, label: str, number: int, total: int, result: str, best_ms: float | None) -> None:
        task = self._tasks.get(label)
        if task is not None:
            best = f"best {best_ms:.4f} ms" if best_ms is not None else ""
            self.progress.update(task, completed=number, total=total, best=best)

    def search_finished(self, label: str) -> None:
        """The bar goes; a line stays: how many trials ran, the best time, how long it took."""
        task = self._tasks.pop(label, None)
        if task is not None:
            shown = next(t for t in self.progress.tasks if t.id == task)
            elapsed = format_seconds(shown.elapsed or 0.0)
            best = f", {shown.fields['best']}" if shown.fields.get("best") else ""
            self._remove(task)
            self.line(f"  {label}: {int(shown.completed)}/{int(shown.total or 0)} trials{best} in {elapsed}")
        super().search_finished(label)

    def deploy_item(self, number: int, total: int, label: str) -> None:
        task = self._tasks.get("deploy")
        if task is None:
            task = self._tasks["deploy"] = self._add("deploy", total)
        self.progress.update(task, completed=number - 1, description=f"deploy {_short(label)}")

    def close(self) -> None:
        with self._lock:
            for task in list(self.progress.task_ids):
                self._remove(task)
            self._tasks.clear()


def _short(text: str, width: int = 32) -> str:
    """A name that leaves the bar room on an 80-column terminal."""
    return text if len(text) <= width else text[:width - 1] + "…"


def rich_available() -> bool:
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


def make_reporter(level: int = NORMAL, progress: bool = True, stream: TextIO | None = None,
                  echo: Callable[[str], None] | None = None) -> Reporter:
    """Silent for ``-q``; a live display where ``stream`` (default stderr) is a terminal and ``progress``
    is wanted; else plain lines through ``echo`` (default: a line to ``stream``)."""
    if level <= QUIET:
        return SilentReporter()
    stream = stream or sys.stderr
    if progress and _is_terminal(stream) and rich_available():
        return RichReporter(level, stream)
    if echo is None:
        def echo(text: str) -> None:
            stream.write(text + "\n")
            stream.flush()
    return PlainReporter(echo, level, HEARTBEAT_S)  # read now: a test shortens it


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream is no terminal
        return False


class _StderrHandler(logging.Handler):
    """Writes to the ``sys.stderr`` of the moment (a test runner swaps it), one line per record."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"fusetune: {record.levelname.lower()}: {self.format(record)}\n")
        except Exception:  # logging must never take a command down
            self.handleError(record)


def configure_logging(level: int) -> logging.Logger:
    """Set the ``fusetune`` logger to the verbosity (-q: errors, default: info, -v: debug), one handler."""
    logger = logging.getLogger("fusetune")
    logger.setLevel(LOG_LEVELS.get(level, logging.INFO))
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.propagate = False
    return logger
