"""A user's own Kafka consumer loop with statelog state, for the consumer-loop crash test.

Run as ``python -m tests.support.kafka.consumer_loop_worker BOOTSTRAP TOPIC ROOT EVERY RATE [--finish] [--standby]``.
It opens the job root, restores the latest checkpoint (state and Kafka offsets, through
:class:`statelog.kafka.KafkaOffsets`), then for every record adds 1 to ``count`` and the
record's integer value to ``total`` of the record's key, and checkpoints every ``EVERY``
records with the consumer's positions. ``RATE`` caps records per second (0: no cap), so that
a test can kill it in the middle. Without ``--finish`` it runs until killed (idling once it
has read everything); with ``--finish`` it checkpoints and exits 0 once its positions reach
the end of every partition. With ``--standby`` it opens the root as a hot standby
(``statelog.open(root, standby=True)``): it follows the root until the writer lease is free,
then continues from its replica. Lines on stdout (flushed)::

    STANDBY                     (--standby) following, before the takeover
    TOOK_OVER <checkpoint id or 0> <1: the backend is the replica, 0: restored>

    READY <restored checkpoint id or 0> <start offsets as JSON>
    CHECKPOINT <id> <offsets as JSON>
    REFUSED <message>           the root's writer lease is held by another live process (exit 3)
    DONE <id>
"""

from __future__ import annotations

import json
import sys
import time

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

import statelog
from statelog import ValueStateDescriptor
from statelog.errors import LeaseHeldError
from statelog.kafka import KafkaOffsets

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
TOTAL = ValueStateDescriptor("total", pa.int64(), default=0)
OPERATOR = "counts"
WRITER_LEASE_TTL_S = 1.5


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def _offsets_json(positions: dict[str, dict[int, int]]) -> str:
    return json.dumps(
        {t: {str(p): o for p, o in sorted(offs.items())} for t, offs in positions.items()}
    )


def main(argv: list[str]) -> int:
    bootstrap, topic, root, every, rate = argv[:5]
    finish, standby = "--finish" in argv[5:], "--standby" in argv[5:]
    every_n, max_rate = int(every), float(rate)
    if standby:
        say("STANDBY")
    job = statelog.open(
        root,
        retain_checkpoints=10_000,
        writer_lease_ttl_s=WRITER_LEASE_TTL_S,
        writer_owner="kafka-loop",
        standby=standby,
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "statelog-consumer-loop",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        last = job.latest_checkpoint()
        try:
            backend = job.backend(OPERATOR, restore=last if last is not None else "none")
        except LeaseHeldError as exc:
            say("REFUSED", str(exc).replace("\n", " "))
            return 3
        count, total = backend.get_state(COUNT), backend.get_state(TOTAL)
        if standby:
            say("TOOK_OVER", last.checkpoint_id if last else 0, int(backend.restore_stats.get("standby", False)))
        offsets = KafkaOffsets(consumer, [topic])
        start = offsets.restore(last)
        say("READY", last.checkpoint_id if last else 0, _offsets_json(start))
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in start[topic]
        }
        since = 0
        t0, done = time.monotonic(), 0
        while True:
            msg = consumer.poll(0.2)
            if msg is None:
                if finish and offsets.positions()[topic] == ends:
                    meta = offsets.checkpoint(job)
                    say("DONE", meta.checkpoint_id)
                    return 0
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consumer error: {msg.error()}")
            backend.set_current_key(msg.key().decode())
            count.update(count.value() + 1)
            total.update(total.value() + int(msg.value()))
            since += 1
            done += 1
            if since >= every_n:
                meta = offsets.checkpoint(job)
                say("CHECKPOINT", meta.checkpoint_id, _offsets_json(offsets.positions()))
                since = 0
            if max_rate > 0:
                ahead = done / max_rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
    finally:
        consumer.close()
        job.close(flush=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
