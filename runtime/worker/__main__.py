"""``python -m runtime.worker {serve|spawn} FD``: how the job master starts local workers
(:mod:`runtime.worker.start`)."""

import sys

from runtime.worker.start import main

main(sys.argv[1:])
