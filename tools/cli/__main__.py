"""``python -m tools.cli`` runs the ``statelog`` command line (same as ``python -m tools``)."""

from tools.cli import run

run()
