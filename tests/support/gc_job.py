"""A job with checkpoints and adopted materializations, and a model of its state: the GC
tests (``tests/materializer/test_gc.py``) and others that need a materialized job with a known
state build it here.

Operators ``counter`` (parallelism 2: ``count``) and ``sessions`` (1: ``events``, ``attrs``),
one checkpoint per round, materializations after some of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa

import statelog
from materializer.build import MaterializeOptions, materialize
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.materialization.manifest import (
    Manifest,
    latest_manifest_key,
    load_manifest,
)
from statelog.store.base import ObjectStore
from tests.support.s3server import RootSpec
from tools.cli import main

MAXP = 32
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
EVENTS = ListStateDescriptor("events", pa.string())
ATTRS = MapStateDescriptor("attrs", pa.int64(), key_type=pa.string())
KEYS = [f"user-{i}" for i in range(32)]
OPTIONS = MaterializeOptions(units=8)  # few, larger files: fast tests, yet files are reused
FAR = 10 * 86400.0  # "now" this far ahead makes every object older than any grace period



@dataclass
class Built:
    spec: RootSpec
    metas: dict[int, CheckpointMetadata] = field(default_factory=dict)
    expected: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)  # cid -> state
    manifests: dict[int, Manifest] = field(default_factory=dict)  # checkpoint id -> its materialization


def empty_model() -> dict[str, dict[str, Any]]:
    return {"count": {}, "events": {}, "attrs": {}}


def copy_model(m: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        "count": dict(m["count"]),
        "events": {k: list(v) for k, v in m["events"].items()},
        "attrs": {k: dict(v) for k, v in m["attrs"].items()},
    }


def touched(round_: int) -> list[str]:
    """All keys in the first two rounds, then an eighth of them (untouched files get reused)."""
    return KEYS if round_ < 2 else [k for i, k in enumerate(KEYS) if i % 8 == round_ % 8]


def build(
    spec: RootSpec,
    rounds: int = 6,
    materialize_after: tuple[int, ...] = (2, 4),
    *,
    built: Built | None = None,
    model: dict[str, dict[str, Any]] | None = None,
    first_round: int = 0,
) -> Built:
    """Operators ``counter`` (parallelism 2: count) and ``sessions`` (1: events, attrs).

    One checkpoint per round; after the checkpoints of ``materialize_after`` (1-based round
    numbers) a materialization is published, which the backends adopt at the next checkpoint.
    """
    out = built or Built(spec)
    model = model if model is not None else empty_model()
    job = statelog.open(spec.url, store_options=dict(spec.options), max_parallelism=MAXP, retain_checkpoints=50)
    job.materialization_poll_s = 0
    try:
        last = job.latest_checkpoint()
        counters = [job.backend("counter", subtask=i, parallelism=2, restore=last) for i in range(2)]
        sessions = job.backend("sessions", restore=last)
        # restores are on demand: a backend adopts no materialization while key groups are
        # still loading (it needs the restored handles), so the checkpoints whose references
        # these tests check would depend on the background loader's pace
        for b in (*counters, sessions):
            b.wait_loaded()
        for round_ in range(first_round, first_round + rounds):
            for key in touched(round_):
                c = counters[statelog.subtask_for_key_group(MAXP, 2, statelog.key_group_of(key, MAXP))]
                c.set_current_key(key)
                count = c.get_state(COUNT)
                count.update(count.value() + round_ + 1)
                model["count"][key] = model["count"].get(key, 0) + round_ + 1
                sessions.set_current_key(key)
                sessions.get_state(EVENTS).add(f"e{round_}")
                model["events"].setdefault(key, []).append(f"e{round_}")
                sessions.get_state(ATTRS).put("round", round_)
                model["attrs"].setdefault(key, {})["round"] = round_
            meta = job.checkpoint(sources={"events": (round_ + 1) * 100})
            out.metas[meta.checkpoint_id] = meta
            out.expected[meta.checkpoint_id] = copy_model(model)
            if round_ + 1 in materialize_after:
                out.manifests[meta.checkpoint_id] = materialize(job.store, meta, options=OPTIONS)
    finally:
        job.close()
    return out


def read_state(spec: RootSpec, restore: Any, parallelism: int = 2) -> dict[str, dict[str, Any]]:
    """The logical state of both operators at ``restore``, read through ``parallelism`` subtasks."""
    job = statelog.open(spec.url, store_options=dict(spec.options), create=False)
    state = empty_model()
    try:
        for i in range(parallelism):
            b = job.backend("counter", subtask=i, parallelism=parallelism, restore=restore, changelog=False)
            b.get_state(COUNT)
            state["count"].update((k, v) for k, _ns, v in b.entries("count"))
        for i in range(parallelism):
            b = job.backend("sessions", subtask=i, parallelism=parallelism, restore=restore, changelog=False)
            b.get_state(EVENTS)
            b.get_state(ATTRS)
            state["events"].update((k, list(v)) for k, _ns, v in b.entries("events"))
            state["attrs"].update((k, dict(v)) for k, _ns, v in b.entries("attrs"))
    finally:
        job.close()
    return state


def assert_restorable(built: Built, cids: list[int] | None = None) -> None:
    """Every retained checkpoint (or ``cids``) restores to the model's state; verify is clean."""
    with built.spec.open() as store:
        retained = JobCatalog(store).checkpoint_ids()
    for cid in cids if cids is not None else retained:
        assert read_state(built.spec, cid) == built.expected[cid], f"checkpoint {cid}"
    assert verify(built.spec) == 0


def cli_args(spec: RootSpec) -> list[str]:
    args = []
    for k, v in spec.options.items():
        args += ["--store-option", f"{k}={v}"]
    return args


def verify(spec: RootSpec) -> int:
    return main(["verify", spec.url, *cli_args(spec)])


def listing(store: ObjectStore, prefix: str = "") -> dict[str, float]:
    return {o.key: o.mtime for o in store.list(prefix)}


def reachable(store: ObjectStore, cids: list[int]) -> set[str]:
    """Test oracle: every object the given checkpoints and the newest materialization reach."""
    out: set[str] = set()
    catalog = JobCatalog(store)
    manifests = set()
    for cid in cids:
        meta = catalog.load(cid)
        out |= meta.segment_names()
        manifests |= meta.manifest_keys()
    newest = latest_manifest_key(store)
    if newest:
        manifests.add(newest)
    for key in manifests:
        out.add(key)
        out |= load_manifest(store, key).paths()
    return out


def gc_scope(keys: Any) -> set[str]:
    return {k for k in keys if k.startswith(("changelog/", "materializations/"))}


def orphan(store: ObjectStore, tag: str) -> list[str]:
    """Leftovers: a segment of a dead writer, files of a materialization without manifest."""
    keys = [
        f"changelog/0000000000000-{tag:0>12}/0000000000.seg",
        f"materializations/data/m-000000000099-000000-{tag:0>8}/000-count-00000000-kg00000-00001.parquet",
    ]
    for k in keys:
        store.put(k, b"leftover " + tag.encode())
    return keys


# -- damaging a file:// root on purpose -------------------------------------------------------


def local_path(spec: RootSpec, key: str) -> Path:
    return Path(unquote(urlsplit(spec.url).path)) / key


def overwrite(spec: RootSpec, key: str, data: bytes) -> None:
    """Replace an object of a file:// root in place (what a careless copy does)."""
    path = local_path(spec, key)
    path.unlink()
    path.write_bytes(data)


def copy_over(spec: RootSpec, source: str, target: str) -> None:
    overwrite(spec, target, local_path(spec, source).read_bytes())


def swap_table_file(b: Built) -> str:
    """Copy one valid ``count`` table of M2 over another one of M2; returns the damaged path."""
    files = b.manifests[4].operators["counter"].files["count"]
    own = [f for f in files if f.path.startswith(f"materializations/data/{b.manifests[4].mid}/")]
    assert len(own) >= 1 and len(files) >= 2
    target = own[0]
    source = next(f for f in files if f.path != target.path)
    copy_over(b.spec, source.path, target.path)
    return target.path
