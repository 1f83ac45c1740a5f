"""The guide's Kafka consumer loop (docs/guide.md, section 2) for ``bench.startup``.

``python -m bench.startup_loop BOOTSTRAP TOPIC ROOT EVERY T0``: the guide's loop on one
partition (``statelog.open``, a changelog backend restored from the latest checkpoint,
``materializer.start_background``, a ``confluent_kafka.Consumer`` assigned at the
checkpoint's offset, a checkpoint every ``EVERY`` records). ``T0`` is the parent's
``time.time()`` just before it started this process. Lines on stdout (flushed)::

    FIRST <seconds from T0 to the first record processed> <modules loaded then> <pandas loaded 0/1>
    CHECKPOINT <id>

It runs until killed. The imports are the guide's; nothing is imported before them.
"""

import signal
import sys
import threading
import time

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

import materializer
import statelog
from statelog import ValueStateDescriptor


def main(bootstrap: str, topic: str, root: str, every: int, t0: float) -> None:
    partition = 0
    job = statelog.open(root, writer_lease_ttl_s=2.0)
    last = job.latest_checkpoint()
    backend = job.backend("click-counter", restore=last or "none")
    counts = backend.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
    bg = materializer.start_background(job)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "click-counter", "enable.auto.commit": False})
    start = last.sources[topic][partition] if last else 0
    consumer.assign([TopicPartition(topic, partition, start)])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    next_offset, since, first = start, 0, True
    while not stop.is_set():
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        backend.set_current_key(msg.key().decode())
        counts.update(counts.value() + 1)
        next_offset, since = msg.offset() + 1, since + 1
        if first:
            first = False
            elapsed = time.time() - t0
            print("FIRST", f"{elapsed:.6f}", len(sys.modules), int("pandas" in sys.modules), flush=True)
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
