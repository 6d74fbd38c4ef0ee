"""``python -m fusetune`` in a process of its own, on a machine named by ``$FUSETUNE_TEST_MACHINE`` (the JSON
list of tests/fake_handlers.MACHINE_FIELDS): ``Machine.detect`` is replaced as fusetune.search loads, so
nothing is imported sooner than in a real run. At its exit it writes the names of the modules the command
loaded (a JSON list) to ``$FUSETUNE_TEST_MODULES``: what a deploy of stored winners starts, as a user's
process would.

``run`` starts it from a test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

MACHINE_ENV = "FUSETUNE_TEST_MACHINE"
MODULES_ENV = "FUSETUNE_TEST_MODULES"
#: What a deploy of stored winners must not load: the search (optuna), what builds or compiles (a compiler's
#: extension loader, inductor, triton and the sympy they need), the live display, the evaluation process and
#: the build pool.
NOT_LOADED = ("optuna", "torch.utils.cpp_extension", "torch._inductor", "triton", "sympy", "rich",
              "fusetune.runner", "fusetune.worker", "fusetune.lazy")


def run(args: Sequence[str], machine: Sequence[str], modules_out: Path,
        env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``fusetune ARGS`` on ``machine``: the finished process and the modules it had loaded at its exit."""
    environment = {**os.environ, **(env or {}), MACHINE_ENV: json.dumps(list(machine)), MODULES_ENV: str(modules_out)}
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=300,
                          env=environment, cwd=Path(__file__).parent.parent)
    loaded = set(json.loads(modules_out.read_text())) if modules_out.exists() else set()
    return done, loaded


def _main() -> None:
    import atexit
    import importlib.abc
    import importlib.machinery
    import runpy

    fields = json.loads(os.environ[MACHINE_ENV])

    class FakeMachine(importlib.abc.MetaPathFinder):
        """Loads fusetune.search as usual, then makes its Machine.detect answer ``fields``."""

        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != "fusetune.search":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            assert spec is not None and spec.loader is not None
            load = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                load(module)
                module.Machine.detect = classmethod(lambda cls: cls(*fields))
            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, FakeMachine())
    atexit.register(lambda: Path(os.environ[MODULES_ENV]).write_text(json.dumps(sorted(sys.modules))))
    sys.argv[0] = "fusetune"
    runpy.run_module("fusetune", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
