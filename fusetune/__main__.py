"""``python -m fusetune``: the same commands as the ``fusetune`` script."""
from fusetune.cli import main

main(prog_name="fusetune")
