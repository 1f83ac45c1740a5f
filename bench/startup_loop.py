"""The guide's Kafka consumer loop (docs/guide.md, section 2) for ``bench.startup``.

``python -m bench.startup_loop BOOTSTRAP TOPIC ROOT EVERY T0``: the guide's loop on one
partition (``statelog.open``, a changelog backend restored from the latest checkpoint,
``materializer.start_background``, a ``confluent_kafka.Consumer`` assigned at the
checkpoint's offset, a checkpoint every ``EVERY`` records). ``T0`` is the parent's
``time.time()`` just before it started this process. Lines on stdout (flushed)::

    FIRST <seconds from T0 to the first record processed> <modules loaded then> <pandas loaded 0/1>
    BREAKDOWN <JSON: the steps up to the first record, seconds each (STEPS), and process_cpu>
    CHECKPOINT <id>

It runs until killed. The imports are the guide's; nothing but the standard library's
``signal``, ``sys``, ``threading`` and ``time`` is imported before them.
"""

import json
import signal
import sys
import threading
import time

_T_MAIN = time.time()  # the interpreter has started and runs this module: before the guide's imports

import pyarrow as pa  # noqa: E402
from confluent_kafka import Consumer, TopicPartition  # noqa: E402

import materializer  # noqa: E402
import statelog  # noqa: E402
from statelog import ValueStateDescriptor  # noqa: E402

_T_IMPORTED = time.time()

# the steps of BREAKDOWN, in order; each is the time since the previous one
STEPS = (
    "interpreter_start",  # T0 (the parent's spawn) to this module running
    "imports",  # pyarrow, confluent_kafka, materializer, statelog
    "open",  # statelog.open + the latest checkpoint's metadata
    "restore_start",  # job.backend(restore=...) (the writer lease's takeover, the restore's plan)
    "materializer_start",  # materializer.start_background
    "consumer_create",  # confluent_kafka.Consumer(...) and assign()
    "first_fetch",  # polls until the first record arrives
    "first_record",  # set its key (its key group usable) and update its count
)


def main(bootstrap: str, topic: str, root: str, every: int, t0: float) -> None:
    marks = [t0, _T_MAIN, _T_IMPORTED]
    partition = 0
    job = statelog.open(root, writer_lease_ttl_s=2.0)
    last = job.latest_checkpoint()
    marks.append(time.time())
    backend = job.backend("click-counter", restore=last or "none")
    counts = backend.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
    marks.append(time.time())
    bg = materializer.start_background(job)
    marks.append(time.time())
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "click-counter", "enable.auto.commit": False})
    start = last.sources[topic][partition] if last else 0
    consumer.assign([TopicPartition(topic, partition, start)])
    marks.append(time.time())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    next_offset, since, first = start, 0, True
    while not stop.is_set():
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        if first:
            marks.append(time.time())
        backend.set_current_key(msg.key().decode())
        counts.update(counts.value() + 1)
        next_offset, since = msg.offset() + 1, since + 1
        if first:
            first = False
            elapsed = time.time() - t0
            print("FIRST", f"{elapsed:.6f}", len(sys.modules), int("pandas" in sys.modules), flush=True)
            marks.append(t0 + elapsed)
            steps = {name: round(b - a, 6) for name, a, b in zip(STEPS, marks[:-1], marks[1:], strict=True)}
            steps["process_cpu"] = round(time.process_time(), 6)  # all threads, up to the first record
            print("BREAKDOWN", json.dumps(steps), flush=True)
        if since >= every:
            meta = job.checkpoint(sources={topic: {partition: next_offset}})
            print("CHECKPOINT", meta.checkpoint_id, flush=True)
            since = 0
    job.checkpoint(sources={topic: {partition: next_offset}})
    bg.stop()
    job.close()
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
