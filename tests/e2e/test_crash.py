"""Crash test: a worker process writing state is SIGKILLed at random moments, many times.

The worker (``tests.support.crash_worker``) applies the deterministic operation stream of
``tests.support.crash_ops`` and checkpoints on a deterministic schedule, one-call and two-phase.
After every kill this test, in its own process and with a fresh ``statelog.open``:

* lists the checkpoints and checks that every listed one is complete (invariant 1): its
  metadata loads and verifies, its changelog ranges are covered by contiguous segments, and
  every referenced segment is present and verifies byte for byte; listed metadata never changes
  (invariant 2); a listed checkpoint is one the worker announced or was in the middle of
  publishing, with the offset it used;
* restores the latest checkpoint and one older retained checkpoint and compares every state,
  namespace and timer (TTL visibility at logical time = offset) with the reference model
  replayed over ops ``[0, offset)`` without any backend (invariant 3).

Across the run it requires enough kills after a checkpoint existed and progress across
restarts, and counts kills that landed in an in-flight checkpoint (``CrashStats``, printed;
run with ``-s`` to see it). The random wait before a kill counts from the worker's READY
line (restored, running), except for a few kills aimed at the startup and restore.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.crash_check import CrashChecker, CrashStats

PROJECT = Path(__file__).resolve().parents[2]
RETAIN = 5


class Worker:
    """One worker process; stdout lines are collected by a thread."""

    def __init__(self, root: str, seed: int, options: Mapping[str, Any], err_path: Path, disk: bool = False) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH")) if p)
        self.err_path = err_path
        self.spawned = time.monotonic()
        self._err = open(err_path, "wb")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.crash_worker",
                root,
                str(seed),
                "--options-json",
                json.dumps(dict(options)),
                "--retain",
                str(RETAIN),
                *(["--disk"] if disk else []),
            ],  # fmt: skip
            cwd=PROJECT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self.lines: list[str] = []
        self.first_line = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.first_line.set()
        self.first_line.set()

    def stderr(self) -> str:
        self._err.flush()
        return self.err_path.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def finish(self) -> None:
        """Kill (if still running), reap, and collect all output."""
        try:
            self.kill()
        finally:
            self._reader.join(30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._err.close()


def run_crash_loop(
    root: str,
    options: Mapping[str, Any],
    workdir: Path,
    *,
    kills: int,
    seed: int,
    wait: tuple[float, float] = (0.3, 2.0),
    startup_kills: float = 0.15,
    disk: bool = False,
    extra_kills: int | None = None,
) -> CrashStats:
    """Start, kill and check the worker ``kills`` times, then up to ``extra_kills`` (default
    ``kills``) more while no restored checkpoint had records after its seal (whether a kill
    lands there is timing: the loop goes on until the path it exists for was exercised).

    The random wait before a kill counts from the worker's READY line (restored and running),
    so neither interpreter startup nor the restore, which grows with the changelog, eats it;
    a fraction ``startup_kills`` of the kills instead aim at the startup and restore, 0 to
    0.6 s after the worker's first line.
    """
    checker = CrashChecker(root, options, seed)
    checker.disk = disk
    rng = random.Random(seed)
    t0 = time.monotonic()
    extra = kills if extra_kills is None else extra_kills
    n = -1
    while (n := n + 1) < kills or (n < kills + extra and checker.stats.checkpoints_past_seal == 0):
        at_startup = rng.random() < startup_kills
        delay = rng.uniform(0.0, 0.6) if at_startup else rng.uniform(*wait)
        worker = Worker(root, seed, options, workdir / f"worker-{n}.stderr", disk=disk)
        try:
            assert worker.first_line.wait(60), "the worker printed nothing within 60s"
            if not at_startup:
                deadline = time.monotonic() + 60
                while not any(line.startswith("READY") for line in worker.lines):
                    assert worker.alive(), f"worker {n} exited early:\n{worker.stderr()}"
                    assert time.monotonic() < deadline, f"worker {n} not READY within 60s"
                    time.sleep(0.005)
                checker.stats.startup_seconds += time.monotonic() - worker.spawned
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                assert worker.alive(), (
                    f"worker {n} died on its own (exit {worker.proc.returncode}):\n{worker.stderr()}"
                )
                time.sleep(0.005)
            worker.kill()
            assert worker.proc.returncode == -signal.SIGKILL, (
                f"worker {n} exited with {worker.proc.returncode} before the kill:\n{worker.stderr()}"
            )
        finally:
            worker.finish()
        started = time.monotonic()
        checker.after_kill(worker.lines)
        checker.stats.check_seconds += time.monotonic() - started
    stats = checker.stats
    stats.seconds = time.monotonic() - t0
    return stats


def check_stats(stats: CrashStats, kills: int, with_checkpoint: int) -> None:
    print(f"\ncrash test: {stats}")
    assert kills <= stats.kills <= 2 * kills  # (more while the cut at the seal was not exercised)
    assert stats.kills_with_checkpoint >= with_checkpoint, stats
    offsets = stats.latest_offsets
    assert offsets and offsets[-1] > offsets[0], f"no progress across restarts: {offsets}"
    grew = sum(b > a for a, b in zip(offsets, offsets[1:], strict=False))
    assert grew >= len(offsets) // 3, f"progress in only {grew} of {len(offsets) - 1} restarts"
    assert stats.restores_compared == len(offsets)
    assert stats.older_restores_compared >= with_checkpoint - 2
    # two-phase checkpoints whose last segment also holds records after the seal were restored
    # (the reader must cut them off): the path this test exists to cover is exercised
    assert stats.checkpoints_past_seal > 0, (
        "no restored checkpoint had records after its seal in its last segment; the two-phase "
        f"checkpoints of the worker no longer exercise the reader's cut at the seal: {stats}"
    )


# the suite's loops are short; STATELOG_LONG_LOOPS=1 runs the longer ones (22 and 9 kills)
LONG_LOOPS = os.environ.get("STATELOG_LONG_LOOPS") == "1"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("store", "kills", "with_checkpoint", "seed"),
    [("memory", 22, 15, 20240611) if LONG_LOOPS else ("memory", 10, 5, 20240611), ("disk", 8, 5, 20251125)],
    ids=["memory", "disk"],
)
def test_sigkill_loop_file(tmp_path: Path, store: str, kills: int, with_checkpoint: int, seed: int) -> None:
    """``disk``: the disk-backed working set (a 16-entry cache) in the worker and in the
    checker's restores."""
    root = (tmp_path / "root").as_uri()
    stats = run_crash_loop(root, {}, tmp_path, kills=kills, seed=seed, disk=store == "disk")
    check_stats(stats, kills, with_checkpoint=with_checkpoint)


@pytest.mark.slow
@pytest.mark.s3
def test_sigkill_loop_s3(s3_server: Any, tmp_path: Path) -> None:
    kills = 9 if LONG_LOOPS else 4
    spec = s3_server.unique_root()
    stats = run_crash_loop(spec.url, spec.options, tmp_path, kills=kills, seed=777)
    check_stats(stats, kills, with_checkpoint=kills * 2 // 3)
