"""Start-up benchmark: how long a fresh process takes before it does its work.

``python -m bench startup [--json] [--rounds N] [--quick]``. Every figure is the wall time
of a fresh process, measured ``ROUNDS`` times (interleaved: one of each per round); the
median counts, ``*_spread`` = (max - min) ÷ median.

* ``import_statelog_s``: ``python -c "import statelog"`` from spawn to exit.
* ``cli_help_s``: ``statelog --help`` (the console script next to ``sys.executable``).
* ``checkpoints_list_s``: ``statelog checkpoints list ROOT`` on a ``file://`` root with
  ``LIST_CHECKPOINTS`` checkpoints of ``KEYS`` keys.
* ``restart_first_record_s``: the guide's Kafka consumer loop (:mod:`bench.startup_loop`:
  ``statelog.open``, a backend restored from the latest checkpoint,
  ``materializer.start_background``, a ``confluent_kafka.Consumer``) on a ``file://`` root,
  against the test broker on loopback (``tests.support.kafka.broker.start_kafka``, as
  ``bench.kafka``) unless ``bootstrap`` names one. A first run processes ``KEYS`` records
  (one per key), checkpoints and is SIGKILLed; each round then starts the loop again and
  kills it once it has processed its first record. The figure is the time from just before
  the parent starts the process (``time.time()`` passed on its command line) to the first
  record processed (measured in the child), so it includes the interpreter's start, the
  imports, the restore of ``KEYS`` keys, taking over the dead process's writer lease and
  the consumer's first fetch.
* ``restart_breakdown`` (with ``--breakdown``): the steps of ``restart_first_record_s``,
  each the median over the rounds of its seconds (:data:`bench.startup_loop.STEPS`: the
  interpreter's start, the imports, ``statelog.open``, the backend's restore up to its
  return, the background materializer's start, the consumer's creation and assignment, the
  polls up to the first record, and the first record itself with its key group's load).
* ``bytecode_cache``: where the measured processes find compiled bytecode. An installed
  package has it (pip compiles it); a source tree gets it on first import, unless the
  environment sets ``PYTHONDONTWRITEBYTECODE``: then every fresh process would compile the
  project's ~200 modules again (~0.2 s of CPU). So the measured processes run with
  ``PYTHONPYCACHEPREFIX`` set to a temporary directory (``"prefix"``) and one unrecorded
  round first, which writes it; ``--no-bytecode-cache`` measures them as the environment
  has them (``"environment"``).
* ``import_profile``: ``python -X importtime`` of ``import statelog`` and of the loop's
  imports (``statelog.job``, ``materializer.background``, ``confluent_kafka``): the total and
  the top-level packages by cumulative import time (one process each, not a median).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEYS = 100_000
QUICK_KEYS = 2_000
ROUNDS = 7
LIST_CHECKPOINTS = 3
EXTRA_RECORDS = 1_000  # after the checkpoint: what a restarted loop processes first
WAIT_S = 120.0
TARGETS = {"import_statelog_s": 0.25, "cli_help_s": 0.3, "checkpoints_list_s": 0.5, "restart_first_record_s": 0.4}
PROFILE_TOP = 10

LOOP_IMPORTS = "import pyarrow, confluent_kafka, materializer.background, statelog.job"


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "statelog"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tools.cli"]


def child_env(pycache: Path | None) -> dict[str, str]:
    """The measured processes' environment: this one, with compiled bytecode written to and
    read from ``pycache`` (``None``: as this environment has it)."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=WAIT_S, env=env)
    elapsed = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    return elapsed


def _summary(values: list[float]) -> tuple[float, float]:
    med = statistics.median(values)
    return med, (max(values) - min(values)) / med if med else 0.0


def import_profile(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``python -X importtime -c code``: total seconds and the top-level packages by cumulative time."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         timeout=WAIT_S, check=True, env=env)  # fmt: skip
    packages: dict[str, float] = {}
    total = 0.0
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", line)
        if not m:
            continue
        cumulative, depth, name = int(m.group(2)) / 1e6, len(m.group(3)), m.group(4)
        if depth == 0:
            total += cumulative
        if "." not in name and not name.startswith("_"):
            packages[name] = max(packages.get(name, 0.0), cumulative)
    top = sorted(packages.items(), key=lambda kv: -kv[1])[:PROFILE_TOP]
    return {"total_s": round(total, 4), "top": [[name, round(s, 4)] for name, s in top]}


def make_list_root(url: str, keys: int) -> None:
    """A root with ``LIST_CHECKPOINTS`` checkpoints of ``keys`` keys (for ``checkpoints list``)."""
    import pyarrow as pa

    import statelog

    job = statelog.open(url)
    try:
        backend = job.backend("counts", restore="none")
        count = backend.get_state(statelog.ValueStateDescriptor("count", pa.int64(), default=0))
        for c in range(LIST_CHECKPOINTS):
            for k in range(keys):
                backend.set_current_key(k)
                count.update(count.value() + 1)
            job.checkpoint(sources={"input": {0: (c + 1) * keys}})
    finally:
        job.close()


def produce(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 500_000})
    for i in range(records):
        b = str(i % (records - EXTRA_RECORDS) if records > EXTRA_RECORDS else i).encode()
        while True:
            try:
                p.produce(topic, value=b, key=b, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(WAIT_S) != 0:
        raise RuntimeError(f"producer: records left unsent after {WAIT_S:.0f} s")


class Loop:
    """The consumer loop of :mod:`bench.startup_loop` as a child process."""

    def __init__(self, bootstrap: str, topic: str, root: str, every: int, env: dict[str, str] | None = None) -> None:
        self.t0 = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.startup_loop", bootstrap, topic, root, str(every), repr(self.t0)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
            env=env,
        )  # fmt: skip

    def wait_for(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"consumer loop exited {self.proc.wait()} before {word}: {err.strip()[-600:]}")
            if line.split()[:1] == [word]:
                return line.split()
        raise RuntimeError(f"consumer loop: no {word} within {WAIT_S:.0f} s")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def run(quick: bool = False, root: str | None = None, progress: bool = True, rounds: int | None = None,
        bootstrap: str | None = None, breakdown: bool = False, bytecode_cache: bool = True) -> dict[str, Any]:  # fmt: skip
    from contextlib import ExitStack

    keys = QUICK_KEYS if quick else KEYS
    rounds = rounds or (3 if quick else ROUNDS)
    if rounds < 1:
        raise ValueError(f"--rounds: expected at least 1, got {rounds}")
    load_before = os.getloadavg()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-startup-")))
        base = root.rstrip("/") if root else tmp.as_uri()
        list_root, loop_root = f"{base}/list", f"{base}/loop"
        env = child_env(tmp / "pycache" if bytecode_cache else None)
        _log(progress, f"startup: a root of {LIST_CHECKPOINTS} checkpoints x {keys} keys for checkpoints list")
        make_list_root(list_root, keys)
        if bootstrap is None:
            from tests.support.kafka.broker import start_kafka

            bootstrap = stack.enter_context(start_kafka()).bootstrap_servers
            from confluent_kafka.admin import AdminClient, NewTopic
        else:
            from confluent_kafka.admin import AdminClient, NewTopic
        topic = f"startup-{os.getpid()}-{int(time.time())}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
        produce(bootstrap, topic, keys + EXTRA_RECORDS)
        _log(progress, f"startup: first run of the loop ({keys} keys), killed after its checkpoint")
        first = Loop(bootstrap, topic, loop_root, keys, env)
        try:
            first.wait_for("CHECKPOINT")
        finally:
            first.kill()
        cli = _cli()
        runs: dict[str, list[float]] = {k: [] for k in TARGETS}
        pandas_loaded: list[int] = []
        steps: dict[str, list[float]] = {}
        if bytecode_cache:  # one unrecorded round writes the bytecode of what the rounds import
            for cmd in ([sys.executable, "-c", "import statelog"], [*cli, "--help"], [*cli, "checkpoints", "list", list_root]):
                _wall(cmd, env)
        for r in range(rounds):
            runs["import_statelog_s"].append(_wall([sys.executable, "-c", "import statelog"], env))
            runs["cli_help_s"].append(_wall([*cli, "--help"], env))
            runs["checkpoints_list_s"].append(_wall([*cli, "checkpoints", "list", list_root], env))
            loop = Loop(bootstrap, topic, loop_root, keys, env)
            try:
                line = loop.wait_for("FIRST")
                for step, seconds in json.loads(" ".join(loop.wait_for("BREAKDOWN")[1:])).items():
                    steps.setdefault(step, []).append(seconds)
            finally:
                loop.kill()
            runs["restart_first_record_s"].append(float(line[1]))
            pandas_loaded.append(int(line[3]))
            _log(progress, f"startup: round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()))
        profile = {
            "import_statelog": import_profile("import statelog", env),
            "consumer_loop_imports": import_profile(LOOP_IMPORTS, env),
        }
    result: dict[str, Any] = {"rounds": rounds, "keys": keys, "cli": " ".join(Path(c).name for c in cli),
                              "bytecode_cache": "prefix" if bytecode_cache else "environment"}  # fmt: skip
    for name, values in runs.items():
        med, spread = _summary(values)
        result[name] = round(med, 4)
        result[name.removesuffix("_s") + "_spread"] = round(spread, 3)
        result[name.removesuffix("_s") + "_target_s"] = TARGETS[name]
    result["restart_pandas_loaded_at_first_record"] = max(pandas_loaded)
    if breakdown:
        result["restart_breakdown"] = {step: round(statistics.median(v), 4) for step, v in steps.items()}
    result["import_profile"] = profile
    result["load_average_1m"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    result["cpus"] = os.cpu_count()
    return result
