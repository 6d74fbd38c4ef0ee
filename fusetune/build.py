"""Build rendered modules with ``torch.utils.cpp_extension.load`` (ninja), each in a killable child process.

Why a child process: a build can hang or run long, and must be stoppable at a time limit
without leaving the parent in an unknown state. Why one directory per module: builds that
share one serialise on torch's lock file, and a killed build leaves that lock behind, which
hangs the next build. The parent holds an fcntl lock per module (one build of it at a time on the
host), and the child one on its build directory, which it holds for as long as it builds: any torch
lock the child finds while holding its own is stale and removed. The child's lock matters where the
parent's was released by the parent's death (a fleet worker killed with SIGKILL) while its build went
on: the next build of the module waits for it, rather than losing its torch lock to it. The child and
its compilers also die with the parent (``_die_with_parent``): an orphaned build is work nobody reads.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from fusetune.cache import Cache
from fusetune.codegen import RenderedModule
from fusetune.errors import FusetuneError
from fusetune.lifeline import child_env, die_with_parent_from_env
from fusetune.progress import Reporter

#: Build processes running now, so Ctrl-C can kill those started from other threads.
_LIVE: set[subprocess.Popen] = set()
BUILT_MARKER = "fusetune.built"
FAILED_MARKER = "fusetune.failed"  # holds the log of a failed build: the same sources fail again
#: Beside the .so: the PREBUILT_KEYS it was built for (the generated model.py writes it, and reads it
#: before importing a finished build: the folder's name holds the architecture alone).
BUILD_STAMP = "fusetune.stamp.json"


def finished(build_dir: Path, arch: str | None) -> bool:
    """Whether ``build_dir`` holds a finished build (BUILT_MARKER) for this torch, CUDA and Python (and
    ``arch``, where given) by its BUILD_STAMP. A build without a stamp, or stamped for another torch,
    is not finished: it is built again (a torch upgrade changes the extension ABI)."""
    from fusetune.winners import PREBUILT_KEYS, software_fields

    if not (build_dir / BUILT_MARKER).exists():
        return False
    try:
        stamp = json.loads((build_dir / BUILD_STAMP).read_text())
    except (OSError, ValueError):
        return False
    wanted = {**software_fields(), **({"arch": arch} if arch else {})}
    return isinstance(stamp, dict) and all(str(stamp.get(k)) == wanted[k] for k in PREBUILT_KEYS if k in wanted)


def _stamp(build_dir: Path, arch: str | None) -> None:
    """Stamp a build that just finished (its child ran this very Python and torch). The generated
    model.py stamps its own builds (with the architecture it built for, where ``arch`` is None); a
    stamp left by a build for another torch is replaced."""
    from fusetune.winners import software_fields

    try:
        old = json.loads((build_dir / BUILD_STAMP).read_text())
    except (OSError, ValueError):
        old = {}
    old = old if isinstance(old, dict) else {}
    (build_dir / BUILD_STAMP).write_text(json.dumps({**old, **software_fields(), **({"arch": arch} if arch else {})}))


@dataclasses.dataclass(frozen=True)
class BuildResult:
    name: str
    ok: bool
    seconds: float
    log: str
    module_dir: Path
    build_dir: Path
    cached: bool = False


def load_generated(module_dir: Path) -> ModuleType:
    """Import a rendered ``model.py`` by path, under a name from its folder's (a module's unique name in the cache).
    A module already imported from that same file is reused; one of another folder of the same name is not (it
    would be another chain's code)."""
    path = (Path(module_dir) / "model.py").resolve()
    name = f"fusetune_generated_{Path(module_dir).name}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import generated module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build(rendered: RenderedModule, cache: Cache, timeout: float = 900.0, arch: str | None = None,
          force: bool = False, reporter: Reporter | None = None) -> BuildResult:
    """Build one module unless a build of the same sources finished (or failed: unless ``force``).
    ``reporter`` shows that a build which runs is alive (nvcc can take a minute)."""
    module_dir = rendered.write(cache.module_dir(rendered.name))
    # One build per architecture: a cache shared by several GPU kinds must not reuse a .so.
    build_dir = cache.build_dir(f"{rendered.name}-sm{arch.replace('.', '')}" if arch else rendered.name)
    marker = build_dir / BUILT_MARKER
    failed = build_dir / FAILED_MARKER
    if finished(build_dir, arch):
        return BuildResult(rendered.name, True, 0.0, "", module_dir, build_dir, cached=True)
    if failed.exists() and not force:
        return BuildResult(rendered.name, False, 0.0, failed.read_text(), module_dir, build_dir, cached=True)
    with cache.lock(f"build-{rendered.name}"):
        if finished(build_dir, arch):  # another process finished it while we waited
            return BuildResult(rendered.name, True, 0.0, "", module_dir, build_dir, cached=True)
        marker.unlink(missing_ok=True)  # a build for another torch: model.py clears its outputs and builds
        build_dir.mkdir(parents=True, exist_ok=True)
        env = child_env({"TORCH_CUDA_ARCH_LIST": arch} if arch else {})
        start = time.perf_counter()
        with reporter.building(rendered.name) if reporter else contextlib.nullcontext():
            ok, stopped, log = _run_child([sys.executable, "-m", "fusetune.build", str(module_dir), str(build_dir)],
                                          env, timeout)
        seconds = time.perf_counter() - start
        if ok:
            _stamp(build_dir, arch)
            marker.write_text(f"{seconds:.1f}\n")
            failed.unlink(missing_ok=True)
        elif not stopped:  # a compiler error is for good; a timeout or a kill may pass another time
            failed.write_text(log)
        return BuildResult(rendered.name, ok, seconds, log, module_dir, build_dir)


def load_kernels(generated: ModuleType, build_dir: str, arch: str | None) -> None:
    """Load a built module's kernels under the flags they were built with. torch derives nvcc's
    -gencode flags from TORCH_CUDA_ARCH_LIST (else from the GPU it sees), and ninja rebuilds every
    unit whose command changed: a worker loading without the variable rebuilt the whole module, a large
    part of a cold search."""
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    try:
        generated.load_kernels(build_directory=build_dir)
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


def build_and_load(rendered: RenderedModule, cache: Cache, arch: str | None) -> ModuleType:
    """Build (or reuse) a module and import it with its kernels loaded; FusetuneError if the build fails."""
    built = build(rendered, cache, arch=arch)
    if not built.ok:
        raise FusetuneError(f"module {rendered.name} failed to build:\n{built.log[-2000:]}")
    generated = load_generated(built.module_dir)
    load_kernels(generated, str(built.build_dir), arch)
    return generated


def build_many(modules: list[RenderedModule], cache: Cache, timeout: float = 900.0, arch: str | None = None,
               jobs: int | None = None, force: bool = False, reporter: Reporter | None = None) -> list[BuildResult]:
    """Build several modules at once (each child runs ninja itself).

    Ctrl-C reaches only the main thread: it kills every running build's process group and
    cancels the builds not yet started, instead of waiting for them.
    """
    jobs = jobs or max(1, min(len(modules), (os.cpu_count() or 2) // 4 or 1))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(build, m, cache, timeout, arch, force, reporter) for m in modules]
        return [f.result() for f in futures]
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(_LIVE):
            _kill_group(proc)
        raise
    finally:
        pool.shutdown(wait=False)


#: Signals that stop a build from outside (build_many's Ctrl-C kills every running build with SIGKILL;
#: the OOM killer), unlike a crash of the child itself (SIGSEGV), which is remembered.
STOP_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: What a compiler killed under the build leaves in ninja's output: the OOM killer takes the largest
#: process, cicc or ptxas, and the child then fails as on a compiler error (exit status 1).
KILLED_COMPILER = re.compile(r"died due to signal (9|15)\b|Killed signal terminated program")


def _run_child(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[bool, bool, str]:
    """Run ``cmd`` in its own process group: (succeeded, stopped from outside, the end of its output).
    Stopped from outside: timed out, or it or one of its compilers killed (STOP_SIGNALS,
    KILLED_COMPILER): not the sources' fault, so not to be remembered as a failure."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    _LIVE.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)  # nvcc and ninja too
        out, _ = proc.communicate()
        return False, True, f"build timed out after {timeout:.0f} s\n{out[-4000:]}"
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    finally:
        _LIVE.discard(proc)
    if -proc.returncode in STOP_SIGNALS:
        return False, True, f"build killed by signal {-proc.returncode}\n{out[-4000:]}"
    if proc.returncode != 0 and KILLED_COMPILER.search(out):
        return False, True, f"a compiler of the build was killed\n{out[-4000:]}"
    return proc.returncode == 0, False, out[-8000:]


def stop_running() -> None:
    """Kill every build running in this process, with its compilers: a command that is done leaves no build
    behind for its exit to wait on (builds run in pool threads, which the interpreter joins at exit). A build
    stopped so is not remembered as failed: the next search that needs it builds it."""
    for proc in list(_LIVE):
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: The build child's own lock, in its build directory (see the module's docstring).
BUILDER_LOCK = "fusetune-builder.lock"


def _die_with_parent() -> None:
    """In the build child (started with ``child_env``, leading its own process group): when the parent
    dies, the kernel sends SIGTERM, on which the child kills its group, ninja and nvcc with it."""
    if die_with_parent_from_env(signal.SIGTERM):
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))


def _main(argv: list[str]) -> int:
    module_dir, build_dir = Path(argv[0]), argv[1]
    _die_with_parent()
    with open(Path(build_dir) / BUILDER_LOCK, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released by the kernel when this process dies
        (Path(build_dir) / "lock").unlink(missing_ok=True)  # torch's FileBaton from a killed build
        generated = load_generated(module_dir)
        generated.load_kernels(build_directory=build_dir)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
