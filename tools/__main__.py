"""``python -m tools`` runs the ``statelog`` command line (same as ``python -m tools.cli``)."""

from tools.cli import run

run()
