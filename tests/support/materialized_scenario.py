"""The scenario of the materialization property test (``tests/e2e/test_property_materialized.py``,
also run against the Spark materializer by ``tests/materializer/test_spark_materialize.py``):
random state operations (``tests.support.state_ops``) with checkpoints, materializations
(some killed part-way), savepoints, restarts and GC runs, every restore compared with the
model. ``MAXP`` and ``ON_DEMAND`` are the jobs' settings; tests' variants patch them here."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

import statelog
from materializer.build import MaterializeOptions, materialize
from materializer.gc.collect import collect_garbage
from materializer.savepoint import create_savepoint
from statelog.checkpoint.catalog import load_savepoint, savepoint_names
from statelog.layout import MANIFEST_PREFIX
from statelog.materialization.manifest import latest_manifest_key, list_manifests, load_manifest
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.testing import FaultInjectingStore
from tests.support.harness import (
    DESCRIPTORS,
    Clock,
    Driver,
    Model,
    backend_timers,
    backend_view,
    register_all,
)
from tests.support.state_ops import DISK_CACHE_ENTRIES, STATE_OPS, is_lazy
from tools.cli import main as cli_main

MAXP = 16
ON_DEMAND = OnDemandOptions()  # the on-demand restore options of the jobs (tests' variants set them)
UID = "op"
JOB_RETAIN = 4

# ("materialize", which retained checkpoint from the newest, units, kill): kill is None (runs to
# completion), ("put", k, after) (the k-th put fails, before or after the object is stored) or
# ("manifest", after) (the manifest's put fails, before or after the manifest is stored)
KILL = st.one_of(
    st.none(),
    st.tuples(st.just("put"), st.integers(0, 8) | st.integers(0, 40), st.booleans()),
    st.tuples(st.just("manifest"), st.booleans()),
)
MATERIALIZE = st.tuples(st.just("materialize"), st.integers(0, 2) | st.just(0), st.sampled_from([1, 4, 16]), KILL)
_CONTROLS = {
    "checkpoint": st.tuples(st.just("checkpoint")),
    "materialize": MATERIALIZE,
    "gc": st.tuples(st.just("gc"), st.integers(1, 4), st.integers(1, 3)),  # (retention, restore parallelism)
    "savepoint": st.tuples(st.just("savepoint"), st.integers(0, 3)),
    "restart": st.tuples(st.just("restart"), st.integers(0, 3), st.booleans()),  # (pick, from a savepoint)
}
# weights by repetition (st.one_of would merge repeated alternatives)
CONTROL_OPS = st.sampled_from(
    ["checkpoint"] * 3 + ["materialize"] * 4 + ["gc"] * 2 + ["savepoint", "restart"]
).flatmap(_CONTROLS.__getitem__)
# steps: a burst of state operations, then one control operation
STEP = st.tuples(st.lists(STATE_OPS, max_size=20), CONTROL_OPS)
STEPS = st.lists(STEP, min_size=4, max_size=10)
STEPS_S3 = st.lists(STEP, min_size=3, max_size=7)
MAX_SAVEPOINTS = 3


def flatten(steps: list[tuple[list[tuple], tuple]]) -> list[tuple]:
    return [op for burst, control in steps for op in (*burst, control)]


class Killed(Exception):
    """The materializer process 'died' here."""


@dataclass
class Stats:
    materializations: int = 0
    killed: int = 0
    killed_after_publish: int = 0
    savepoints: int = 0
    gcs: int = 0
    restores_checked: int = 0
    restarts: int = 0
    deleted: int = 0
    adopted: set[str] = field(default_factory=set)


class Scenario:
    """``mode``: ``eager`` restores (compared at once), ``on-demand`` (key groups load when
    touched and in the background) or ``touched`` (only when touched); on-demand restores are
    compared at the next restart and at the end, after the operations that followed them, so
    checkpoints, materializations and GC happen while key groups are not loaded yet."""

    def __init__(self, root: str, options: dict[str, Any], mode: str = "eager",
                 layout: MaterializeOptions | None = None, writer_options: dict[str, Any] | None = None) -> None:
        self.root, self.options, self.mode = root, options, mode
        # the state tables' layout and the changelog writer's options (the -sliced variants set them)
        self.layout = layout or MaterializeOptions()
        self.writer_options = {"persist_delay": 0.002, **(writer_options or {})}
        self.clock = Clock()
        self.snapshots: dict[int, Model] = {}  # checkpoint id -> model at that checkpoint
        self.sp_models: dict[str, Model] = {}  # savepoint name -> model
        self.stats = Stats()
        self.job = self._open()
        self.driver = Driver(self.job.backend(UID, clock=self.clock), Model(), self.clock)
        self.driver.set_key(0)

    def _open(self) -> Any:
        job = statelog.open(
            self.root,
            store_options=self.options,
            max_parallelism=MAXP,
            writer_options=self.writer_options,
            retain_checkpoints=JOB_RETAIN,
            on_demand_restore=is_lazy(self.mode),
            state_store="disk" if self.mode.startswith("disk") else "memory",
        )
        job.on_demand_background = not self.mode.endswith("touched")
        job.on_demand_options = ON_DEMAND
        job.state_cache_entries = DISK_CACHE_ENTRIES
        job.materialization_poll_s = 0
        return job

    # -- operations -------------------------------------------------------------------------

    def run(self, ops: list[tuple]) -> Stats:
        for op in ops:
            kind = op[0]
            if kind == "checkpoint":
                self.checkpoint()
            elif kind == "materialize":
                self.materialize(*op[1:])
            elif kind == "gc":
                self.gc(op[1], op[2])
            elif kind == "savepoint":
                self.savepoint(op[1])
            elif kind == "restart":
                self.restart(op[1], op[2])
            else:
                self.driver.apply(op)
        self.driver.check_equal()
        self.gc(2, 2)
        self.job.close()
        return self.stats

    def checkpoint(self) -> int:
        meta = self.job.checkpoint(sources={"offset": len(self.snapshots)})
        self.snapshots[meta.checkpoint_id] = self.driver.model.copy()
        self.stats.adopted |= meta.manifest_keys()
        return meta.checkpoint_id

    def retained(self) -> list[int]:
        ids = self.job.catalog.checkpoint_ids()
        assert set(ids) <= set(self.snapshots), (ids, sorted(self.snapshots))
        return ids

    def materialize(self, pick: int, units: int, kill: tuple | None) -> None:
        ids = self.retained() or [self.checkpoint()]
        cid = ids[-1 - min(pick, len(ids) - 1)]
        meta = self.job.load_checkpoint(cid)
        store = FaultInjectingStore(self.job.store)
        puts = [0]
        index: dict[str, int] = {}  # object key -> the number of its put
        dead: list[str | None] = [None]  # the key whose put "killed" the process
        lock = threading.Lock()

        def doomed(key: str, after: bool) -> bool:
            if kill is None or kill[-1] != after:
                return False
            if kill[0] == "manifest":
                return key.startswith(MANIFEST_PREFIX)
            return index[key] == kill[1]

        def before(_op: str, key: str) -> None:
            with lock:
                if dead[0] is not None:  # a dead process writes nothing more
                    raise Killed(key)
                index[key] = puts[0]
                puts[0] += 1
                if doomed(key, False):
                    dead[0] = key
                    raise Killed(key)

        def after_put(_op: str, key: str) -> None:
            with lock:
                if doomed(key, True):
                    dead[0] = key
                    raise Killed(key)

        store.before("put", before)
        store.after("put", after_put)
        before_keys = {k for k, *_ in list_manifests(self.job.store)}
        self.stats.materializations += 1
        try:
            m = materialize(store, meta, options=replace(self.layout, units=units, upload_threads=2))
        except Killed:
            self.stats.killed += 1
            published = {k for k, *_ in list_manifests(self.job.store)} - before_keys
            assert len(published) <= 1
            assert kill is not None and dead[0] is not None
            assert bool(published) == (kill[-1] and dead[0].startswith(MANIFEST_PREFIX)), (kill, dead)
            if published:  # killed right after the manifest was durable
                self.stats.killed_after_publish += 1
                assert load_manifest(self.job.store, published.pop()).checkpoint_id == cid
            return
        assert kill is None or (kill[0] == "put" and kill[1] >= puts[0]), (kill, puts)
        assert m.checkpoint_id == cid and self.job.store.exists(m.key)

    def savepoint(self, pick: int) -> None:
        if len(self.sp_models) >= MAX_SAVEPOINTS:
            return
        ids = self.retained() or [self.checkpoint()]
        cid = ids[-1 - min(pick, len(ids) - 1)]
        name = f"sp-{len(self.sp_models)}"
        sp = create_savepoint(self.job.store, cid, name, options=self.layout)
        assert sp.checkpoint_id == cid and sp.kind == "savepoint"
        self.sp_models[name] = self.snapshots[cid].copy()
        self.stats.savepoints += 1

    def restart(self, pick: int, from_savepoint: bool) -> None:
        self.stats.restarts += 1
        if is_lazy(self.mode):
            self.driver.check_equal()  # the state restored on demand, plus what followed
        self.job.close(flush=False)  # crash: buffered records and in-memory state are gone
        self.job = self._open()
        ids = self.retained()
        if from_savepoint and self.sp_models:
            names = sorted(self.sp_models)
            name = names[-1 - min(pick, len(names) - 1)]
            restore: Any = f"savepoint:{name}"
            model = self.sp_models[name].copy()
        elif ids:
            restore = ids[-1 - min(pick, len(ids) - 1)]
            model = self.snapshots[restore].copy()
        else:
            restore, model = None, Model()
        self.driver = Driver(self.job.backend(UID, restore=restore, clock=self.clock), model, self.clock)
        if not is_lazy(self.mode):
            self.driver.check_equal()
        self.driver.set_key(0)

    def gc(self, retain: int, parallelism: int) -> None:
        # right after a checkpoint: every segment the live job wrote so far is referenced
        self.checkpoint()
        report = collect_garbage(self.job.store, retain_checkpoints=retain, grace_s=0)
        assert report.ok, report.errors
        self.stats.gcs += 1
        self.stats.deleted += report.objects_deleted
        ids = self.retained()
        assert len(ids) == min(retain, len(ids) + len(report.checkpoints_deleted))
        assert ids and ids[-1] == max(self.snapshots)
        self.check_no_leftovers()
        self.check_restores(ids, parallelism)
        args = ["verify", self.root]
        for k, v in self.options.items():
            args += ["--store-option", f"{k}={v}"]
        assert cli_main(args) == 0, "statelog verify found faults after GC"

    # -- checks -----------------------------------------------------------------------------

    def check_no_leftovers(self) -> None:
        store = self.job.store
        live: set[str] = set()
        metas = [self.job.load_checkpoint(c) for c in self.job.catalog.checkpoint_ids()]
        metas += [load_savepoint(store, n) for n in savepoint_names(store)]
        manifests = {k for m in metas for k in m.manifest_keys()}
        newest = latest_manifest_key(store)
        if newest is not None:
            manifests.add(newest)
        for m in metas:
            live |= m.segment_names()
        for key in manifests:
            live.add(key)
            live |= load_manifest(store, key).paths()
        objs = {o.key for p in ("changelog/", "materializations/") for o in store.list(p)}
        leftovers = objs - live
        assert not leftovers, f"GC left unreferenced objects: {sorted(leftovers)[:10]}"
        missing = {k for k in live if not k.startswith("savepoints/")} - objs
        assert not missing, f"referenced objects are missing: {sorted(missing)[:10]}"
        assert all(k.startswith(MANIFEST_PREFIX) or not k.endswith(".json") for k in objs - manifests)

    def check_restores(self, ids: list[int], parallelism: int) -> None:
        now = self.clock.now
        parallelism = min(parallelism, MAXP)
        job = statelog.open(self.root, store_options=self.options, create=False)
        job.on_demand_options = ON_DEMAND
        try:
            targets: list[tuple[Any, Model]] = [(cid, self.snapshots[cid]) for cid in ids]
            assert set(savepoint_names(job.store)) == set(self.sp_models)
            targets += [(f"savepoint:{n}", m) for n, m in sorted(self.sp_models.items())]
            for ref, model in targets:
                meta = job.resolve_checkpoint(ref)
                views: dict[str, dict] = {name: {} for name in DESCRIPTORS}
                timers: set = set()
                want = model.visible(now)
                keys = {k for view in want.values() for k, *_ in view}
                for i in range(parallelism):
                    b = job.backend(
                        UID, subtask=i, parallelism=parallelism, restore=meta, changelog=False,
                        clock=lambda: now,
                    )
                    if b.loading:  # restored on demand: some keys touched first (key groups or slices loaded alone)
                        for key in sorted(keys, key=repr)[i::3]:
                            if b.key_groups.start <= statelog.key_group_of(key, MAXP) <= b.key_groups.end:
                                b.set_current_key(key)
                    for name, view in backend_view(b, register_all(b)).items():
                        views[name].update(view)
                    timers |= backend_timers(b)
                for name in DESCRIPTORS:
                    assert views[name] == want[name], (
                        f"{ref} at parallelism {parallelism}: state {name!r} differs:\n"
                        f" got={views[name]}\nwant={want[name]}"
                    )
                assert timers == model.timers, f"{ref} at parallelism {parallelism}: timers differ"
                self.stats.restores_checked += 1
        finally:
            job.close()


def run_scenario(root: str, options: dict[str, Any], ops: list[tuple], mode: str = "eager", **kw: Any) -> Stats:
    return Scenario(root, options, mode, **kw).run(ops)
