"""On-demand restore (statelog/restore/ondemand/): key groups load when touched and in the background.

A state of value, map and list entries plus timers is checkpointed, materialized and given a
changelog tail; backends restored on demand are compared with eager restores of the same
checkpoint: after touching some key groups, with a checkpoint taken while others are not
loaded, at another parallelism, with a state registered late, and with a corrupt table file
that is only reached when its key group loads.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.build import MaterializeOptions, materialize
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.errors import CorruptionError
from statelog.keys.encoding import encode_key
from statelog.materialization.manifest import load_manifest
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.restore.ondemand.progress import KeyGroupState
from statelog.testing import FaultInjectingStore

MAXP = 32
N = 3000
V = ValueStateDescriptor("v", pa.int64(), default=0)
M = MapStateDescriptor("m", pa.int64())
L = ListStateDescriptor("l", pa.string())
# the on-demand restore options of the jobs the tests open (variants of the tests set them)
ON_DEMAND = OnDemandOptions()
# state tables in row groups of at most 16 rows, each key group of 8 rows or more its own
SLICED = MaterializeOptions(row_group_rows=16, min_row_group_rows=8)


def _build(root: str, layout: MaterializeOptions | None = None,
           writer_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Checkpoint 1 (materialized, in ``layout``), then a tail; checkpoint 2 builds on both."""
    with statelog.open(root, max_parallelism=MAXP, writer_options=writer_options) as job:
        b = job.backend("op")
        v, m, lst = b.get_state(V), b.get_state(M), b.get_state(L)
        for i in range(N):
            b.set_current_key(i)
            v.update(i)
            m.put("a", i)
            if i % 3 == 0:
                lst.add(f"x{i}")
            if i % 10 == 0:
                b.timers.register_event_time_timer(1000 + i)
        c1 = job.checkpoint()
        manifest = materialize(job.store, c1, options=layout)
        rng = random.Random(7)
        want_v = {i: i for i in range(N)}
        for i in rng.sample(range(N), 300):  # the tail: updates, deletes, new keys
            b.set_current_key(i)
            v.update(-i)
            m.remove("a")
            want_v[i] = -i
        for i in range(N, N + 50):
            b.set_current_key(i)
            v.update(i)
            want_v[i] = i
        for i in rng.sample(range(N + 50), 200):  # keys with several records in the tail
            b.set_current_key(i)
            v.update(v.value() * 2 + 1)
            want_v[i] = want_v[i] * 2 + 1
        c2 = job.checkpoint()
        assert c2.manifest_keys() == {manifest.key}
        versions = {job.store.get(name)[8:10] for name in c2.segment_names()}
        return {"c2": c2.checkpoint_id, "manifest": manifest, "want_v": want_v, "segment_versions": versions}


@pytest.fixture(params=["whole", "sliced", "split", "tail-first"])
def built(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    """``sliced``: the state tables have row groups of at most 16 rows, each key group of 8
    rows or more its own, so key groups (about 100 rows) load by slices of a row group.
    ``sliced`` and ``split``: touches read table files in ranges (footer, row groups).
    ``split``: the tail's segments are version 2, each stream's records in blocks of about
    32 rows by key-group range (format.md 4.2), so a touch reads one block of a segment.
    ``tail-first``: the first key group that needs its tail reads the whole tail (as for a
    tail of many small segments); otherwise a touch reads its key group's records alone."""
    options = {"segment_read_cost_bytes": 1 << 30 if request.param == "tail-first" else 0}
    layout, writer_options = None, None
    if request.param == "sliced":
        layout = SLICED
    if request.param in ("sliced", "split"):  # a touch reads a file's footer and row groups, not the whole file
        options["ranged_min_bytes"] = 0
    if request.param == "split":  # and a touch reads the tail's segments in ranges
        writer_options = {"split_min_rows": 64, "split_block_rows": 32}
        options["touch_whole_bytes"] = 0
    monkeypatch.setattr(sys.modules[__name__], "ON_DEMAND", OnDemandOptions(**options))
    root = (tmp_path / "root").as_uri()
    info = _build(root, layout, writer_options)
    assert (b"\x00\x02" in info["segment_versions"]) == (request.param == "split")
    info["ranged"] = request.param in ("sliced", "split")
    info["tail_first"] = request.param == "tail-first"
    return root, info


def _view(b: Any) -> dict[str, dict]:
    out = {}
    for d in (V, M, L):
        s = b.get_state(d)
        out[d.name] = {(k, ns): (dict(v) if isinstance(v, dict) else v) for k, ns, v in s.entries()}
    out["timers"] = {(t.timestamp, t.key) for t in b.timers.timers()}
    return out


def _eager(root: str, cid: int, subtask: int = 0, parallelism: int = 1) -> dict[str, dict]:
    with statelog.open(root, create=False) as job:
        job.on_demand_options = ON_DEMAND
        return _view(job.backend("op", restore=cid, changelog=False, subtask=subtask, parallelism=parallelism))


def _open(root: str, background: bool) -> statelog.StateJob:
    job = statelog.open(root, create=False, on_demand_restore=True)
    job.on_demand_background = background
    job.on_demand_options = ON_DEMAND
    return job


def test_the_restored_tail_is_what_was_written(built) -> None:
    """Eager and on-demand restores against the values written (not against each other)."""
    root, info = built
    want = {(k, None): v for k, v in info["want_v"].items()}
    assert _eager(root, info["c2"])[V.name] == want
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])
        v = b.get_state(V)
        for key in (17, 2, N + 3, *list(info["want_v"])[::97]):  # key groups loaded one by one
            b.set_current_key(key)
            assert v.value() == info["want_v"][key]
        b.wait_loaded()
        assert {(k, ns): x for k, ns, x in v.entries()} == want


def test_touched_key_groups_load_alone_and_a_checkpoint_while_loading_loses_nothing(built) -> None:
    root, info = built
    want = _eager(root, info["c2"])
    job = _open(root, background=False)
    b = job.backend("op", restore=info["c2"])
    v, m = b.get_state(V), b.get_state(M)
    assert b.loading and b.timers.timers()  # timers are restored when the backend opens
    key = 17
    kg = statelog.key_group_of(key, MAXP)
    b.set_current_key(key)
    assert v.value() == want["v"][(key, None)] and m.get("a") == want["m"].get((key, None), {}).get("a")
    v.update(1_000_000)  # a change in a loaded key group
    loaded = {k for table in v._tables.values() for k in table}  # the keys in memory now
    assert loaded and {statelog.key_group_of(k, MAXP) for k in loaded} == {kg}
    assert b.loading and b.restore_stats["first_key_group_s"] >= 0
    c3 = job.checkpoint()  # taken while the other key groups are not loaded
    assert b.loading
    job.close()
    want[V.name][(key, None)] = 1_000_000
    assert _eager(root, c3.checkpoint_id) == want


def test_background_loading_equals_eager_and_frees_the_loader(built) -> None:
    root, info = built
    want = _eager(root, info["c2"])
    with _open(root, background=True) as job:
        b = job.backend("op", restore=info["c2"])
        b.get_state(V)
        b.wait_loaded()
        assert not b.loading and b.restore_stats["fully_loaded_s"] > 0
        assert b.restore_stats["rows"] > N and b.restore_stats["records"] > 300
        assert _view(b) == want


def test_wait_loaded_after_touches_and_background_progress_equals_eager_and_stops_the_loader(built) -> None:
    """wait_loaded() takes over from the background thread (which it stops) and loads the
    rest itself: key groups touched, prepared in the background and left over all end up
    as in an eager restore, with the tail applied once."""
    root, info = built
    want = _eager(root, info["c2"])
    with _open(root, background=True) as job:
        b = job.backend("op", restore=info["c2"])
        v = b.get_state(V)
        loader = b._loader
        assert loader is not None
        for key in (5, 1234, 2999):
            b.set_current_key(key)
            v.update(v.value() + 0)  # a touch that writes the value it read
        deadline = time.monotonic() + 60
        while loader.progress.taken < 8 and time.monotonic() < deadline:  # some prepared in the background
            b.poll_loading()
            time.sleep(0.001)
        assert 3 <= loader.progress.taken < MAXP  # some loaded before, the rest by wait_loaded
        b.wait_loaded()
        assert not b.loading and loader.done and not loader.progress.thread.is_alive()
        assert b.restore_stats["rows"] == loader.rows > N
        assert _view(b) == want


def test_wait_loaded_names_a_corrupt_table_it_decodes_and_stays_failed(built) -> None:
    root, info = built
    bad, _kg = _corrupt_file_of_unloaded_key_group(root, info["manifest"])
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])
        b.get_state(V)
        with pytest.raises(CorruptionError) as exc:  # decoded by wait_loaded's pool
            b.wait_loaded()
        assert bad in str(exc.value)
        with pytest.raises(CorruptionError) as exc:
            b.wait_loaded()
        assert bad in str(exc.value) and b.loading
        with pytest.raises(CorruptionError):
            job.checkpoint()


def test_a_state_registered_after_key_groups_loaded_gets_their_entries(built) -> None:
    root, info = built
    want = _eager(root, info["c2"])
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])
        v = b.get_state(V)
        for key in (1, 2, 3, 500, 2999):
            b.set_current_key(key)
            assert v.value() == want["v"][(key, None)]
        m = b.get_state(M)  # registered now: the loaded key groups' entries were kept for it
        b.set_current_key(2)
        assert m.get("a") == want["m"].get((2, None), {}).get("a")
        assert _view(b) == want


@pytest.mark.parametrize("parallelism", [2, 3])
def test_rescaled_on_demand_restore_equals_eager(built, parallelism: int) -> None:
    root, info = built
    for subtask in range(parallelism):
        want = _eager(root, info["c2"], subtask, parallelism)
        with _open(root, background=subtask % 2 == 0) as job:
            b = job.backend("op", restore=info["c2"], subtask=subtask, parallelism=parallelism, changelog=False)
            assert _view(b) == want


def test_no_materialization_adopted_while_loading(built) -> None:
    root, info = built
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])
        b.get_state(V)
        b.set_current_key(5)
        c3 = job.checkpoint()
        newer = materialize(job.store, c3)
        assert not b.adopt_materialization(newer)  # its restored handles are still needed
        b.wait_loaded()
        assert b.adopt_materialization(newer)


def _corrupt_file_of_unloaded_key_group(root: str, manifest: Any) -> tuple[str, int]:
    files = manifest.operators["op"].files["v"]
    f = files[-1]  # the last key groups: not touched below
    path = Path(root.removeprefix("file://")) / f.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return f.path, f.key_groups.start


def test_a_corrupt_table_fails_when_its_key_group_loads_naming_it(built) -> None:
    root, info = built
    bad, kg = _corrupt_file_of_unloaded_key_group(root, info["manifest"])
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])  # opening reads no table file
        v = b.get_state(V)
        first = next(k for k in range(N) if statelog.key_group_of(k, MAXP) < kg)
        b.set_current_key(first)
        assert v.value() is not None
        key = next(k for k in range(N) if statelog.key_group_of(k, MAXP) == kg)
        with pytest.raises(CorruptionError) as exc:
            b.set_current_key(key)
        assert bad in str(exc.value)
        with pytest.raises(CorruptionError):  # and it stays failed, never silently empty
            b.wait_loaded()


def test_a_corrupt_table_found_by_the_background_loader_fails_the_task_and_checkpoints(built) -> None:
    root, info = built
    bad, _kg = _corrupt_file_of_unloaded_key_group(root, info["manifest"])
    with _open(root, background=True) as job:
        b = job.backend("op", restore=info["c2"])
        b.get_state(V)
        deadline = time.monotonic() + 60
        with pytest.raises(CorruptionError) as exc:  # installing what it prepared, until it fails
            while time.monotonic() < deadline:
                b.poll_loading()
                time.sleep(0.005)
        assert bad in str(exc.value)
        with pytest.raises(CorruptionError) as exc:
            job.checkpoint()
        assert bad in str(exc.value)


def test_opening_reads_no_table_file_and_loading_fetches_each_once(built) -> None:
    root, info = built
    manifest = load_manifest(statelog.open(root, create=False).store, info["manifest"].key)
    files = {f.path for name, fs in manifest.operators["op"].files.items() if not name.startswith("__") for f in fs}
    for background in (False, True):
        with _open(root, background=background) as job:
            b = job.backend("op", restore=info["c2"])
            loader = b._loader
            assert loader is not None
            if not background:
                assert loader.bytes_read == 0 and loader.files.fetched == 0  # opening read none
            v = b.get_state(V)
            if not background:
                b.set_current_key(17)  # a first touch
                assert v.value() == info["want_v"][17]
                # in ranges: the footer and row groups of the files holding its key group
                kg = statelog.key_group_of(17, MAXP)
                held = sum(1 for name, fs in manifest.operators["op"].files.items() if not name.startswith("__")
                           for f in fs if f.key_groups.start <= kg <= f.key_groups.end)  # fmt: skip
                assert held >= 2
                assert (loader.files.ranged, loader.files.fetched) == ((held, 0) if info["ranged"] else (0, held))
                assert loader.bytes_read > 0
            b.wait_loaded()
            assert loader.files.fetched == len(files) > 1  # every table file once
            assert b.restore_stats["rows"] == sum(
                f.rows for name, fs in manifest.operators["op"].files.items() if not name.startswith("__") for f in fs
            )


def test_a_first_touch_reads_its_tail_while_it_reads_its_table_files(built) -> None:
    """A first touch's requests for table files and for its tail's segments are in flight at
    once: the first of each kind waits for the other (read one after the other, the first
    would wait in vain, and the touch would fail)."""
    root, info = built
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])
        v = b.get_state(V)
        loader = b._loader
        assert loader is not None
        started = {"materializations/": threading.Event(), "changelog/": threading.Event()}
        met: list[str] = []
        lock = threading.Lock()

        def meet(_op: str, key: str) -> None:
            mine = next(p for p in started if key.startswith(p))
            other = next(p for p in started if p != mine)
            with lock:  # (the tail's segments are read by several threads)
                first = not started[mine].is_set()
                started[mine].set()
            if first:
                assert started[other].wait(20), f"{key} was read alone"
                met.append(mine)

        store = FaultInjectingStore(loader.files.store)
        for op in ("get", "get_range"):
            store.before(op, meet)
        loader.files.store = loader.tail.touch_reader.store = loader.tail.reader.store = store
        assert loader.tail.whole_first == info["tail_first"]
        b.set_current_key(17)
        assert v.value() == info["want_v"][17]
        assert sorted(met) == sorted(started)
        b.wait_loaded()
        assert _view(b) == _eager(root, info["c2"])


def test_the_background_thread_pauses_while_the_task_thread_prepares_and_installs(built) -> None:
    """A key group the task thread takes has priority until it is installed: the background
    thread waits at its next safe point instead of sharing the GIL with it."""
    root, info = built
    with _open(root, background=False) as job:
        b = job.backend("op", restore=info["c2"])
        b.get_state(V)
        loader = b._loader
        assert loader is not None
        passed: list[float] = []
        # stands in for the background thread: pause_for_task only pauses that thread
        loader.progress.thread = threading.Thread(
            target=lambda: (loader.progress.pause_for_task(), passed.append(time.monotonic()))
        )
        p = loader.take(statelog.key_group_of(17, MAXP))
        assert p is not None and loader.progress.urgent == 1
        loader.progress.thread.start()
        time.sleep(0.3)
        assert loader.progress.thread.is_alive() and not passed  # paused while the key group is not installed
        released = time.monotonic()
        loader.installed()
        loader.progress.thread.join(5)
        assert passed and passed[0] >= released
        b.set_current_key(1234)  # the backend says when what it took is installed
        assert loader.progress.urgent == 0


@pytest.mark.parametrize("store", ["memory", "disk"])
@pytest.mark.parametrize("background", [False, True])
def test_a_key_waits_only_for_its_slice_and_the_rest_loads_without_the_slices_handed_out(
    tmp_path: Path, store: str, background: bool
) -> None:
    """Key groups of several row groups load by slices: a key touched loads its slice alone
    (with its part of the tail); a checkpoint taken then, other slices of the same key group,
    and the rest (by the background thread, or by wait_loaded) give the eager restore."""
    root = (tmp_path / "root").as_uri()
    info = _build(root, SLICED)
    want = _eager(root, info["c2"])
    job = statelog.open(root, create=False, on_demand_restore=True, state_store=store)
    job.on_demand_background = background
    b = job.backend("op", restore=info["c2"])
    v, m = b.get_state(V), b.get_state(M)
    loader = b._loader
    assert loader is not None
    key = 17
    kg = statelog.key_group_of(key, MAXP)
    of_kg = [k for k in range(N + 50) if statelog.key_group_of(k, MAXP) == kg]
    b.set_current_key(key)
    assert v.value() == want["v"][(key, None)] and m.get("a") == want["m"].get((key, None), {}).get("a")
    if not background:
        assert loader.progress.state[kg] is KeyGroupState.PARTIAL
        assert loader.slices.taken[kg] == {loader.slices.index(kg, encode_key(key))}
        assert len(loader.slices.bounds[kg]) >= 4  # about 100 rows in row groups of at most 16
        if store == "memory":
            loaded = {k for table in v._tables.values() for k in table}
            assert key in loaded and loaded < set(of_kg)  # its slice, not the whole key group
    v.update(1_000_000)
    c3 = job.checkpoint()  # while the key group is loaded in part
    want3 = {name: dict(d) if isinstance(d, dict) else d for name, d in want.items()}
    want3[V.name][(key, None)] = 1_000_000
    for k in of_kg[::7]:  # other slices of it (and the slice of 17 again)
        b.set_current_key(k)
        got = v.value()
        if (k, None) in want3[V.name]:
            assert got == want3[V.name][(k, None)], k
        v.update(got + 1)
        want3[V.name][(k, None)] = got + 1
    b.wait_loaded()
    assert not b.loading and b.restore_stats["rows"] == loader.rows
    assert _view(b) == want3
    job.close()
    want[V.name][(key, None)] = 1_000_000
    assert _eager(root, c3.checkpoint_id) == want


@pytest.mark.parametrize("tail_first", [True, False], ids=["tail-first", "kept-blocks"])
def test_a_tail_of_many_small_segments_is_read_once_however_many_key_groups_are_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail_first: bool
) -> None:
    """A tail of a small segment per checkpoint (no materialization), its keys touched one by
    one: each segment is read once for all the touches, not once per key group. By default
    (``tail-first``: its segments are small) the first key group that needs its tail reads the
    whole tail; when touches read their key groups alone, the blocks of the segments they read
    whole are kept for the next touches. The state equals the values written either way.
    (With no table file, the tail read first is installed at once for every key group.)"""
    if not tail_first:
        monkeypatch.setattr(sys.modules[__name__], "ON_DEMAND", OnDemandOptions(segment_read_cost_bytes=0))
    root = (tmp_path / "root").as_uri()
    with statelog.open(root, max_parallelism=MAXP) as job:
        b = job.backend("op")
        v = b.get_state(V)
        for c in range(12):
            for i in range(40):
                b.set_current_key(i)
                v.update(c * 100 + i)
            last = job.checkpoint()
    with _open(root, background=False) as job:
        b = job.backend("op", restore=last.checkpoint_id)
        loader = b._loader
        assert loader is not None and loader.tail.whole_first == tail_first
        assert len({s.name for r in loader.tail.ranges for s in r.segments}) == 12
        reads: list[str] = []
        store = FaultInjectingStore(loader.files.store)
        for op in ("get", "get_range"):
            store.before(op, lambda _op, key: reads.append(key))
        loader.files.store = loader.tail.reader.store = loader.tail.touch_reader.store = store
        v = b.get_state(V)
        for i in range(40):
            b.set_current_key(i)
            assert v.value() == 1100 + i
            # a state that is only a small tail loads whole at its first touch, as eager does
            assert loader.done == tail_first
        segments = [k for k in reads if k.startswith("changelog/")]
        assert len(segments) == len(set(segments)) == 12, segments
        assert len({statelog.key_group_of(i, MAXP) for i in range(40)}) > 12
        b.wait_loaded()
        assert {k: x for k, _ns, x in v.entries()} == {i: 1100 + i for i in range(40)}
