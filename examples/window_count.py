"""Demo: per-user event-time window counts that survive a SIGKILL, verified end to end.

A deterministic stream of (user, event time) events with bounded out-of-orderness is
processed by a user-loop job on the embedded ``file://`` store:

* ``total``: per-user event count (:class:`~statelog.ValueStateDescriptor`);
* ``window_count``: per-user tumbling event-time windows counted with reducing state in the
  window namespace, and one event-time timer per window (at its last millisecond) that fires
  on the watermark, emits ``(user, window start, count)`` and clears the window.

The job checkpoints every second of wall time and every ``events / 8`` events, recording the
source offset and the watermark in the checkpoint's sources. The first attempt runs in a
child process (``--worker``) that the parent SIGKILLs once it has processed the crash fraction
of the input and passed two checkpoints. The parent then restores the latest checkpoint,
checks the restored state against an independent plain-Python reference over the events
before the recorded offset, resumes from that offset to the end and checks the final totals
and the emitted windows (the output is at-least-once: windows emitted after the checkpoint by
the killed attempt are emitted again). See ``docs/demo.md``.

Run: ``python -m examples.window_count [--root URL] [--events N] [--seed S] [--crash-at F]
[--json]``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import operator
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn
from urllib.parse import unquote, urlsplit

import pyarrow as pa

import statelog
from statelog import KeyedStateBackend, ReducingStateDescriptor, StateJob, ValueStateDescriptor

OPERATOR_UID = "window-count"
SOURCE = "events"  # checkpoint sources: {"events": next offset, "watermark": watermark}
WINDOW_MS = 10_000
OUT_OF_ORDERNESS_MS = 2_000
MIN_WATERMARK = -(2**63)  # before any event (Flink's Long.MIN_VALUE)
END_OF_INPUT = 2**63 - 1  # the final watermark of a bounded input (Long.MAX_VALUE)
EPOCH_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z, the first event time
CHECKPOINT_INTERVAL_S = 1.0
CHECKPOINTS_PER_RUN = 8  # also checkpoint every events/8 events, so short runs get several
BATCH = 256  # events between checkpoint and progress checks
PROGRESS_EVERY = 4  # batches between progress reports of the worker
WORKER_TIMEOUT_S = 300.0

TOTAL = ValueStateDescriptor("total", pa.int64(), default=0)
WINDOW_COUNT = ReducingStateDescriptor("window_count", pa.int64(), reduce_fn=operator.add)

WindowKey = tuple[str, int]  # (user, window start)


# -- input ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Events:
    """The generated input: event ``i`` is ``(users[i], times[i])``; offsets index it."""

    users: list[str]
    times: list[int]

    def __len__(self) -> int:
        return len(self.times)

    def digest(self) -> str:
        crc = zlib.crc32("\n".join(self.users).encode())
        crc = zlib.crc32(b"".join(t.to_bytes(8, "big") for t in self.times), crc)
        return f"{crc:08x}"


def generate_events(n: int, users: int, seed: int) -> Events:
    """``n`` events over ``users`` users, about one per millisecond of event time.

    Event times increase with a lag of less than ``OUT_OF_ORDERNESS_MS``, so with the watermark
    ``max time - OUT_OF_ORDERNESS_MS - 1`` no event is late. Some users are much busier.
    """
    rng = random.Random(seed)
    names = [f"user-{i:04d}" for i in range(users)]
    out_users: list[str] = []
    out_times: list[int] = []
    t = EPOCH_MS
    for _ in range(n):
        t += rng.randrange(3)
        out_times.append(t - int(OUT_OF_ORDERNESS_MS * rng.random() ** 4))
        out_users.append(names[int(users * rng.random() ** 1.5)])
    return Events(out_users, out_times)


# -- the job -------------------------------------------------------------------------------------


class WindowCounter:
    """The stateful operator: per-user totals and tumbling event-time window counts."""

    def __init__(
        self,
        backend: KeyedStateBackend,
        emit: Callable[[Result], None],
        watermark: int = MIN_WATERMARK,
    ) -> None:
        self.backend = backend
        self.total = backend.get_state(TOTAL)
        self.window = backend.get_state(WINDOW_COUNT)
        self.emit = emit
        self.watermark = watermark
        self.late = 0

    def process(self, events: Events, start: int, stop: int) -> None:
        """Process events ``[start, stop)``, advancing the watermark after each one."""
        users, times = events.users, events.times
        set_key = self.backend.set_current_key
        total_value, total_update = self.total.value, self.total.update
        set_window, add = self.window.set_namespace, self.window.add
        register = self.backend.timers.register_event_time_timer
        wm = self.watermark
        for i in range(start, stop):
            ts = times[i]
            set_key(users[i])
            total_update(total_value() + 1)
            window_start = ts - ts % WINDOW_MS
            last_ms = window_start + WINDOW_MS - 1
            if last_ms <= wm:
                self.late += 1  # its window has fired already: dropped, as in Flink
            else:
                set_window(window_start)
                add(1)
                register(last_ms, window_start)
            if ts - OUT_OF_ORDERNESS_MS - 1 > wm:
                wm = ts - OUT_OF_ORDERNESS_MS - 1
                self.advance_watermark(wm, i + 1)
        self.watermark = wm

    def advance_watermark(self, watermark: int, offset: int) -> None:
        """Fire the timers of all windows ending at or before ``watermark``.

        ``offset`` is the number of events consumed so far; it is written with each result so
        that the demo can tell results emitted before and after a checkpoint apart.
        """
        self.watermark = max(self.watermark, watermark)
        for timer in self.backend.timers.advance_watermark(watermark):  # sets the current key
            self.window.set_namespace(timer.namespace)
            count = self.window.get()
            self.window.clear()
            if count is not None:
                self.emit(Result(timer.key, timer.namespace, count, offset))

    def snapshot(self) -> Snapshot:
        """The operator's live state, read through the backend (for verification)."""
        return Snapshot(
            totals={k: v for k, _ns, v in self.total.entries()},
            windows={(k, ns): v for k, ns, v in self.window.entries()},
            timers={(t.timestamp, t.key, t.namespace) for t in self.backend.timers.timers()},
            watermark=self.watermark,
        )


@dataclass(frozen=True)
class Result:
    """One window result, with the number of events consumed when it was emitted."""

    user: str
    window_start: int
    count: int
    offset: int


@dataclass
class Snapshot:
    """Operator state at an offset: from the backend (restored or final) or the reference."""

    totals: dict[str, int]
    windows: dict[WindowKey, int]
    timers: set[tuple[int, str, int]]
    watermark: int
    emitted: dict[WindowKey, int] = field(default_factory=dict)
    late: int = 0


class Sink:
    """At-least-once output: one JSON line per window result, written through at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: IO[str] = path.open("a", buffering=1, encoding="utf-8")
        self.count = 0

    def __call__(self, result: Result) -> None:
        self._f.write(json.dumps(asdict(result)) + "\n")
        self.count += 1

    def close(self) -> None:
        self._f.close()


def read_sink(path: Path) -> list[Result]:
    """Complete lines of a sink file (a SIGKILL may leave a torn last line, which is skipped)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return [Result(**json.loads(line)) for line in lines if line.endswith("\n")]


@dataclass
class RunStats:
    processed: int = 0
    seconds: float = 0.0
    checkpoints: int = 0
    last_checkpoint: statelog.CheckpointMetadata | None = None


def run(
    job: StateJob,
    counter: WindowCounter,
    events: Events,
    start: int,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> RunStats:
    """The source loop: process ``events[start:]`` and checkpoint periodically."""
    n = len(events)
    every = max(1, n // CHECKPOINTS_PER_RUN)
    batch = min(BATCH, every)
    stats = RunStats()
    t0 = last = time.monotonic()
    next_at = (start // every + 1) * every
    pos = start
    batches = 0
    while pos < n:
        stop = min(pos + batch, n)
        counter.process(events, pos, stop)
        pos = stop
        batches += 1
        now = time.monotonic()
        ckpt = pos >= next_at or now - last >= CHECKPOINT_INTERVAL_S
        if ckpt:
            sources = {SOURCE: pos, "watermark": counter.watermark}
            stats.last_checkpoint = job.checkpoint(sources=sources)
            stats.checkpoints += 1
            next_at = (pos // every + 1) * every
            last = now
        if report is not None and (ckpt or batches % PROGRESS_EVERY == 0 or pos == n):
            last_id = stats.last_checkpoint.checkpoint_id if stats.last_checkpoint else None
            report(
                {
                    "type": "progress",
                    "offset": pos,
                    "checkpoints": stats.checkpoints,
                    "checkpoint_id": last_id,
                    "seconds": time.monotonic() - t0,
                    "bytes_uploaded": job.writer.bytes_uploaded,
                }
            )
    stats.processed = pos - start
    stats.seconds = time.monotonic() - t0
    return stats


# -- the reference -------------------------------------------------------------------------------


def reference(events: Events, upto: int, end_of_input: bool = False) -> Snapshot:
    """The expected state after events ``[0, upto)``, computed with plain dicts and a heap."""
    totals: dict[str, int] = {}
    windows: dict[WindowKey, int] = {}
    emitted: dict[WindowKey, int] = {}
    due: list[tuple[int, str, int]] = []  # (last ms, user, window start)
    wm = MIN_WATERMARK
    late = 0

    def fire(watermark: int) -> None:
        while due and due[0][0] <= watermark:
            _, user, start = heapq.heappop(due)
            emitted[(user, start)] = windows.pop((user, start))

    for i in range(upto):
        user, ts = events.users[i], events.times[i]
        totals[user] = totals.get(user, 0) + 1
        start = ts - ts % WINDOW_MS
        if start + WINDOW_MS - 1 <= wm:
            late += 1
        elif (user, start) in windows:
            windows[(user, start)] += 1
        else:
            windows[(user, start)] = 1
            heapq.heappush(due, (start + WINDOW_MS - 1, user, start))
        if ts - OUT_OF_ORDERNESS_MS - 1 > wm:
            wm = ts - OUT_OF_ORDERNESS_MS - 1
            fire(wm)
    if end_of_input:
        wm = END_OF_INPUT
        fire(wm)
    timers = {(s + WINDOW_MS - 1, u, s) for u, s in windows}
    return Snapshot(totals, windows, timers, wm, emitted, late)


def diff(name: str, got: dict[Any, Any], want: dict[Any, Any]) -> list[str]:
    """Human-readable differences of two mappings (at most 3 examples)."""
    bad = [k for k in want.keys() | got.keys() if got.get(k) != want.get(k)]
    if not bad:
        return []
    shown = ", ".join(f"{k!r}: got {got.get(k)!r}, want {want.get(k)!r}" for k in sorted(bad)[:3])
    return [f"{name}: {len(bad)} differ ({shown})"]


def compare_restored(got: Snapshot, want: Snapshot) -> dict[str, Any]:
    problems = diff("totals", got.totals, want.totals)
    problems += diff("windows", got.windows, want.windows)
    problems += diff("timers", dict.fromkeys(got.timers, 1), dict.fromkeys(want.timers, 1))
    if got.watermark != want.watermark:
        problems.append(f"watermark: checkpoint has {got.watermark}, want {want.watermark}")
    return {
        "passed": not problems,
        "keys_compared": len(want.totals),
        "windows_compared": len(want.windows),
        "timers_compared": len(want.timers),
        "mismatches": problems,
    }


def compare_final(
    got: Snapshot, want: Snapshot, before: list[Result], after: list[Result], restored_at: int
) -> dict[str, Any]:
    """Check the final state and the output of both attempts against the reference.

    The union of both outputs, deduplicated by (user, window), must equal the reference; a
    window may only be emitted twice with the same count, and exactly the results the first
    attempt emitted after the restored checkpoint (``offset > restored_at``) are re-emitted.
    """
    union: dict[WindowKey, int] = {}
    conflicts = 0
    for r in before + after:
        if union.setdefault((r.user, r.window_start), r.count) != r.count:
            conflicts += 1
    problems = diff("totals", got.totals, want.totals)
    problems += diff("emitted windows", union, want.emitted)
    if conflicts:
        problems.append(f"{conflicts} windows were emitted twice with different counts")
    if got.windows or got.timers:
        problems.append(f"{len(got.windows)} windows and {len(got.timers)} timers left at the end")
    first = {(r.user, r.window_start) for r in before}
    second = {(r.user, r.window_start) for r in after}
    if len(first) != len(before) or len(second) != len(after):
        problems.append("an attempt emitted a window more than once")
    again = first & second
    expected = {(r.user, r.window_start) for r in before if r.offset > restored_at}
    if again != expected:
        problems.append(
            f"re-emitted {len(again)} windows, but the first attempt emitted {len(expected)} after "
            f"the restored checkpoint (offset {restored_at:,}); {len(again ^ expected)} differ"
        )
    return {
        "passed": not problems,
        "keys_compared": len(want.totals),
        "windows_compared": len(want.emitted),
        "emitted_before_crash": len(before),
        "emitted_after_restore": len(after),
        "re_emitted": len(again),
        "late_events": want.late,
        "mismatches": problems,
    }


# -- processes -----------------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> NoReturn:
    """First attempt: process from the start until killed (an unbounded source never ends)."""
    events = generate_events(args.events, args.users, args.seed)

    def report(msg: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    report({"type": "hello", "pid": os.getpid(), "digest": events.digest()})
    job = statelog.open(args.root)
    if job.latest_checkpoint() is not None:
        raise SystemExit(f"{args.root} already has checkpoints; attempt 1 needs a fresh root")
    sink = Sink(Path(args.workdir) / "output-attempt-1.jsonl")
    counter = WindowCounter(job.backend(OPERATOR_UID), sink)
    run(job, counter, events, 0, report)
    report({"type": "idle", "emitted": sink.count})
    while True:  # the input is exhausted: wait for more, as a streaming source would
        time.sleep(0.1)


@dataclass
class Crash:
    happened: bool = False
    pid: int = 0
    progress_offset: int = 0
    checkpoints: int = 0
    checkpoint_id: int | None = None
    bytes_uploaded: int = 0
    worker_seconds: float = 0.0
    returncode: int | None = None
    error: str | None = None


def run_first_attempt(args: argparse.Namespace, events: Events, workdir: Path) -> Crash:
    """Start the worker, follow its progress on its stdout and SIGKILL it at the crash point."""
    crash = Crash()
    project = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [
        sys.executable, "-m", "examples.window_count", "--worker", "--root", args.root,
        "--workdir", str(workdir), "--events", str(args.events), "--users", str(args.users),
        "--seed", str(args.seed),
    ]
    kill_at = args.crash_at * len(events)
    digest = events.digest()
    with (workdir / "worker.log").open("wb") as log, subprocess.Popen(
        cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=log, text=True
    ) as proc:
        crash.pid = proc.pid
        watchdog = threading.Timer(WORKER_TIMEOUT_S, proc.kill)  # a stuck worker ends the loop
        watchdog.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["type"] == "hello" and msg["digest"] != digest:
                crash.error = f"the worker generated other events (digest {msg['digest']})"
            elif msg["type"] == "progress":
                crash.progress_offset = msg["offset"]
                crash.checkpoints = msg["checkpoints"]
                crash.checkpoint_id = msg["checkpoint_id"]
                crash.bytes_uploaded = msg["bytes_uploaded"]
                crash.worker_seconds = msg["seconds"]
            due = crash.progress_offset >= kill_at and crash.checkpoints >= 2
            if crash.error or due or msg["type"] == "idle":
                os.kill(proc.pid, signal.SIGKILL)
                break
        crash.returncode = proc.wait()
        if not watchdog.is_alive():
            crash.error = f"the worker made no progress for {WORKER_TIMEOUT_S:.0f} s"
        watchdog.cancel()
    crash.happened = crash.returncode == -signal.SIGKILL and crash.checkpoints >= 2
    if crash.returncode != -signal.SIGKILL and crash.error is None:
        tail = (workdir / "worker.log").read_text(errors="replace")[-2000:]
        crash.error = f"the worker exited with {crash.returncode} before the crash point:\n{tail}"
    return crash


# -- the demo ------------------------------------------------------------------------------------


class Printer:
    """Human output with rich (lines are soft-wrapped); silent with ``--json``."""

    def __init__(self, quiet: bool) -> None:
        self.console: Any = None
        if not quiet:
            from rich.console import Console

            self.console = Console(highlight=False)

    def __call__(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, soft_wrap=True)


def verdict(passed: bool) -> str:
    return "[bold green]PASS[/]" if passed else "[bold red]FAIL[/]"


def default_locations(args: argparse.Namespace) -> tuple[str, Path]:
    """The job root URL and the local output directory (``<root dir>-run`` for file roots)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.root
    if root is None:
        base = Path.cwd() / "demo-output" / f"window-count-{stamp}"
        root_dir, i = base, 1
        while root_dir.exists():
            i += 1
            root_dir = base.with_name(f"{base.name}-{i}")
        root_dir.mkdir(parents=True)
        root = root_dir.as_uri()
    if args.workdir is not None:
        return root, Path(args.workdir).resolve()
    url = urlsplit(root)
    if url.scheme == "file" or (not url.scheme and root.startswith("/")):
        path = Path(unquote(url.path))
        return root, path.with_name(f"{path.name}-run")
    return root, Path.cwd() / "demo-output" / f"window-count-{stamp}-run"


def demo_main(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    out = Printer(args.json)
    args.root, workdir = default_locations(args)
    workdir.mkdir(parents=True, exist_ok=True)
    timing: dict[str, float] = {}

    t = time.monotonic()
    events = generate_events(args.events, args.users, args.seed)
    n = len(events)
    timing["generate_s"] = time.monotonic() - t
    out(f"[bold]window-count demo[/]: {n:,} events, {args.users:,} users, {WINDOW_MS // 1000} s "
        f"tumbling windows, out-of-orderness {OUT_OF_ORDERNESS_MS} ms, seed {args.seed}")
    out(f"  job root  {args.root}\n  output    {workdir}")
    with statelog.open(args.root) as probe:
        if probe.latest_checkpoint() is not None:
            return fail(args, out, f"{args.root} already has checkpoints; pass a fresh --root")

    # attempt 1: a worker process, SIGKILLed at the crash point
    t = time.monotonic()
    crash = run_first_attempt(args, events, workdir)
    timing["first_attempt_s"] = time.monotonic() - t
    if crash.error or not crash.happened:
        return fail(args, out, f"attempt 1 did not crash as planned: {crash.error or crash}")
    out(f"attempt 1: worker pid {crash.pid} [bold]SIGKILLed[/] at offset "
        f"~{crash.progress_offset:,} ({crash.progress_offset / n:.0%}) after "
        f"{crash.checkpoints} checkpoints")

    # attempt 2: restore the latest checkpoint here and verify it before going on
    job = statelog.open(args.root)
    latest = job.latest_checkpoint()
    if latest is None:
        return fail(args, out, "no completed checkpoint to restore from")
    offset, watermark = latest.sources[SOURCE], latest.sources["watermark"]
    sink = Sink(workdir / "output-attempt-2.jsonl")
    t = time.monotonic()
    counter = WindowCounter(job.backend(OPERATOR_UID, restore=latest), sink, watermark)
    timing["restore_s"] = time.monotonic() - t
    out(f"restored checkpoint {latest.checkpoint_id} (offset {offset:,}, "
        f"{latest.changelog_bytes:,} changelog bytes) in {timing['restore_s']:.3f} s")
    t = time.monotonic()
    restored = compare_restored(counter.snapshot(), reference(events, offset))
    timing["restore_verify_s"] = time.monotonic() - t
    out(f"{verdict(restored['passed'])} restore check: {restored['keys_compared']:,} user "
        f"totals, {restored['windows_compared']:,} open windows, "
        f"{restored['timers_compared']:,} timers and the watermark compared with the reference "
        f"over events [0, {offset:,})")
    for problem in restored["mismatches"]:
        out(f"  [red]{problem}[/]")

    t = time.monotonic()
    resumed = run(job, counter, events, offset)
    counter.advance_watermark(END_OF_INPUT, n)  # the input is bounded: fire every window
    final_meta = job.checkpoint(sources={SOURCE: n, "watermark": counter.watermark})
    timing["resume_s"] = time.monotonic() - t
    sink.close()
    uploaded = crash.bytes_uploaded + job.writer.bytes_uploaded
    out(f"resumed at offset {offset:,}: {resumed.processed:,} events, "
        f"{resumed.checkpoints + 1} checkpoints in {timing['resume_s']:.1f} s")

    t = time.monotonic()
    before, after = read_sink(workdir / "output-attempt-1.jsonl"), read_sink(sink.path)
    final = compare_final(counter.snapshot(), reference(events, n, True), before, after, offset)
    timing["final_verify_s"] = time.monotonic() - t
    job.close()
    out(f"{verdict(final['passed'])} final check: {final['keys_compared']:,} user totals and "
        f"{final['windows_compared']:,} window results (both attempts, deduplicated) compared "
        f"with the reference over all {n:,} events; {final['re_emitted']:,} windows emitted "
        f"again after the restore")
    for problem in final["mismatches"]:
        out(f"  [red]{problem}[/]")
    timing["total_s"] = time.monotonic() - t_start

    processed = crash.progress_offset + resumed.processed
    busy = crash.worker_seconds + resumed.seconds
    passed = restored["passed"] and final["passed"]
    result = {
        "passed": passed,
        "root": args.root,
        "workdir": str(workdir),
        "events": n,
        "users": args.users,
        "seed": args.seed,
        "window_ms": WINDOW_MS,
        "out_of_orderness_ms": OUT_OF_ORDERNESS_MS,
        "crash": {
            "happened": crash.happened,
            "signal": "SIGKILL",
            "crash_at": args.crash_at,
            "progress_offset": crash.progress_offset,
            "checkpoints_before": crash.checkpoints,
        },
        "restore": {
            "checkpoint_id": latest.checkpoint_id,
            "offset": offset,
            "watermark": watermark,
            "changelog_bytes": latest.changelog_bytes,
            "seconds": round(timing["restore_s"], 4),
            **restored,
        },
        "final": final,
        "checkpoints": {
            "before_crash": crash.checkpoints,
            "after_restore": resumed.checkpoints + 1,
            "total": crash.checkpoints + resumed.checkpoints + 1,
            "final_checkpoint_id": final_meta.checkpoint_id,
        },
        "changelog_bytes": {"uploaded": uploaded, "final_checkpoint": final_meta.changelog_bytes},
        "events_processed": processed,
        "events_per_second": round(processed / busy) if busy else None,
        "timing": {k: round(v, 3) for k, v in timing.items()},
    }
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(out, result)
    return 0 if passed else 1


def fail(args: argparse.Namespace, out: Printer, message: str) -> int:
    if args.json:
        print(json.dumps({"passed": False, "error": message}))
    out(f"[bold red]FAIL[/] {message}")
    return 1


def print_summary(out: Printer, r: dict[str, Any]) -> None:
    from rich.table import Table

    tm, ck, cb = r["timing"], r["checkpoints"], r["changelog_bytes"]
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("checkpoints", f"{ck['total']} ({ck['before_crash']} before the crash, "
                  f"{ck['after_restore']} after the restore)")
    table.add_row("changelog", f"{cb['uploaded']:,} bytes uploaded, "
                  f"{cb['final_checkpoint']:,} in the final checkpoint")
    table.add_row("restore", f"{tm['restore_s']:.3f} s ({r['restore']['changelog_bytes']:,} bytes)")
    table.add_row("throughput", f"{r['events_per_second']:,} events/s "
                  f"({r['events_processed']:,} events processed, replay included)")
    checks = tm["restore_verify_s"] + tm["final_verify_s"]
    table.add_row("time", f"{tm['total_s']:.1f} s (attempt 1 {tm['first_attempt_s']:.1f} s, "
                  f"resume {tm['resume_s']:.1f} s, checks {checks:.1f} s)")
    out.console.print(table)
    out(f"{verdict(r['passed'])} window-count demo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m examples.window_count", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--root", help="job root URL (default: fresh demo-output/window-count-<time>)")
    p.add_argument("--workdir", help="local directory for output files (default: <root dir>-run)")
    p.add_argument("--events", type=int, default=200_000, help="number of events (default 200000)")
    p.add_argument("--users", type=int, default=2_000, help="number of users (default 2000)")
    p.add_argument("--seed", type=int, default=42, help="seed of the generated input (default 42)")
    p.add_argument("--crash-at", type=float, default=0.6, help="SIGKILL point (default 0.6)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no summary")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0 < args.crash_at < 1:
        p.error("--crash-at must be a fraction between 0 and 1 (exclusive)")
    if args.events < 100 or args.users < 1:
        p.error("--events must be at least 100 and --users at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return worker_main(args) if args.worker else demo_main(args)


if __name__ == "__main__":
    sys.exit(main())
