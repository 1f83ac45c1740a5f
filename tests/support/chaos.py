"""Killing worker processes of a running job at random moments (SIGKILL), and damaging the
local copies they restore from."""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime import JobClient


@dataclass
class Kills:
    count: int = 0
    after_checkpoint: int = 0  # kills when at least one checkpoint had completed
    at: list[float] = field(default_factory=list)


def kill_workers(
    client: JobClient,
    kills: int,
    rng: random.Random,
    min_delay_s: float = 0.2,
    max_delay_s: float = 0.8,
    start_timeout_s: float = 60.0,
) -> Kills:
    """SIGKILL one random worker per attempt, ``kills`` times, each a random delay after the
    attempt runs; stops early when the job ends."""
    out = Kills()
    t0 = time.monotonic()
    last = 0
    while out.count < kills:
        if not client.wait_running(last + 1, timeout=start_timeout_s):
            break
        time.sleep(rng.uniform(min_delay_s, max_delay_s))
        attempt = client.running_attempt
        pids = client.worker_pids()
        if client.done or attempt == 0 or not pids:
            continue
        try:
            os.kill(rng.choice(pids), signal.SIGKILL)
        except ProcessLookupError:
            continue
        last = attempt
        out.count += 1
        out.at.append(round(time.monotonic() - t0, 2))
        if client.completed_checkpoints:
            out.after_checkpoint += 1
    return out


def damage_copies(directory: Path, rng: random.Random, how: str = "either") -> int:
    """Flip a byte of (``how="flip"``) or truncate to half (``"truncate"``; ``"either"``: one
    of them at random) every local copy in ``directory``; their ``.copy`` records stay. How
    many were damaged."""
    damaged = 0
    for p in directory.rglob("*"):
        if not p.is_file() or p.name.endswith((".copy", ".tmp")):
            continue
        try:
            data = p.read_bytes()
            if not data:
                continue
            if how == "flip" or (how == "either" and rng.random() < 0.5):
                i = rng.randrange(len(data))
                p.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
            else:
                p.write_bytes(data[: len(data) // 2])
            damaged += 1
        except FileNotFoundError:  # evicted or replaced meanwhile
            continue
    return damaged
