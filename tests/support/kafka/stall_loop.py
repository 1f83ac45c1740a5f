"""A user's consumer loop with a transactional producer, for the stall test of
``tests/runtime/connectors/kafka/test_fencing.py``.

Run as ``python -m tests.support.kafka.stall_loop BOOTSTRAP TOPIC_IN TOPIC_OUT ROOT TXN_ID TTL RATE [--finish]``.
It takes the root's writer lease (``job.backend``) *before* it initialises its transactional
id, restores the latest checkpoint, and for every input record counts it per key and writes
``[partition, offset, key, count]`` to TOPIC_OUT in the open transaction. Every ``EVERY``
records: flush, checkpoint (with the consumer's positions), commit the transaction, print
``CHECKPOINT <id>``, begin the next one. On any error it asks the job whether the process
lost its root (``job.check_root()``) and then prints ``FENCED <message>`` and exits 3.
Lines: ``READY <pid>``, ``CHECKPOINT <id>``, ``DONE <id>`` (``--finish``: at the end of the
input), ``REFUSED <message>`` (exit 4), ``FENCED <message>`` (exit 3).
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

import statelog
from statelog import ValueStateDescriptor
from statelog.errors import FencedError, LeaseHeldError
from statelog.kafka import KafkaOffsets

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
EVERY = 50


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p).replace("\n", " ") for p in parts) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    bootstrap, tin, tout, root, txn_id, ttl, rate = argv[:7]
    finish, max_rate = "--finish" in argv[7:], float(rate)
    job = statelog.open(root, retain_checkpoints=10_000, writer_lease_ttl_s=float(ttl), writer_owner="stall-loop")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "stall-loop", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})  # fmt: skip
    producer: Producer | None = None
    try:
        try:
            backend = job.backend("counts", restore="latest")  # the lease first ...
        except LeaseHeldError as exc:
            say("REFUSED", exc)
            return 4
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
        producer.init_transactions(30)  # ... then the transactional id: it fences the previous owner
        count = backend.get_state(COUNT)
        offsets = KafkaOffsets(consumer, [tin])
        start = offsets.restore(job.latest_checkpoint())
        ends = {p: consumer.get_watermark_offsets(TopicPartition(tin, p), timeout=10)[1] for p in start[tin]}
        say("READY", os.getpid())
        producer.begin_transaction()
        since, done, t0 = 0, 0, time.monotonic()
        while True:
            msg = consumer.poll(0.1)
            if msg is None:
                if finish and offsets.positions()[tin] == ends:
                    producer.flush(30)
                    meta = offsets.checkpoint(job)
                    producer.commit_transaction(30)
                    say("DONE", meta.checkpoint_id)
                    return 0
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            key = msg.key().decode()
            backend.set_current_key(key)
            n = count.value() + 1
            count.update(n)
            producer.produce(tout, json.dumps([msg.partition(), msg.offset(), key, n]).encode(), key=msg.key())
            producer.poll(0)
            since, done = since + 1, done + 1
            if since >= EVERY:
                producer.flush(30)
                meta = offsets.checkpoint(job)  # the state and positions first ...
                producer.commit_transaction(30)  # ... then the output of the same records
                say("CHECKPOINT", meta.checkpoint_id)
                producer.begin_transaction()
                since = 0
            if max_rate > 0 and (ahead := done / max_rate - (time.monotonic() - t0)) > 0:
                time.sleep(ahead)
    except Exception as exc:
        try:
            job.check_root()  # did this process lose the root? then that is the error to report
        except FencedError as lost:
            say("FENCED", lost)
            return 3
        raise exc
    finally:
        consumer.close()
        job.close(flush=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
