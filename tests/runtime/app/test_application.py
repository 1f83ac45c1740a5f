"""runtime.Application against the test broker: per record and per batch, the checkpoint
cadence, a final checkpoint on stop(), SIGINT and SIGTERM, exactly-once state across restarts."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

import pytest

import statelog
from runtime import Application
from statelog.errors import ConfigError, LeaseHeldError
from tests.support.kafka.app_records import (
    COUNT,
    counts_at,
    counts_before,
    end_offsets,
    produce_keys,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.kafka

UID = "click-counter"


def make_app(broker, root: str, topic: str, **options) -> Application:
    options = {"uid": UID, "topics": topic, "kafka": broker.config(), "checkpoint_interval_s": None,
               "open_options": {"retain_checkpoints": 1000}, **options}
    return Application(root, **options)


def stop_after(app: Application, n: int, state=None, action=None):
    """A per-record function: +1 on ``state`` (COUNT of the app), stop (or ``action``) at record ``n``."""
    counts = state or app.state(COUNT)
    seen = [0]

    def count(msg) -> None:
        counts.update(counts.value() + 1)
        seen[0] += 1
        if seen[0] == n:
            (action or app.stop)()

    return count


def test_per_record_then_per_batch_restart_exactly_once(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=3)
    first = produce_keys(kafka_broker, topic, 900)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100)
    assert app.restored_from is None and app.start_offsets == {topic: {0: 0, 1: 0, 2: 0}}
    final = app.run(stop_after(app, 900))

    assert final is not None and final.sources[topic] == end_offsets(first, 3)
    assert app.records == 900 and app.checkpoints >= 3  # every 100 records (per batch) and the final one
    assert app.materializer is not None and not app.materializer.running
    assert counts_at(file_root.url, UID) == counts_before(first, end_offsets(first, 3))
    with statelog.open(file_root.url, create=False) as job:  # every checkpoint is exactly once
        metas = job.checkpoints()
    assert len(metas) == app.checkpoints and metas[-1].checkpoint_id == final.checkpoint_id
    for meta in metas[:-1]:
        assert counts_at(file_root.url, UID, meta) == counts_before(first, meta.sources[topic])

    second = produce_keys(kafka_broker, topic, 600, first=900)
    app2 = make_app(kafka_broker, file_root.url, topic, checkpoint_every=250)
    assert app2.restored_from.checkpoint_id == final.checkpoint_id
    assert app2.start_offsets == {topic: final.sources[topic]}
    counts, seen = app2.state(COUNT), [0]

    def per_batch(msgs) -> None:
        for _msg in app2.keyed(msgs):
            counts.update(counts.value() + 1)
            seen[0] += 1
        if seen[0] >= 600:
            app2.stop()

    final2 = app2.run(per_batch, batch=True)
    # local copies are on by default: the restart on this host read nothing its predecessor wrote
    # from the store
    copies = app2.job.local_copies
    assert copies is not None and copies.stats.hits > 0 and copies.stats.misses == 0, copies.stats
    everything = first + second
    assert final2.sources[topic] == end_offsets(everything, 3)
    assert counts_at(file_root.url, UID) == dict(Counter(k for _, _, k in everything))


@pytest.mark.parametrize("key", [None, "function"])
def test_the_function_or_a_key_function_sets_the_key(kafka_broker, file_root, key) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    records = produce_keys(kafka_broker, topic, 300)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=50,
                   key=(lambda msg: int(msg.value()) % 3) if key else None)
    counts, seen = app.state(COUNT), [0]

    def count(msg) -> None:
        if key is None:
            app.backend.set_current_key(int(msg.value()) % 3)
        counts.update(counts.value() + 1)
        seen[0] += 1
        if seen[0] == len(records):
            app.stop()

    app.run(count)
    assert counts_at(file_root.url, UID) == {0: 100, 1: 100, 2: 100}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_with_a_final_checkpoint(kafka_broker, file_root, signum) -> None:
    topic = kafka_broker.create_topic(partitions=3)
    records = produce_keys(kafka_broker, topic, 500)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=10_000)
    before = signal.getsignal(signum)
    final = app.run(stop_after(app, 500, action=lambda: os.kill(os.getpid(), signum)))
    assert signal.getsignal(signum) is before  # the handlers are put back
    assert app.checkpoints == 1 and final.sources[topic] == end_offsets(records, 3)  # the final one
    assert counts_at(file_root.url, UID) == counts_before(records, end_offsets(records, 3))


def test_a_repeated_sigterm_still_ends_with_the_final_checkpoint(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    records = produce_keys(kafka_broker, topic, 80)

    def twice() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=10_000)
    final = app.run(stop_after(app, 80, action=twice))
    assert app.checkpoints == 1 and final.sources[topic] == end_offsets(records, 1)


def test_a_second_sigint_aborts_without_a_final_checkpoint(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    produce_keys(kafka_broker, topic, 50)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=10_000)

    def twice() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        app.run(stop_after(app, 10, action=twice))
    assert app.checkpoints == 0
    with statelog.open(file_root.url, create=False) as job:
        assert job.latest_checkpoint() is None


def test_an_error_of_the_function_skips_the_final_checkpoint_and_the_restart_replays(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=3)
    records = produce_keys(kafka_broker, topic, 600)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100, batch_size=50)

    def boom() -> None:
        raise RuntimeError("bad record")

    with pytest.raises(RuntimeError, match="bad record"):
        app.run(stop_after(app, 420, action=boom))
    with statelog.open(file_root.url, create=False) as job:
        last = job.latest_checkpoint()
    assert last is not None and app.last_checkpoint.checkpoint_id == last.checkpoint_id
    assert sum(last.sources[topic].values()) < 420  # the periodic ones only

    app2 = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100)  # the lease was released
    assert app2.start_offsets == {topic: last.sources[topic]}
    app2.run(stop_after(app2, 600 - sum(last.sources[topic].values())))
    assert counts_at(file_root.url, UID) == dict(Counter(k for _, _, k in records))


def test_checkpoints_by_time(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    produce_keys(kafka_broker, topic, 40)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=None, checkpoint_interval_s=0.2,
                   materializer={"interval_s": 30.0})
    def covers_all() -> bool:  # only the clock can have taken it (checkpoint_every=None)
        return app.last_checkpoint is not None and app.last_checkpoint.sources[topic] == {0: 40}

    watcher = threading.Thread(target=lambda: (wait_until(covers_all, 30, "a periodic checkpoint of all 40"),
                                               app.stop()))
    watcher.start()
    counts = app.state(COUNT)
    final = app.run(lambda msg: counts.update(counts.value() + 1))
    watcher.join()
    assert app.checkpoints >= 2 and final.sources[topic] == {0: 40}


def test_a_missing_topic_fails_at_start_and_releases_the_root(kafka_broker, file_root) -> None:
    with pytest.raises(ConfigError, match="does it exist"):
        make_app(kafka_broker, file_root.url, "no-such-topic", checkpoint_every=10)
    topic = kafka_broker.create_topic(partitions=1)
    with make_app(kafka_broker, file_root.url, topic, checkpoint_every=10) as app:  # not refused by a lease
        assert app.start_offsets == {topic: {0: 0}}
    with pytest.raises(ConfigError, match="has stopped; make a new one"):
        app.run(print)


def test_a_second_application_on_the_root_is_refused(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    with make_app(kafka_broker, file_root.url, topic, checkpoint_every=10), pytest.raises(LeaseHeldError):
        make_app(kafka_broker, file_root.url, topic, checkpoint_every=10)
    make_app(kafka_broker, file_root.url, topic, checkpoint_every=10).close()  # free again once closed


def test_metrics_port_serves_the_records_read_and_the_partitions_lag(kafka_broker, file_root) -> None:
    """With metrics_port the job serves the records the application read and, after a
    checkpoint, each partition's consumer lag (0 once everything is read)."""
    import urllib.request

    topic = kafka_broker.create_topic(partitions=2)
    records = produce_keys(kafka_broker, topic, 300)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100, metrics_port=0)
    url = app.job.metrics.url
    counts = app.state(COUNT)
    thread = threading.Thread(target=app.run, args=(lambda _msg: counts.update(counts.value() + 1),))
    thread.start()
    try:
        wait_until(lambda: app.last_checkpoint is not None and app.last_checkpoint.sources[topic] == end_offsets(records, 2),
                   60, "every record read and checkpointed")

        def scrape() -> dict[str, float]:
            text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines() if line.startswith("statelog_") and " " in line}

        wait_until(lambda: any(k.startswith("statelog_job_kafka_lag_records") for k in scrape()), 30, "the lag served")
        served = scrape()
        assert [v for k, v in served.items() if k.startswith("statelog_job_records_in_total")] == [300.0]
        lags = {k: v for k, v in served.items() if k.startswith("statelog_job_kafka_lag_records")}
        assert len(lags) == 2 and set(lags.values()) == {0.0}, lags
    finally:
        app.stop()
        thread.join(60)
    assert not thread.is_alive()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/metrics", timeout=5)  # the server stops with the application


def test_metrics_port_is_refused_with_an_open_job(kafka_broker, file_root) -> None:
    with statelog.open(file_root.url) as job, pytest.raises(ConfigError, match="metrics_port"):
        Application(job, topics="t", kafka=kafka_broker.config(), metrics_port=0)
    with pytest.raises(ConfigError, match="not in open_options"):
        Application(file_root.url, topics="t", kafka=kafka_broker.config(), open_options={"metrics_port": 0})
    with statelog.open(file_root.url) as job, pytest.raises(ConfigError, match="local_copies"):
        Application(job, topics="t", kafka=kafka_broker.config(), local_copies=False)
    with pytest.raises(ConfigError, match="local_copies as an option of the Application"):
        Application(file_root.url, topics="t", kafka=kafka_broker.config(), open_options={"local_copies": False})


def test_a_standby_application_takes_over_from_its_replica(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    first = produce_keys(kafka_broker, topic, 500)
    app = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100)
    made: list[Application] = []
    standby = threading.Thread(target=lambda: made.append(make_app(kafka_broker, file_root.url, topic,
                                                                   checkpoint_every=100, standby=True)))
    standby.start()  # follows the root while the first application holds it
    final = app.run(stop_after(app, 500))  # the final checkpoint, then the lease is released
    standby.join(60)
    assert made, "the standby application did not take over"
    app2 = made[0]
    assert app2.restored_from.checkpoint_id == final.checkpoint_id
    assert app2.backend.restore_stats.get("standby") is True  # its replica, not a restore
    assert app2.start_offsets == {topic: final.sources[topic]}
    second = produce_keys(kafka_broker, topic, 300, first=500)
    app2.run(stop_after(app2, 300))
    assert counts_at(file_root.url, UID) == dict(Counter(k for _, _, k in first + second))


def test_standby_is_an_option_of_the_application_not_of_open_options(kafka_broker, file_root) -> None:
    with pytest.raises(ConfigError, match="set standby as an option of the Application"):
        make_app(kafka_broker, file_root.url, "t", open_options={"standby": True})


def test_the_collector_is_paused_while_a_batch_is_processed(kafka_broker, tmp_path) -> None:
    """Application pauses Python's cyclic collector during each consume() and its processing
    (the client's Message objects would set off collections that traverse the batch) and
    resumes it after: the processing sees it paused, the caller finds it enabled again."""
    import gc

    from confluent_kafka import Producer

    topic = kafka_broker.create_topic(partitions=1)
    p = Producer(kafka_broker.config())
    for i in range(20):
        p.produce(topic, key=str(i % 3).encode(), value=b"x")
    p.flush(10)
    app = Application((tmp_path / "root").as_uri(), uid="gc", topics=topic,
                      kafka={"bootstrap.servers": kafka_broker.bootstrap_servers}, start="earliest",
                      materializer=False, handle_signals=False)
    seen: list[bool] = []

    def per_batch(batch) -> None:
        seen.append(gc.isenabled())
        if app.records + batch.num_rows >= 20:
            app.stop()

    was = gc.isenabled()
    gc.enable()  # (another test of this process may have left it paused)
    try:
        app.run_batches(per_batch)
        assert seen and not any(seen)
        assert gc.isenabled()
    finally:
        if not was:
            gc.disable()
