"""The change feed: applied to the state at checkpoint A it gives the state at checkpoint B;
non-representable ranges and checkpoints of another lineage are refused clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from statelog import ValueStateDescriptor
from statelog.readers.restore import stream_state
from tests.support.spark import jobs
from tests.support.spark.reading import apply_feed, collect_all, reader, state_at


def feed(spark: Any, b: jobs.Built, name: str, a: Any, z: Any, **options: Any) -> Any:
    return reader(spark, b, operator="op", state=name, changesFrom=a, changesTo=z, **options).load()


def test_feed_applied_to_a_gives_b_for_every_state(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    # (c1, c4): B builds on the materialization of A itself; (c3, c4): both on m1, B's tail is longer
    cases = [(b.c1, b.c4, s) for s in jobs.STATES]
    cases += [(b.c3, b.c4, s) for s in ("seen", "attrs", "ttl_l", "ttl_m", "__timers_event")]
    results = collect_all([feed(spark, b, s, a, z) for a, z, s in cases])
    job = statelog.open(b.root, create=False)
    states: dict[tuple[int, str], Any] = {}

    def at(cid: int, name: str) -> Any:
        if (cid, name) not in states:
            states[(cid, name)] = state_at(job, cid, name)
        return states[(cid, name)]

    try:
        for (a, z, name), rows in zip(cases, results, strict=True):
            assert rows, (a, z, name, "no changes")
            before, after = at(a, name), at(z, name)
            assert jobs.norm(apply_feed(before, rows, name)) == jobs.norm(after), (a, z, name)
            assert {r["checkpoint_id"] for r in rows} <= {b.c2, b.c3, b.c4}
        # each change is attributed to the first retained checkpoint that includes it
        c3 = job.load_checkpoint(b.c3).operators["op"]
        ends = {r.stream: r.end for h in c3.subtasks for r in h.changelog}
        for (a, _z, name), rows in zip(cases, results, strict=True):
            if a != b.c1:
                continue
            for r in rows:
                assert r["checkpoint_id"] == (b.c3 if r["seq"] < ends.get(r["stream"], 0) else b.c4), name
                assert stream_state(r["stream"]) == name
    finally:
        job.close()


def test_feed_of_a_checkpoint_to_itself_is_empty(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    assert feed(spark, b, "count", b.c3, b.c3).count() == 0
    assert feed(spark, b, "count", b.c1, b.c2).count() == 0  # c2 only adopted m1


def _lineages(root: str) -> dict[str, int]:
    """k1; k2 materialized; k3 on it with a tail; then a second run restored from k1 writes k4."""
    count = ValueStateDescriptor("count", pa.int64())
    job = statelog.open(root, max_parallelism=16)
    job.materialization_poll_s = 0
    b = job.backend("op")
    st = b.get_state(count)

    def bump(n: int) -> None:
        for i in range(n):
            b.set_current_key(i % 5)
            st.update(i)

    bump(10)
    k1 = job.checkpoint().checkpoint_id
    bump(10)
    m2 = job.checkpoint()
    materialize(job.store, m2)
    bump(10)
    k3 = job.checkpoint().checkpoint_id
    job.close()
    job = statelog.open(root)
    b = job.backend("op", restore=k1)
    st = b.get_state(count)
    bump(3)
    k4 = job.checkpoint().checkpoint_id
    job.close()
    return {"k1": k1, "k2": m2.checkpoint_id, "k3": k3, "k4": k4}


def test_feed_refuses_what_it_cannot_represent(spark: Any, tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    k = _lineages(root)
    b = jobs.Built(root, {})
    # k3 builds on the materialization of k2: changes between k1 and k2 are materialized
    with pytest.raises(Exception, match=rf"between checkpoint {k['k1']} and checkpoint {k['k3']} are not "
                       rf"representable: .* materialization m-\S+ of checkpoint {k['k2']}.*changesFrom={k['k2']}"):
        feed(spark, b, "count", k["k1"], k["k3"])
    assert feed(spark, b, "count", k["k2"], k["k3"]).count() == 10
    # k4 was restored from k1, so it does not descend from k2 or k3
    with pytest.raises(Exception, match=rf"checkpoint {k['k4']} does not descend from checkpoint {k['k2']}"):
        feed(spark, b, "count", k["k2"], k["k4"])
    assert feed(spark, b, "count", k["k1"], k["k4"]).count() == 3
