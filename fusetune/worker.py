"""A long-lived, killable worker process that runs jobs on one GPU.

Why: an illegal memory access poisons the CUDA context of the process that ran it, and a
kernel can spin forever; catching an exception helps with neither. So candidates run in a
child process with a time limit per job. A crash, a hang or a sticky CUDA error costs
only that job: the child is replaced and the caller gets a typed outcome.

The job handler is named by ``"module:function"`` so tests can inject one that crashes or
hangs without a GPU. A handler returns a dict with at least ``status``; a result with
``"restart": True`` asks for a fresh process after it (the context is no longer usable).
"""
from __future__ import annotations

import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
import traceback
from typing import Any

#: prctl(2)'s option that asks for a signal when the parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: Seconds the next job waits for a warm-up's answer (Worker.warm: torch's import, a CUDA context).
WARM_TIMEOUT = 120.0


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` (SIGKILL: kill this process) when its parent dies (Linux; elsewhere a
    no-op). A build sends itself SIGTERM, which it handles by killing its compilers with it.

    A parent killed with SIGKILL (a fleet worker, a search) runs no cleanup: without this its
    evaluation process would stay on the GPU, perhaps spinning in a kernel that never ends. The signal
    comes when the parent's *thread* that started this process ends, so parents start these from a
    thread that outlives them (the main thread, or one that waits for them).
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request was made
        os._exit(1)


def _serve(conn: multiprocessing.connection.Connection, target: str, device: int | None, log_path: str,
           parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid)
    # What the process prints (compiler, CUDA, a native crash's stack) goes to a file the
    # parent reads when the process dies, so a crash outcome carries its cause.
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    module_name, func_name = target.split(":")
    handler = getattr(importlib.import_module(module_name), func_name)
    while True:
        try:
            job = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if job is None:
            return
        try:
            result = handler(job)
        except Exception:  # the handler's own bug: report, keep serving
            result = {"status": "crash", "log": traceback.format_exc()[-4000:], "restart": True}
        conn.send(result)
        if result.get("restart"):
            return


class Worker:
    """Parent-side handle. ``run`` never raises for what a job does; it returns an outcome."""

    def __init__(self, target: str = "fusetune.evaluate:handle", device: int | None = None) -> None:
        self.target = target
        self.device = device
        self.restarts = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._warming = False  # a warm-up sent whose answer is not read yet
        handle, self.log_path = tempfile.mkstemp(prefix="fusetune-worker-", suffix=".log")
        os.close(handle)

    def log_tail(self, chars: int = 6000) -> str:
        """The end of what the worker processes printed (native crashes included)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        with open(self.log_path, "w"):
            pass  # a fresh log for each process
        self._proc = self._ctx.Process(target=_serve, args=(child, self.target, self.device, self.log_path,
                                                            os.getpid()), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        self._warming = False

    def warm(self) -> None:
        """Start the evaluation process now and have it get ready (the handler's ``warm`` job: torch imported, a
        CUDA context made) while the caller does something else: a search builds its first module meanwhile,
        and its first job finds the process ready instead of waiting seconds for it. Returns at once; the next
        ``run`` reads the warm-up's answer first. From the thread that runs the jobs (the process is started
        here: see die_with_parent)."""
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            self._start()
        try:
            assert self._conn is not None
            self._conn.send({"kind": "warm"})
            self._warming = True
        except (BrokenPipeError, OSError):
            self._kill()

    def _warmed(self) -> None:
        """Read a warm-up's answer; a process that failed it, died or did not answer in WARM_TIMEOUT is replaced
        (the next job starts a fresh one)."""
        self._warming = False
        try:
            assert self._conn is not None
            answer = self._conn.recv() if self._conn.poll(WARM_TIMEOUT) else None
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            answer = None
        if answer is None or answer.get("status") != "ok" or answer.get("restart"):
            self._kill()

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run one job; ``timeout`` seconds after sending it the worker is killed and replaced."""
        if self._warming:
            self._warmed()
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
            self._kill()
            self._start()
        assert self._conn is not None
        start = time.monotonic()
        try:
            self._conn.send(job)
            if not self._conn.poll(timeout):
                self._kill()
                self.restarts += 1
                return {"status": "timeout", "log": f"no answer within {timeout:.0f} s; worker killed\n{self.log_tail()}"}
            result = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            if self._proc is not None:
                self._proc.join(timeout=5)
            code = self._proc.exitcode if self._proc is not None else None
            self._kill()
            self.restarts += 1
            return {"status": "crash", "log": f"worker died (exit code {code}) after {time.monotonic() - start:.1f} s\n"
                                              f"{self.log_tail()}"}
        if result.get("restart"):
            self._kill()
            self.restarts += 1
        return result

    def close(self) -> None:
        """Stop the worker and remove its log (at once where it is still warming up: nothing to finish)."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive() and not self._warming:
            try:
                self._conn.send(None)
                self._proc.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self._kill()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
