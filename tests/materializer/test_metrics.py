"""The materializer daemon's /metrics and /healthz, scraped while it runs, against the root.

A real daemon (its ``run`` loop on a thread, ``metrics_port=0``) materializes a root that a
job keeps checkpointing; the scraped values are compared with what the root holds: the
manifests it published, the newest checkpoint, the lease, what GC deleted. A second daemon
on the same root is a standby and says so; a port that is taken is a clear error.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import statelog
from materializer.daemon.loop import MaterializerDaemon
from statelog import ValueStateDescriptor
from statelog.errors import ConfigError
from statelog.materialization.manifest import list_manifests
from statelog.store import open_store
from statelog.testing.faulty_store import FaultInjectingStore
from tests.support.wait import wait_until

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert "owner" in s.labels, s  # every series, histograms and process figures included
            out[s.name] = s.value  # one daemon per registry: one sample per name (histograms: _sum, _count)
    return out


def health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


GRACE_S = 1.0


def test_daemon_metrics_match_the_root_while_it_runs(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    job = statelog.open(root, max_parallelism=16)
    b = job.backend("counter")
    state = b.get_state(COUNT)
    job.materialization_poll_s = 0
    store = open_store(root)
    # a grace period above the time from a segment's upload to the checkpoint that references it
    # (with 0, GC may delete a segment in flight: seen on a loaded machine)
    daemon = MaterializerDaemon(store, interval_s=0.001, poll_s=0.05, gc_grace_s=GRACE_S, retain_checkpoints=3,
                                metrics_port=0, owner="daemon-under-test")  # fmt: skip
    stop = threading.Event()
    t = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_until(lambda: daemon.metrics_server is not None, 30, "the metrics server")
        assert daemon.metrics_server is not None
        url = daemon.metrics_server.url
        scrapes = []
        for round_ in range(6):
            for k in range(200):
                b.set_current_key(k)
                state.update(round_ * 1000 + k)
            cid = job.checkpoint().checkpoint_id

            def materialized(cid: int = cid) -> bool:  # the cycle that materialized cid is done
                m = scrape(url)
                return (m.get("statelog_materializer_latest_checkpoint") == cid
                        and m.get("statelog_materializer_lag_checkpoints") == 0
                        and m["statelog_materializer_materialization_duration_seconds_count"]
                        == m["statelog_materializer_materializations_total"])  # fmt: skip

            wait_until(materialized, 30, "a materialization")
            scrapes.append(scrape(url))
        # what the rounds superseded passes the grace period and a later cycle collects it (GC
        # runs in the cycles that new checkpoints start)
        time.sleep(GRACE_S)
        taken = 6

        def collected() -> bool:
            nonlocal taken
            m = scrape(url)
            # (lag 0 counts only the checkpoints the daemon has seen: the one taken in the poll
            # before may be new to it, and its materialization would come after the last scrape)
            newest = job.latest_checkpoint()
            if m.get("statelog_materializer_gc_deleted_objects_total", 0) > 0 and m.get(
                    "statelog_materializer_lag_checkpoints") == 0 and newest is not None and m.get(
                    "statelog_materializer_latest_checkpoint") == newest.checkpoint_id:
                return True
            if m.get("statelog_materializer_latest_checkpoint") == taken:
                b.set_current_key(0)
                state.update(taken)
                job.checkpoint()
                taken += 1
            return False

        wait_until(collected, 30, "a garbage collection")
        scrapes.append(scrape(url))
        stop.set()
        t.join(30)
        m = scrapes[-1]
        manifests = list_manifests(store)
        # what this daemon published is on the root (GC keeps the newest ones; count what it wrote)
        assert m["statelog_materializer_materializations_total"] >= len(manifests) >= 1
        assert m["statelog_materializer_materializations_total"] == daemon.published >= 6
        assert [s["statelog_materializer_materializations_total"] for s in scrapes] == sorted(
            s["statelog_materializer_materializations_total"] for s in scrapes
        )
        assert m["statelog_materializer_lease_held"] == 1 and m["statelog_materializer_lease_generation"] >= 1
        latest = job.latest_checkpoint()
        assert latest is not None and m["statelog_materializer_latest_checkpoint"] == latest.checkpoint_id
        assert m["statelog_materializer_latest_checkpoint_timestamp_seconds"] == latest.timestamp_ms / 1000
        assert m["process_resident_memory_bytes"] > 0 and m["process_threads"] >= 2
        assert m["statelog_materializer_lag_checkpoints"] == 0  # the newest checkpoint is materialized
        assert m["statelog_materializer_materialization_duration_seconds_count"] == daemon.published
        assert m["statelog_materializer_rows_written_total"] >= 200
        # GC deleted the superseded manifests, tables and old checkpoints (retain 3)
        assert m["statelog_materializer_gc_deleted_objects_total"] > 0
        assert m["statelog_materializer_gc_deleted_checkpoints_total"] == taken - 3
        assert len(job.catalog.checkpoint_ids()) == 3
        assert m["statelog_materializer_cycle_failures_total"] == 0
        assert m["statelog_materializer_cycles_total"] >= 6
    finally:
        stop.set()
        t.join(30)
        job.close()
        store.close()
    assert daemon.metrics_server is None  # closed with the loop


def test_standby_reports_no_lease_and_health_says_why_a_cycle_failed(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    with statelog.open(root, max_parallelism=8) as job:
        b = job.backend("counter")
        b.set_current_key("k")
        b.get_state(COUNT).update(1)
        job.checkpoint()
    stores = [open_store(root), open_store(root)]
    faulty = FaultInjectingStore(stores[1])
    leader = MaterializerDaemon(stores[0], poll_s=0.05, metrics_port=0, owner="leader")
    standby = MaterializerDaemon(faulty, poll_s=0.05, metrics_port=0, owner="standby")
    stops = [threading.Event(), threading.Event()]
    threads = [threading.Thread(target=d.run, args=(s,), daemon=True) for d, s in ((leader, stops[0]), (standby, stops[1]))]
    threads[0].start()
    wait_until(lambda: leader.published >= 1, 30, "the leader's first publication")
    threads[1].start()
    try:
        wait_until(lambda: standby.cycles >= 2 and standby.metrics_server is not None, 30, "two cycles of the standby")
        assert leader.metrics_server is not None and standby.metrics_server is not None
        lm, sm = scrape(leader.metrics_server.url), scrape(standby.metrics_server.url)
        assert (lm["statelog_materializer_lease_held"], sm["statelog_materializer_lease_held"]) == (1, 0)
        assert sm["statelog_materializer_materializations_total"] == 0
        code, body = health(standby.metrics_server.url)
        assert code == 200 and body["status"] == "ok" and body["leader"] is False
        # a failing cycle (every read of the standby's store refused) makes the probe unhealthy
        # with the reason; cycles keep failing, so no later success clears it under the probe
        refused = ConfigError("simulated: the store refused a request")
        for op in ("get", "get_range", "head", "list"):
            faulty.fail_randomly(op, 1.0, error=refused)
        wait_until(lambda: standby.last_error is not None, 30, "a failed cycle of the standby")
        code, body = health(standby.metrics_server.url)
        assert code == 503 and "simulated: the store refused a request" in body["reason"]
    finally:
        for s in stops:
            s.set()
        for t in threads:
            t.join(30)
        for st in stores:
            st.close()


def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    statelog.open(root).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        store = open_store(root)
        try:
            daemon = MaterializerDaemon(store, metrics_port=port)
            with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
                daemon.run(once=True)
        finally:
            store.close()
    with pytest.raises(ConfigError, match="metrics_port must be a TCP port"):
        MaterializerDaemon(open_store(root), metrics_port=70000)
