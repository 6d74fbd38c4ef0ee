"""``python -m fusetune``: the same commands as the ``fusetune`` script."""
from fusetune.lifeline import die_with_parent_from_env

die_with_parent_from_env()  # a child of ``worker --gpus`` or ``search --gpus``: first, before the slow imports

from fusetune.cli import main  # noqa: E402

main(prog_name="fusetune")
