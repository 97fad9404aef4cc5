"""``python -m pgqueue_cli``: the same as the ``pgqueue`` command."""

from pgqueue_cli.main import run

run()
