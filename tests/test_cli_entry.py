"""The ways in: ``python -m fusetune`` and ``-h`` work as a user types them."""
from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from fusetune.cli import main

from conftest import ROOT


def test_python_dash_m_fusetune_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "fusetune", "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: fusetune ") and "search" in done.stdout


def test_dash_h_is_help_for_the_group_and_every_command():
    runner = CliRunner()
    assert runner.invoke(main, ["-h"]).exit_code == 0
    for command in main.commands:
        result = runner.invoke(main, [command, "-h"])
        assert result.exit_code == 0 and "Usage:" in result.output, (command, result.output)
