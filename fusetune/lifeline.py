"""Children started with ``subprocess`` (a worker per GPU, a search per shape) die with their parent.

A parent killed with SIGKILL runs no cleanup; without this its children would keep a GPU busy. The
child asks the kernel for it itself, at startup (``python -m fusetune`` calls ``die_with_parent_from_env``),
from the parent's pid that the parent put in its environment before starting it: a ``preexec_fn`` would
run between fork and exec, which is unsafe while other threads run (``search --gpus`` starts children
from several at once), and could only read the pid of a parent that may already be gone.
"""
from __future__ import annotations

import os
import signal
from typing import Mapping

#: The variable holding the pid of the process the child is to die with; the child removes it from
#: its environment, so that its own children (started by other means) do not inherit a stale pid.
PARENT_PID_ENV = "FUSETUNE_DIE_WITH_PARENT"


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``extra``, for a child that is to die with this process."""
    return {**os.environ, **extra, PARENT_PID_ENV: str(os.getpid())}


def die_with_parent_from_env(sig: int = signal.SIGKILL) -> bool:
    """In a child started with ``child_env``: be sent ``sig`` when the parent dies (SIGKILL: be killed), or exit
    at once if it died already (see ``worker.die_with_parent``); nothing for a process started otherwise.
    Whether it was such a child (a build then handles its SIGTERM: fusetune/build.py)."""
    text = os.environ.pop(PARENT_PID_ENV, "")
    if not text.isdigit():
        return False
    from fusetune.worker import die_with_parent

    die_with_parent(int(text), sig)
    return True
