"""A small job root shaped like the demo's, for the dashboard tests (``statelog ui``).

Two operators as in the clickstream demo: ``user-counts`` (parallelism 2: the demo's value
state ``clicks`` and map state ``pages`` per user) and ``clicks-per-window`` (parallelism 1: a
value state ``count`` per user and window). Six checkpoints; materializations of checkpoints
2 and 4, adopted by the next checkpoints (the changelog tail drops: the saw-tooth); savepoints
of checkpoints 3 and 6. Users are skewed: the first keys get most of the clicks, and the key
set grows every round, so state and key-group skew are visible.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

import statelog
from examples.clickstream import CLICKS, PAGE_CLICKS
from materializer.build import MaterializeOptions, materialize
from materializer.savepoint import create_savepoint
from statelog import ValueStateDescriptor
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.materialization.manifest import Manifest

MAXP = 16
ROUNDS = 6
MATERIALIZE_AFTER = (2, 4)
SAVEPOINTS = {"before-upgrade": 3, "nightly": 6}
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
OPTIONS = MaterializeOptions(units=4)


@dataclass
class DemoRoot:
    url: str
    metas: dict[int, CheckpointMetadata] = field(default_factory=dict)
    manifests: dict[int, Manifest] = field(default_factory=dict)  # checkpoint id -> materialization
    users: dict[int, set[str]] = field(default_factory=dict)  # checkpoint id -> users in the state
    windows: dict[int, set[tuple[str, int]]] = field(default_factory=dict)  # -> (user, window) keys


def users_of_round(round_: int) -> list[str]:
    """Clicks of one round: user u0 clicks most, u1 half as often, ...; 6 new users per round."""
    users = [f"u{i}" for i in range(6 * (round_ + 1))]
    return [u for i, u in enumerate(users) for _ in range(max(1, 12 >> i))]


def build_demo_root(path: Path) -> DemoRoot:
    out = DemoRoot(path.as_uri())
    job = statelog.open(out.url, max_parallelism=MAXP, retain_checkpoints=50)
    job.materialization_poll_s = 0
    users: set[str] = set()
    windows: set[tuple[str, int]] = set()
    try:
        counts = [job.backend("user-counts", subtask=i, parallelism=2) for i in range(2)]
        per_window = job.backend("clicks-per-window")
        offset = 0
        for round_ in range(ROUNDS):
            for n, user in enumerate(users_of_round(round_)):
                b = counts[statelog.subtask_for_key_group(MAXP, 2, statelog.key_group_of(user, MAXP))]
                b.set_current_key(user)
                clicks = b.get_state(CLICKS)
                clicks.update(clicks.value() + 1)
                b.get_state(PAGE_CLICKS).put(f"/page/{n % 5}", round_)
                per_window.set_current_key((user, round_))
                c = per_window.get_state(COUNT)
                c.update(c.value() + 1)
                users.add(user)
                windows.add((user, round_))
                offset += 1
            meta = job.checkpoint(sources={"clicks": {"clicks-0.jsonl": offset}})
            out.metas[meta.checkpoint_id] = meta
            out.users[meta.checkpoint_id] = set(users)
            out.windows[meta.checkpoint_id] = set(windows)
            if round_ + 1 in MATERIALIZE_AFTER:
                out.manifests[meta.checkpoint_id] = materialize(job.store, meta, options=OPTIONS)
        for name, cid in SAVEPOINTS.items():
            create_savepoint(job.store, cid, name, options=OPTIONS)
    finally:
        job.close()
    return out


def rows_per_key_group(keys: set) -> list[int]:
    """Rows per key group of a value state holding ``keys`` (one row per key)."""
    c = Counter(statelog.key_group_of(k, MAXP) for k in keys)
    return [c.get(g, 0) for g in range(MAXP)]
