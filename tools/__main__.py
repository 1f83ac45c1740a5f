"""``python -m tools`` runs the ``statelog`` command line (same as ``python -m tools.cli``)."""

import sys

from tools.cli import main

sys.exit(main())
