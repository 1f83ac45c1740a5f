"""Crash test of the materializer: the daemon is SIGKILLed at random points, many times.

A producer in this process applies the deterministic operation stream of
``tests.support.crash_ops`` to a keyed backend and checkpoints every few hundred operations
(``sources={"offset": n}``), also while the materializer runs: its checkpoints adopt the
materializations the daemon publishes. The materializer is the real command line,
``statelog materializer run ROOT --once --max-tail-bytes 0 --retain 2 -v`` (the daemon:
lease, materialization of the newest checkpoint, fencing, publication, retention and GC
with the default grace period), started through ``tests.support.materializer_crash_worker`` so that
the interpreter start overlaps the previous iteration's checks. It is SIGKILLed after a
random delay: during its start and the lease acquisition, while it writes the tables
(measured from its "materializing checkpoint" log line, over about the duration of a
materialization), or right after its manifest appeared (during retention, GC and release).

After every kill, with the daemon dead:

* every retained checkpoint restores to the model replayed over ops ``[0, offset)``
  (``tests.support.crash_check.CrashChecker.compare_restore``);
* the next run completes and publishes: an in-process daemon takes the lease over from the
  dead one (after its ttl) and materializes the newest checkpoint; the producer's next
  checkpoint adopts that materialization and restores to the model too;
* GC with the grace period passed (``now`` = one hour later) leaves no object below
  ``materializations/`` and ``changelog/`` that no retained checkpoint or the newest
  materialization references, and none that they reference is missing.

``MatCrashStats`` (printed; run with ``-s``) counts where the kills landed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import statelog
from materializer.daemon.loop import MaterializerDaemon
from materializer.gc.collect import collect_garbage
from statelog.checkpoint.catalog import load_savepoint, savepoint_names
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.layout import DATA_PREFIX, MANIFEST_PREFIX, parse_manifest_key
from statelog.materialization.manifest import latest_manifest_key, list_manifests, load_manifest
from statelog.store import open_store
from tests.support.crash_check import CrashChecker
from tests.support.crash_ops import OPERATOR_UID, CrashDriver
from tests.support.crash_worker import DISK_CACHE_ENTRIES
from tests.support.harness import Clock, Model
from tools.cli import main as cli_main

PROJECT = Path(__file__).resolve().parents[2]
MAXP = 2  # few key groups: few table files per materialization, fast restores
RETAIN = 2
LEASE_TTL_S = 1.0  # the killed daemons' lease (the shortest valid one): the next run takes it over this long after the kill
COMPLETION_TTL_S = 3.0  # the in-process run's own lease: long, so that a busy machine does not fence it
GRACE_S = 600.0
CHECKPOINT_EVERY = 250  # producer operations between checkpoints
CHUNK = 10  # producer operations between looks at the daemon (every 10 ms: about 1000 ops/s)
PARTIAL_EVERY = 5  # daemons 1, 6, 11, ... are killed between their table files and their manifest


@dataclass
class MatCrashStats:
    kills: int = 0
    kills_at_startup: int = 0  # before the daemon held the lease
    kills_with_lease: int = 0  # lease held, no materialization started yet
    kills_materializing: int = 0  # tables being written, manifest not yet published
    kills_after_publish: int = 0  # manifest published, daemon still running (retention, GC, release)
    fenced: int = 0  # killed daemons that had refused to publish (their lease renewal came too late)
    runs_completed: int = 0  # daemons that finished before the kill
    partial_materializations: int = 0  # table files without a manifest found after a kill
    completions: int = 0  # in-process runs after a kill that published
    completion_waits_s: float = 0.0  # their lease takeover and materialization time, summed
    completion_retries: int = 0  # runs that ended in standby or fenced and were repeated ...
    completion_fenced: int = 0  # ... of which fenced (the lease was lost during the run)
    restores_compared: int = 0
    checkpoints: int = 0
    adopted: int = 0  # producer checkpoints that built on a materialization
    gc_deleted: int = 0
    gc_deleted_table_files: int = 0
    seconds: float = 0.0
    kill_phases: list[str] = field(default_factory=list)


class Producer:
    """The job: ops of ``tests.support.crash_ops`` at logical time = offset, one-call checkpoints."""

    def __init__(self, root: str, options: Mapping[str, Any], seed: int, disk: bool = False) -> None:
        self.seed = seed
        self.job = statelog.open(
            root, store_options=dict(options), max_parallelism=MAXP,
            # S3 requests are slower: flush less often, so that restores read fewer segments
            writer_options={"persist_delay": 0.25 if root.startswith("s3://") else 0.05},
            retain_checkpoints=RETAIN, state_store="disk" if disk else "memory",
        )
        if disk:
            self.job.state_cache_entries = DISK_CACHE_ENTRIES
        self.job.materialization_poll_s = 0
        self.clock = Clock(0)
        self.driver = CrashDriver(self.job.backend(OPERATOR_UID, clock=self.clock), Model(), self.clock)
        self.i = 0
        self.last_checkpoint_at = 0

    def step(self, n: int) -> None:
        for _ in range(n):
            self.driver.step(self.seed, self.i)
            self.i += 1
        if self.i - self.last_checkpoint_at >= CHECKPOINT_EVERY:
            self.checkpoint()

    def checkpoint(self) -> CheckpointMetadata:
        meta = self.job.checkpoint(sources={"offset": self.i})
        self.last_checkpoint_at = self.i
        return meta

    def close(self) -> None:
        self.job.close()


class Daemon:
    """``statelog materializer run ROOT --once ...`` in a worker process, stderr lines collected."""

    def __init__(self, root: str, options: Mapping[str, Any], err_path: Path) -> None:
        args = ["materializer", "run", root, "--once", "--max-tail-bytes", "1", "--lease-ttl",
                f"{LEASE_TTL_S}s", "--retain", str(RETAIN), "-v"]
        for k, v in options.items():
            args += ["--store-option", f"{k}={v}"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH")) if p)
        self.err_path = err_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.materializer_crash_worker", *args],
            cwd=PROJECT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        self.ready = threading.Event()
        self.lines: list[tuple[float, str]] = []  # (monotonic time, stderr line)
        self.started: float | None = None
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY"):
                self.ready.set()
        self.ready.set()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def go(self, hold_tables: bool = False) -> None:
        """Release the worker; ``hold_tables``: it stops after writing the table files."""
        assert self.ready.wait(60), "the crash worker did not start within 60s"
        assert self.proc.poll() is None, f"the crash worker exited early:\n{self.stderr()}"
        assert self.proc.stdin is not None
        self.proc.stdin.write("go hold-tables\n" if hold_tables else "go\n")
        self.proc.stdin.flush()
        self.started = time.monotonic()

    def seen(self, text: str) -> float | None:
        for t, line in list(self.lines):
            if text in line:
                return t
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def finish(self) -> None:
        self.kill()
        for t in self._threads:
            t.join(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self.err_path.write_text("\n".join(line for _, line in self.lines))

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines[-30:])


def manifest_keys(store: Any) -> set[str]:
    return {k for k, *_ in list_manifests(store)}


def live_objects(store: Any, job: Any) -> set[str]:
    """What the retained checkpoints, the savepoints and the newest materialization reach."""
    metas = [job.load_checkpoint(c) for c in job.catalog.checkpoint_ids()]
    metas += [load_savepoint(store, n) for n in savepoint_names(store)]
    manifests = {k for m in metas for k in m.manifest_keys()}
    newest = latest_manifest_key(store)
    if newest is not None:
        manifests.add(newest)
    live = {s for m in metas for s in m.segment_names()} | manifests
    for key in manifests:
        live |= load_manifest(store, key).paths()
    return live


class CrashLoop:
    def __init__(self, root: str, options: Mapping[str, Any], workdir: Path, seed: int, disk: bool = False) -> None:
        self.root, self.options, self.workdir = root, dict(options), workdir
        self.rng = random.Random(seed)
        self.producer = Producer(root, options, seed, disk)
        self.checker = CrashChecker(root, options, seed)
        self.checker.disk = disk
        self.store = open_store(root, options)
        self.stats = MatCrashStats()
        self.mat_seconds = 0.4  # how long a materialization takes, learned from the manifests

    def close(self) -> None:
        self.producer.close()
        self.store.close()

    def run(self, kills: int) -> MatCrashStats:
        """Run daemons until ``kills`` of them were killed (a few may finish first)."""
        t0 = time.monotonic()
        self.producer.step(CHECKPOINT_EVERY)
        nxt = Daemon(self.root, self.options, self.workdir / "daemon-0.stderr")
        n = 0
        while self.stats.kills < kills:
            assert n < kills + max(3, kills // 4), f"too many daemons finished before their kill: {self.stats}"
            daemon, nxt = nxt, None
            try:
                self.producer.step(CHECKPOINT_EVERY // 2)
                self.producer.checkpoint()  # the newest checkpoint has a tail: it is due
                before = manifest_keys(self.store)
                mode, delay = self.pick(n)
                daemon.go(hold_tables=mode == "partial")
                phase = self.drive(daemon, before, mode, delay)
                self.stats.kill_phases.append(phase)
            finally:
                daemon.finish()
            n += 1
            nxt = Daemon(self.root, self.options, self.workdir / f"daemon-{n}.stderr")  # starts meanwhile
            self.after_kill(n)
        nxt.finish()
        self.stats.seconds = time.monotonic() - t0
        return self.stats

    def pick(self, n: int) -> tuple[str, float]:
        """When to kill daemon ``n``: at a random point, except that every ``PARTIAL_EVERY``-th
        one stops between its table files and its manifest (``partial``) and is killed there,
        so that partial materializations are left behind whatever the machine's timing."""
        if n % PARTIAL_EVERY == 1:
            return "partial", 0.0
        r = self.rng.random()
        mode = "startup" if r < 0.12 else "published" if r < 0.32 else "materializing"
        delay = (
            self.rng.uniform(0.0, 0.25) if mode == "startup"
            else self.rng.uniform(0.0, 0.03) if mode == "published"
            else self.rng.uniform(0.0, 0.8 * self.mat_seconds)
        )
        return mode, delay

    def drive(self, daemon: Daemon, before: set[str], mode: str, delay: float) -> str:
        """Let the producer work while the daemon runs; kill it as ``mode`` and ``delay`` say."""
        assert daemon.started is not None
        killer = threading.Thread(target=self.killer, args=(daemon, mode, delay, before), daemon=True)
        killer.start()
        deadline = time.monotonic() + 60
        while daemon.alive():  # the job goes on meanwhile
            assert time.monotonic() < deadline, f"the daemon neither finished nor was killed:\n{daemon.stderr()}"
            self.producer.step(CHUNK)
            time.sleep(0.01)
        killer.join(30)
        daemon.kill()
        killed = daemon.proc.returncode == -signal.SIGKILL
        published = manifest_keys(self.store) - before
        assert len(published) <= 1, published
        for key in published:
            self.mat_seconds = 0.7 * self.mat_seconds + 0.3 * load_manifest(self.store, key).stats["duration_ms"] / 1000
        st = self.stats
        if not killed:
            assert daemon.proc.returncode == 0, f"the daemon failed ({daemon.proc.returncode}):\n{daemon.stderr()}"
            st.runs_completed += 1
            return "completed"
        st.kills += 1
        st.fenced += daemon.seen("not publishing the materialization") is not None
        if published:
            st.kills_after_publish += 1
            return "after-publish"
        if daemon.seen("materializing checkpoint") is not None:
            st.kills_materializing += 1
            return "partial" if daemon.seen("TABLES WRITTEN") is not None else "materializing"
        if daemon.seen("acquired generation") is not None:
            st.kills_with_lease += 1
            return "with-lease"
        st.kills_at_startup += 1
        return "startup"

    def killer(self, daemon: Daemon, mode: str, delay: float, before: set[str]) -> None:
        """Wait for the moment ``mode`` names, then ``delay`` more, then SIGKILL the daemon."""
        assert daemon.started is not None
        store = open_store(self.root, self.options) if mode == "published" else None
        try:
            start: float | None = daemon.started if mode == "startup" else None
            while start is None and daemon.alive():
                if mode == "materializing":
                    start = daemon.seen("materializing checkpoint")
                elif mode == "partial":
                    start = daemon.seen("TABLES WRITTEN")
                elif store is not None and manifest_keys(store) - before:
                    start = time.monotonic()
                time.sleep(0.002)
            if start is not None:
                time.sleep(max(0.0, start + delay - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                if daemon.alive():
                    daemon.proc.send_signal(signal.SIGKILL)
        finally:
            if store is not None:
                store.close()

    def complete(self, n: int, result: dict[str, Any]) -> None:
        """A daemon run to completion (retried while fenced or in standby), in a thread."""
        try:
            own = open_store(self.root, self.options)
            try:
                d = MaterializerDaemon(own, lease_ttl_s=COMPLETION_TTL_S, max_tail_bytes=1, run_gc=False,
                                       owner=f"completion-{n}", poll_s=0.05)
                for _ in range(6):
                    summary = d.run(once=True)
                    if summary is not None and summary["action"] == "materialized":
                        break
                    # --once gives up after about one ttl while the dead holder's lease is in the
                    # way; a renewal that came too late (a loaded machine) fences the publication
                    self.stats.completion_retries += 1
                    self.stats.completion_fenced += summary is not None and summary["action"] == "fenced"
                result["summary"] = summary
            finally:
                own.close()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = e

    def after_kill(self, n: int) -> None:
        st = self.stats
        store, job = self.store, self.producer.job
        # table files of a materialization without manifest: what the kill left behind
        mids = {parse_manifest_key(k)[0] for k in manifest_keys(store)}  # type: ignore[index]
        dirs = {o.key[len(DATA_PREFIX):].split("/", 1)[0] for o in store.list(DATA_PREFIX)}
        st.partial_materializations += len(dirs - mids)

        # the next run completes and publishes (taking the dead daemon's lease over after its
        # ttl): an in-process daemon, running while this thread checks the restores
        self.producer.step(CHECKPOINT_EVERY // 3)
        self.producer.checkpoint()  # the newest checkpoint has a tail again: it is due
        t0 = time.monotonic()
        result: dict[str, Any] = {}
        completion = threading.Thread(target=self.complete, args=(n, result), daemon=True)
        completion.start()

        # every retained checkpoint restores to the model
        for cid in job.catalog.checkpoint_ids():
            self.checker.compare_restore(job.load_checkpoint(cid))
            st.restores_compared += 1

        completion.join(120)
        assert not completion.is_alive(), "the in-process materializer did not finish within 120s"
        if "error" in result:
            raise result["error"]
        summary = result["summary"]
        st.completions += 1
        st.completion_waits_s += time.monotonic() - t0
        key = latest_manifest_key(store)
        assert key is not None and summary["materialization"]["id"] in key
        m = load_manifest(store, key)
        latest = job.catalog.checkpoint_ids()[-1]
        assert m.checkpoint_id == latest, (m.checkpoint_id, latest)
        # the job's next checkpoint builds on it and restores to the model
        self.producer.step(40)
        meta = self.producer.checkpoint()
        assert meta.manifest_keys() == {key}, (meta.manifest_keys(), key)
        st.adopted += 1
        self.checker.compare_restore(meta)
        st.restores_compared += 1

        # GC with the grace period passed: nothing unreferenced is left, nothing referenced is gone
        report = collect_garbage(store, grace_s=GRACE_S, now=time.time() + 6 * GRACE_S)
        assert report.ok, report.errors
        st.gc_deleted += report.objects_deleted
        st.gc_deleted_table_files += report.deleted["table_files"].objects
        live = live_objects(store, job)
        objs = {o.key for p in ("changelog/", "materializations/") for o in store.list(p)}
        assert not objs - live, f"after GC, unreferenced objects remain: {sorted(objs - live)[:10]}"
        gone = {k for k in live if not k.startswith("savepoints/")} - objs
        assert not gone, f"after GC, referenced objects are missing: {sorted(gone)[:10]}"
        assert all(k.startswith(MANIFEST_PREFIX) or k.startswith(DATA_PREFIX) or k.startswith("changelog/")
                   for k in objs)
        st.checkpoints = max(job.catalog.checkpoint_ids())


def run_loop(
    root: str, options: Mapping[str, Any], workdir: Path, kills: int, seed: int, disk: bool = False
) -> MatCrashStats:
    loop = CrashLoop(root, options, workdir, seed, disk)
    try:
        stats = loop.run(kills)
    finally:
        loop.close()
    # the whole root verifies
    args = ["verify", root]
    for k, v in options.items():
        args += ["--store-option", f"{k}={v}"]
    assert cli_main(args) == 0
    print(f"\nmaterializer crash test ({root.split(':')[0]}): {stats}")
    return stats


def check_stats(stats: MatCrashStats, kills: int) -> None:
    assert stats.kills == kills
    assert stats.kills_materializing >= kills // 4, stats
    assert stats.completions == stats.adopted == kills + stats.runs_completed
    assert stats.gc_deleted_table_files > 0, "GC never removed a table file"


# the suite's loop is short; STATELOG_LONG_LOOPS=1 runs the longer one (20 kills)
LONG_LOOPS = os.environ.get("STATELOG_LONG_LOOPS") == "1"


@pytest.mark.slow
@pytest.mark.parametrize(("store", "kills", "seed"), [("memory", 20 if LONG_LOOPS else 8, 4242), ("disk", 8, 4343)],
                         ids=["memory", "disk"])
def test_materializer_sigkill_loop_file(tmp_path: Path, store: str, kills: int, seed: int) -> None:
    """``disk``: the producer and the checker's restores on the disk-backed working set (a
    16-entry cache), restoring the daemon's Parquet tables into it."""
    stats = run_loop((tmp_path / "root").as_uri(), {}, tmp_path, kills, seed=seed, disk=store == "disk")
    check_stats(stats, kills)
    if store == "memory":
        # every PARTIAL_EVERY-th daemon is killed between its tables and its manifest
        partial_kills = stats.kill_phases.count("partial")
        assert partial_kills >= len(range(1, kills, PARTIAL_EVERY)), stats
        assert stats.partial_materializations >= partial_kills, stats
        assert stats.kills_after_publish >= 1, stats


@pytest.mark.slow
@pytest.mark.s3
def test_materializer_sigkill_loop_s3(s3_server: Any, tmp_path: Path) -> None:
    kills = 3
    spec = s3_server.unique_root()
    stats = run_loop(spec.url, spec.options, tmp_path, kills, seed=99)
    check_stats(stats, kills)
