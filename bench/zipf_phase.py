"""A Zipf-like phase of ``bench large``'s job on the disk store, for profilers.

``python -m bench.zipf_phase KEYS RECORDS MEMORY`` loads ``KEYS`` keys into a disk-backed
job (``state_memory`` ``MEMORY``, through :func:`bench.large._open`), then processes
``RECORDS`` records of Zipf(1.1)-like keys (ranks scattered by a fixed permutation; seeded,
so every run reads the same keys) in batches of :data:`bench.large.BATCH`, each prefetched,
with ``bench large``'s record (``value() + 1`` update, one map put). The first 2×10^4
records warm up (lazy imports, caches) and a checkpoint is taken; the rest run inside
``functools.reduce``, so that callgrind counts only them::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --fair-sched=yes --collect-atstart=no \\
        --toggle-collect=functools_reduce python -m bench.zipf_phase 100000 120000 8MB

(``--fair-sched=yes``: valgrind runs one thread at a time, and without it the writer lease's
renewal thread may not run before the checkpoint, which then fails with ``LeaseLostError``.)

It prints the working set's counters (keys read, prefetched, resident, evictions) to stderr.
Results: docs/performance.md, "Disk-backed working set".
"""

from __future__ import annotations

import functools
import random
import shutil
import sys
import tempfile
from pathlib import Path

from bench.large import BATCH, _open

WARM_UP = 20_000


def main(argv: list[str]) -> None:
    keys, records, memory = int(argv[0]), int(argv[1]), argv[2]
    tmp = tempfile.mkdtemp(prefix="statelog-zipf-phase-")
    job, b, v, m = _open(Path(tmp).as_uri(), "disk", memory)
    set_key, value, update, put, prefetch = b.set_current_key, v.value, v.update, m.put, b.prefetch
    for k in range(keys):
        set_key(k)
        update(value() + 1)
        put("a", k)
    rnd = random.Random(7)
    perm = list(range(keys))
    rnd.shuffle(perm)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(keys)]
    seq = [perm[i] for i in rnd.choices(range(keys), weights=weights, k=records)]
    names = ["a", "b", "c"]

    def run(part: list[int]) -> None:
        for start in range(0, len(part), BATCH):
            batch = part[start : start + BATCH]
            prefetch(batch)
            for i, k in enumerate(batch, start):
                set_key(k)
                update(value() + 1)
                put(names[i % 3], i)

    run(seq[:WARM_UP])
    job.checkpoint()
    functools.reduce(lambda _acc, _x: run(seq[WARM_UP:]), [0], None)
    stats = b._ws.stats()
    print({k: stats[k] for k in ("misses", "prefetched", "resident_keys", "evictions")}, file=sys.stderr)
    job.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print("usage: python -m bench.zipf_phase KEYS RECORDS MEMORY (e.g. 100000 120000 8MB)", file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1:])
