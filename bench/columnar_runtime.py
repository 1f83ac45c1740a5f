"""The runtime parts of the columnar benchmark: the parallel runtime's keyed count from
Parquet in batch mode beside per-record mode (:func:`run_runtime`), and a keyed count from a
Kafka topic through :meth:`runtime.Application.run_batches` beside the per-record loop and
the client alone (:func:`run`).

**Runtime** (the workload of the Flink anchor): ``bench.spark_streaming.make_input``'s
Parquet files (``RUNTIME_EVENTS`` events over ``KEYS`` keys, ``quick``: 2·10^5 over 10^4),
parallelism 2, exactly-once aligned, changelog on, a checkpoint every second, a fresh
``file://`` root per run:

* ``runtime_events_per_s_p2``: ``ParquetSource`` read with ``from_source(..., batches=True,
  batch_rows=RUNTIME_BATCH_ROWS)`` -> ``key_by("key")`` -> ``aggregate("count", emit=False)``
  (one ``add_many`` per batch on the count's aggregating state);
* ``runtime_record_events_per_s_p2``: ``bench.runtime``'s per-record job (``row="tuple"``,
  a keyed process function doing ``count.update(count.value() + 1)``).

events/s = events ÷ the job's wall time (``JobResult.duration_s``); after one warm-up run of
each, the two alternate over the rounds; medians with their spread (min, max). Every run's
final checkpoint is restored and its total count checked against the input.

**Kafka**:

* **Broker**: ``tests.support.kafka.broker.start_kafka()`` on loopback (as ``bench.kafka``).
* **Input**: ``EVENTS`` records (``quick``: 10^5) over ``KEYS`` keys (``quick``: 10^4),
  key and value the key's decimal ASCII bytes, produced once into a topic of 2 partitions.
* **Runs** (one process each, a fresh ``file://`` root, changelog on, no materializer, a
  checkpoint every second, ``consume()`` of ``BATCH`` messages), interleaved over the rounds:

  - ``kafka_events_per_s``: ``Application.run_batches``, per batch
    ``counts.add_many(batch["key"], ones)`` on a ``ReducingState`` with ``operator.add``;
  - ``kafka_record_events_per_s``: ``Application.run``, per record ``count.update(count.value() + 1)``;
  - ``kafka_consume_only_events_per_s``: a ``Consumer`` reading the topic and reading each
    message's key and value, no state, with the cyclic collector paused during each batch as
    ``Application`` pauses it: what the client costs alone;
    ``kafka_consume_only_cpu_us_per_msg_{python,client,broker}`` split its CPU per message
    between this process's Python thread (the ``consume()`` calls, which build a Message
    object per record, and the key and value reads), librdkafka's own threads (fetching,
    parsing) and the broker process;
  - ``kafka_consume_only_gc_on_events_per_s``: the same with the collector running (each
    batch's Message objects, tracked by it, set off collections that traverse the batch).

  events/s = records ÷ the run's wall time (the application's construction to its final
  checkpoint); the reported figure is the median over the rounds, with its spread.
"""

from __future__ import annotations

import contextlib
import operator
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import statelog
from bench import runtime as bench_runtime
from bench.kafka import produce
from runtime import Application, CollectSink, ParquetSource, StreamExecutionEnvironment
from runtime.api.batches import aggregate_descriptor
from statelog import ReducingStateDescriptor, ValueStateDescriptor
from statelog.restore.collector import gc_paused

EVENTS = 1_000_000
KEYS = 100_000
PARTITIONS = 2
BATCH = 100_000
UID = "bench-count"
RECORD_COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
BATCH_COUNT = ReducingStateDescriptor("count", pa.int64(), reduce_fn=operator.add)
RUNTIME_EVENTS = 12_000_000  # a batch run lasts a few seconds: several checkpoints, not only the final one
RUNTIME_FILES = 20
RUNTIME_BATCH_ROWS = 131_072
RUNTIME_ROUNDS = 5


def runtime_batch_job(input_dir: Path, root: str) -> Any:
    """The keyed count of the Parquet input in batch mode at parallelism 2."""
    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=1.0, checkpoint_timeout_s=120.0,
                                     state_root=root)  # fmt: skip
    events = env.from_source(ParquetSource(input_dir, "input-*.parquet", columns=["key"]), uid="events",
                             batches=True, batch_rows=RUNTIME_BATCH_ROWS)  # fmt: skip
    events.key_by("key").aggregate("count", uid=UID, emit=False).sink_to(CollectSink(), uid="out")
    return env.execute("bench-columnar-runtime")


def _batch_total(root: str, checkpoint_id: int) -> int:
    with statelog.open(root, create=False) as job:
        total = 0
        for i in range(2):
            b = job.backend(UID, subtask=i, parallelism=2, restore=checkpoint_id, changelog=False)
            b.get_state(aggregate_descriptor("count", "count", pa.int64()))
            total += sum(v for _, _, v in b.entries("count"))
            b.close()
        return total


def _runtime_once(kind: str, input_dir: Path, root_dir: Path, events: int) -> Any:
    root = root_dir.as_uri()
    try:
        if kind == "batch":
            res = runtime_batch_job(input_dir, root)
            got = _batch_total(root, res.final_checkpoint)
        else:
            res = bench_runtime.run_job(input_dir, root, "changelog", 1.0)
            got = bench_runtime.total_count(root, res.final_checkpoint)
        if got != events:
            raise RuntimeError(f"{kind} run: the final checkpoint counts {got} events, not {events}")
        return res
    finally:
        shutil.rmtree(root_dir, ignore_errors=True)


def run_runtime(quick: bool = False, progress: bool = True, rounds: int = RUNTIME_ROUNDS) -> dict[str, Any]:
    """The runtime's keyed count from Parquet at parallelism 2, batch vs per-record mode."""
    from bench.spark_streaming import make_input

    events, keys = (200_000, 10_000) if quick else (RUNTIME_EVENTS, KEYS)
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-columnar-runtime-"))
    rates: dict[str, list[float]] = {"batch": [], "record": []}
    checkpoints: dict[str, list[int]] = {"batch": [], "record": []}
    try:
        make_input(work / "input", events, keys, 4 if quick else RUNTIME_FILES)
        n = 0
        for kind in rates:  # warm-up, not counted: the first job of a process starts the forkserver
            n += 1
            _runtime_once(kind, work / "input", work / f"root-{n}", events)
        for r in range(1 if quick else rounds):
            for kind in rates:
                n += 1
                res = _runtime_once(kind, work / "input", work / f"root-{n}", events)
                rates[kind].append(events / res.duration_s)
                checkpoints[kind].append(len(res.completed_checkpoints))
                _log(progress, f"round {r + 1} runtime {kind}: {rates[kind][-1]:,.0f} events/s "
                     f"({res.duration_s:.2f}s, {checkpoints[kind][-1]} checkpoints)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {"runtime_events": events, "runtime_keys": keys, "runtime_batch_rows": RUNTIME_BATCH_ROWS}
    for kind, name in (("batch", "runtime_events_per_s_p2"), ("record", "runtime_record_events_per_s_p2")):
        out[name] = round(statistics.median(rates[kind]))
        out[f"{name}_spread"] = [round(min(rates[kind])), round(max(rates[kind]))]
        out[f"{name}_checkpoints"] = round(statistics.median(checkpoints[kind]))
    out["runtime_batch_vs_record_p2"] = round(statistics.median(
        b / r for b, r in zip(rates["batch"], rates["record"], strict=True)), 2)
    return out


def _app(bootstrap: str, topic: str, root: str) -> Application:
    return Application(root, uid=UID, topics=topic, kafka={"bootstrap.servers": bootstrap}, start="earliest",
                       batch_size=BATCH, checkpoint_interval_s=1.0, materializer=False, handle_signals=False)


def batch_run(bootstrap: str, topic: str, root: str, events: int) -> float:
    t = time.perf_counter()
    app = _app(bootstrap, topic, root)
    counts = app.state(BATCH_COUNT)

    def per_batch(batch: pa.RecordBatch) -> None:
        counts.add_many(batch["key"], pa.array(np.ones(batch.num_rows, dtype=np.int64)))
        if app.records + batch.num_rows >= events:
            app.stop()

    app.run_batches(per_batch)
    return time.perf_counter() - t


def record_run(bootstrap: str, topic: str, root: str, events: int) -> float:
    t = time.perf_counter()
    app = _app(bootstrap, topic, root)
    count = app.state(RECORD_COUNT)
    seen = [0]
    value, update = count.value, count.update

    def per_record(_msg: Any) -> None:
        update(value() + 1)
        seen[0] += 1
        if seen[0] == events:
            app.stop()

    app.run(per_record)
    return time.perf_counter() - t


def _cpu_s(stat: Path) -> float:
    """utime + stime of a /proc ``stat`` file, in seconds."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by name (librdkafka's are ``rdk:...``)."""
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            out[name] = out.get(name, 0.0) + _cpu_s(task / "stat")
    return out


def consume_only(bootstrap: str, topic: str, events: int, pause_gc: bool = True, cpu: dict[str, float] | None = None,
                 broker_pid: int | None = None) -> float:
    """Read ``events`` messages and each message's key and value with a plain ``Consumer``,
    the cyclic collector paused during each ``consume()`` batch as ``Application`` does it
    (``pause_gc=False``: not paused); with ``cpu``, add the CPU seconds of the run to it: this process's Python
    thread (``python``: the calls into the client, its Message objects), the client's own
    threads (``client``: librdkafka's fetching and parsing) and the broker (``broker``)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    before = _threads_cpu()
    broker_stat = Path(f"/proc/{broker_pid}/stat") if broker_pid else None
    broker0 = _cpu_s(broker_stat) if broker_stat else 0.0
    t = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        seen = 0
        while seen < events:
            with gc_paused() if pause_gc else contextlib.nullcontext():
                for msg in consumer.consume(BATCH, 0.5):
                    if msg.error() is None:
                        msg.key(), msg.value()
                        seen += 1
        dt = time.perf_counter() - t
        if cpu is not None:  # (before close: the client's threads are gone after it)
            after = _threads_cpu()
            for name, s in after.items():
                part = "client" if name.startswith("rdk:") else "python"
                cpu[part] = cpu.get(part, 0.0) + s - before.get(name, 0.0)
            if broker_stat:
                cpu["broker"] = cpu.get("broker", 0.0) + _cpu_s(broker_stat) - broker0
    finally:
        consumer.close()
    return dt


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[columnar] {msg}", flush=True)


def run(quick: bool = False, progress: bool = True, rounds: int = 3) -> dict[str, Any]:
    from bench.spark_streaming import make_input
    from tests.support.kafka.broker import start_kafka

    events, keys = (100_000, 10_000) if quick else (EVENTS, KEYS)
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-columnar-kafka-"))
    rates: dict[str, list[float]] = {"kafka_consume_only": [], "kafka_consume_only_gc_on": [], "kafka_record": [],
                                     "kafka": []}
    cpu: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        broker = stack.enter_context(start_kafka())
        bootstrap = broker.bootstrap_servers
        make_input(work / "input", events, keys, 4)
        seq = [int(k) for f in sorted((work / "input").glob("input-*.parquet"))
               for k in pq.read_table(f, columns=["key"]).column("key").to_pylist()]  # fmt: skip
        topic = str(broker.create_topic(partitions=PARTITIONS, config={"retention.ms": "-1"}))
        _log(progress, f"{events:,} records produced in {produce(bootstrap, topic, seq):.1f}s")
        del seq
        n = 0
        batch_run(bootstrap, topic, (work / "warm-up").as_uri(), min(events, 10_000))  # imports, first fetch
        for r in range(1 if quick else rounds):
            for kind in rates:
                n += 1
                root = (work / f"root-{n}").as_uri()
                if kind == "kafka":
                    s = batch_run(bootstrap, topic, root, events)
                elif kind == "kafka_record":
                    s = record_run(bootstrap, topic, root, events)
                elif kind == "kafka_consume_only_gc_on":
                    s = consume_only(bootstrap, topic, events, pause_gc=False)
                else:
                    s = consume_only(bootstrap, topic, events, cpu=cpu, broker_pid=broker.process.pid)
                rates[kind].append(events / s)
                shutil.rmtree(work / f"root-{n}", ignore_errors=True)
                _log(progress, f"round {r + 1} {kind}: {events / s:,.0f} events/s")
    out: dict[str, Any] = {"kafka_events": events, "kafka_keys": keys, "kafka_batch_size": BATCH}
    for kind, xs in rates.items():
        med = statistics.median(xs)
        out[f"{kind}_events_per_s"] = round(med)
        out[f"{kind}_events_per_s_spread"] = [round(min(xs)), round(max(xs))]
    consumed = events * len(rates["kafka_consume_only"])
    for part, seconds in sorted(cpu.items()):  # CPU per message of the consume-only runs, by whom
        out[f"kafka_consume_only_cpu_us_per_msg_{part}"] = round(seconds / consumed * 1e6, 3)
    out["kafka_batch_vs_record"] = round(out["kafka_events_per_s"] / out["kafka_record_events_per_s"], 2)
    return out


if __name__ == "__main__":
    import json
    import sys

    quick, progress = "--quick" in sys.argv, "--json" not in sys.argv
    if "--runtime-only" in sys.argv:  # the runtime part alone (no Kafka broker)
        print(json.dumps(run_runtime(quick, progress)))
    else:
        print(json.dumps({**run_runtime(quick, progress), **run(quick, progress)}))
