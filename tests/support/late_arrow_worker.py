"""``python -m tools ARG...`` with the workers of Arrow's CPU pool finishing their tasks late.

Run as ``python -m tests.support.late_arrow_worker ARG...`` (Linux: ``sched_setaffinity`` and
``SCHED_IDLE``). A worker of Arrow's CPU pool destroys a Parquet read's task after it handed
the result over; the task may hold the last reference to a buffer of a Python object (the
bytes of a table file), whose destructor takes the GIL. Under CPU load that worker can be
late, and if the interpreter has begun its teardown by then, taking the GIL ends the thread
with ``pthread_exit`` and the process aborts ("terminate called without an active
exception", exit 134) after the command printed its result. Rare under load; made likely
here:

* every thread of this process runs on one CPU, and the workers of Arrow's CPU pool (all of
  them started up front) have the ``SCHED_IDLE`` policy: once the main thread can run, a
  worker gets the CPU only now and then, so it destroys its last task while the main thread
  is already far ahead;
* the last ``atexit`` callback holds the GIL in C code for a while (``sum`` over a range),
  so a worker that destroys its task then waits for the GIL until the teardown has begun.

Nothing else changes: the command runs as ``python -m tools`` runs it.
"""

from __future__ import annotations

import atexit
import io
import os
import runpy
import sys
import threading

atexit.register(sum, range(30_000_000))  # registered first: the last callback to run

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import pyarrow as pa  # noqa: E402 - after the atexit callback: it must be the last to run
import pyarrow.parquet as pq  # noqa: E402

# a read with a column per worker starts all of the pool's workers
buf = io.BytesIO()
pq.write_table(pa.table({f"c{i}": [i] for i in range(pa.cpu_count() + 1)}), buf)
pq.ParquetFile(pa.BufferReader(buf.getvalue())).read()
main = threading.get_native_id()
for tid in os.listdir("/proc/self/task"):
    if int(tid) != main:
        os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))

sys.argv = ["statelog", *sys.argv[1:]]
runpy.run_module("tools", run_name="__main__", alter_sys=True)
