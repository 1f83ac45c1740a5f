"""The clickstream demo: a parallel stream job that loses a worker half-way and still writes
every result exactly once, then Spark SQL over its state at two checkpoints.

``make demo`` runs ``python -m examples.clickstream``. Every claim is checked; the exit code
is 0 only if all checks pass. ``docs/demo.md`` walks through it.

1. **Input**: a clickstream of ``{"user", "page", "ts"}`` JSON lines in ``--partitions``
   append-only files, generated deterministically from ``--seed`` (event times increase with
   a random lag below 2 s, a few users are much busier than the rest).
2. **Job** (``runtime``, parallelism 2, exactly-once aligned checkpoints every second, the
   materializer in the job master's background): ``FileSource`` (uid ``clicks``, paced so the
   run takes a few seconds) -> ``key_by(user)`` ->
   * 10 s tumbling event-time windows counting clicks (uid ``clicks-per-window``) ->
     exactly-once ``FileSink`` ``windows/``: ``[user, window start, clicks]``;
   * a keyed process function (uid ``user-counts``) keeping per user a ``ValueState`` of clicks
     and a ``MapState`` of clicks per page, emitting ``[user, n]`` at every 100th click ->
     exactly-once ``FileSink`` ``milestones/``.
3. **Failure**: once a completed checkpoint covers half of the input, one worker process is
   SIGKILLed. The job master detects it, restarts from the latest checkpoint (sources rewound,
   uncommitted sink transactions aborted) and finishes.
4. **Checks**: both committed outputs equal the outputs computed from the input in plain
   Python, without a duplicate; ``statelog checkpoints list`` shows the checkpoints; Spark SQL
   reads the ``user-counts`` state at a checkpoint before the kill and at the final one, and
   each must equal the counts of exactly the events before that checkpoint's source positions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

import statelog
from runtime import (
    FileSink,
    FileSource,
    FixedDelay,
    KeyedProcessFunction,
    StreamExecutionEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from runtime.connectors.sinks import read_committed
from statelog import MapStateDescriptor, ValueStateDescriptor
from statelog.layout import parse_manifest_key
from statelog.materialization.manifest import list_manifests

EPOCH_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z
STEP_MS = 4  # event time between two clicks of one partition
OUT_OF_ORDERNESS_MS = 2_000
WINDOW_MS = 10_000
MILESTONE = 100
PAGES = ("/", "/search", "/cart", "/checkout", "/help") + tuple(f"/product/{i}" for i in range(15))

CLICKS = ValueStateDescriptor("clicks", pa.int64(), default=0)
PAGE_CLICKS = MapStateDescriptor("pages", pa.int64(), key_type=pa.string())


# -- input ---------------------------------------------------------------------------------------


def generate(directory: Path, events: int, users: int, partitions: int, seed: int) -> list[list[tuple[str, str, int]]]:
    """Write the input files; returns the clicks of each partition in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(partitions):
        rng = random.Random(f"{seed}:{k}")
        n = events // partitions + (1 if k < events % partitions else 0)
        clicks = []
        for i in range(n):
            user = f"u{int(users * rng.random() ** 3):05d}"  # skewed: low ids are busy
            ts = EPOCH_MS + i * STEP_MS - rng.randrange(OUT_OF_ORDERNESS_MS)
            clicks.append((user, rng.choice(PAGES), ts))
        with open(directory / f"clicks-{k:02d}.jsonl", "w") as f:
            f.writelines(json.dumps({"user": u, "page": p, "ts": t}) + "\n" for u, p, t in clicks)
        out.append(clicks)
    return out


def parse_click(line: bytes) -> tuple[str, str, int]:
    d = json.loads(line)
    return (d["user"], d["page"], d["ts"])


def click_ts(c: tuple[str, str, int]) -> int:
    return c[2]


def click_user(c: tuple[str, str, int]) -> str:
    return c[0]


# -- the job -------------------------------------------------------------------------------------


class CountClicks:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + 1

    def get_result(self, acc: int) -> int:
        return acc


def window_row(user: str, window: Any, clicks: int) -> list[Any]:
    return [user, window.start, clicks]


class UserCounts(KeyedProcessFunction):
    """Per user: clicks in total and per page; ``[user, n]`` at every ``MILESTONE``-th click."""

    def open(self, ctx: Any) -> None:
        self.clicks = ctx.get_state(CLICKS)
        self.pages = ctx.get_state(PAGE_CLICKS)

    def process_element(self, click: Any, ctx: Any) -> Any:
        n = self.clicks.value() + 1
        self.clicks.update(n)
        page = click[1]
        self.pages.put(page, (self.pages.get(page) or 0) + 1)
        if n % MILESTONE == 0:
            yield [click[0], n]


def build(env: StreamExecutionEnvironment, input_dir: Path, out: Path, rate: float | None) -> None:
    clicks = env.from_source(
        FileSource(input_dir, "clicks-*.jsonl", parse=parse_click, records_per_s=rate),
        uid="clicks",
        watermarks=WatermarkStrategy(click_ts, OUT_OF_ORDERNESS_MS),
    )
    by_user = clicks.key_by(click_user)
    (
        by_user.window(TumblingEventTimeWindows(WINDOW_MS))
        .aggregate(CountClicks(), uid="clicks-per-window", window_function=window_row)
        .sink_to(FileSink(out / "windows"), uid="windows-out")
    )
    by_user.process(UserCounts(), uid="user-counts").sink_to(FileSink(out / "milestones"), uid="milestones-out")


# -- expected results ----------------------------------------------------------------------------


def expected_windows(parts: list[list[tuple[str, str, int]]]) -> list[list[Any]]:
    c = Counter((u, t - t % WINDOW_MS) for part in parts for u, _, t in part)
    return sorted([u, s, n] for (u, s), n in c.items())


def expected_milestones(parts: list[list[tuple[str, str, int]]]) -> list[list[Any]]:
    totals = Counter(u for part in parts for u, _, _ in part)
    return sorted([u, m] for u, n in totals.items() for m in range(MILESTONE, n + 1, MILESTONE))


def counts_before(parts: list[list[tuple[str, str, int]]], positions: dict[str, Any]) -> Counter[str]:
    """Clicks per user among the events before the given split positions (file name -> pos)."""
    c: Counter[str] = Counter()
    for k, part in enumerate(parts):
        pos = positions.get(f"clicks-{k:02d}.jsonl", {"offset": 0})
        c.update(u for u, _, _ in part[: int(pos["offset"])])
    return c


def compare(name: str, got: list[Any], want: list[Any]) -> dict[str, Any]:
    g = Counter(json.dumps(r) for r in got)
    w = Counter(json.dumps(r) for r in want)
    dups = sum(n - 1 for n in g.values() if n > 1)
    missing = sum((w - g).values())
    extra = sum((g - w).values())
    return {
        "name": name, "records": len(got), "expected": len(want), "duplicates": dups,
        "missing": missing, "unexpected": extra, "passed": g == w,
    }  # fmt: skip


# -- the run -------------------------------------------------------------------------------------


def covered_fraction(job: statelog.StateJob, cid: int, total: int) -> float:
    meta = job.load_checkpoint(cid)
    return sum(int(p["offset"]) for p in meta.sources.get("clicks", {}).values()) / total


def kill_half_way(client: Any, root: str, total: int, rng: random.Random, timeout_s: float) -> dict[str, Any]:
    """SIGKILL one worker once a completed checkpoint covers half of the input."""
    if not client.wait_running(1, timeout=timeout_s):
        raise RuntimeError("the job did not start")
    deadline = time.monotonic() + timeout_s
    with statelog.open(root, create=False) as job:
        while time.monotonic() < deadline and not client.done:
            done = client.completed_checkpoints
            if len(done) >= 2 and covered_fraction(job, done[-1], total) >= 0.5:
                pid = rng.choice(client.worker_pids())
                frac = covered_fraction(job, done[-1], total)
                os.kill(pid, signal.SIGKILL)
                return {"happened": True, "pid": pid, "after_checkpoint": done[-1],
                        "checkpoints_before": len(done), "covered": round(frac, 3)}  # fmt: skip
            time.sleep(0.05)
    return {"happened": False}


def _width() -> int:
    """Columns for the checkpoint table: the terminal's, at least 120 (lines may wrap)."""
    return max(120, shutil.get_terminal_size((160, 24)).columns)


def list_checkpoints(root: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "checkpoints", "list", root],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": str(_width())},
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"statelog checkpoints list failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def spark_checks(root: str, parts: list[list[tuple[str, str, int]]], early: int, final: int) -> dict[str, Any]:
    """Spark SQL over ``user-counts`` at two checkpoints, each compared with the input."""
    import statelog.spark

    spark = statelog.spark.session(master="local[2]")
    try:
        with statelog.open(root, create=False) as job:
            positions = {cid: job.load_checkpoint(cid).sources["clicks"] for cid in (early, final)}
        for cid, view in ((early, "clicks_early"), (final, "clicks_final")):
            (spark.read.format("statelog").option("root", root).option("checkpoint", cid)
             .option("operator", "user-counts").option("state", "clicks").option("keyType", "string")
             .load().createOrReplaceTempView(view))
        totals = {
            cid: spark.sql(f"SELECT count(*) AS users, sum(value) AS clicks FROM {view}").first().asDict()
            for cid, view in ((early, "clicks_early"), (final, "clicks_final"))
        }
        movers_sql = (
            "SELECT f.key AS user, coalesce(e.value, 0) AS before, f.value AS after, "
            "f.value - coalesce(e.value, 0) AS clicks "
            "FROM clicks_final f LEFT JOIN clicks_early e ON f.key = e.key "
            "ORDER BY clicks DESC, user LIMIT 5"
        )
        movers = [r.asDict() for r in spark.sql(movers_sql).collect()]
        rows = {
            cid: {r["key"]: r["value"] for r in spark.sql(f"SELECT key, value FROM {view}").collect()}
            for cid, view in ((early, "clicks_early"), (final, "clicks_final"))
        }
    finally:
        spark.stop()
    out: dict[str, Any] = {"checkpoints": {}, "movers_sql": movers_sql, "movers": movers}
    passed = True
    for cid in (early, final):
        want = counts_before(parts, positions[cid])
        ok = rows[cid] == dict(want) and totals[cid]["clicks"] == sum(want.values())
        passed &= ok
        out["checkpoints"][str(cid)] = {
            "users": totals[cid]["users"], "clicks": totals[cid]["clicks"],
            "events_before_positions": sum(want.values()), "passed": ok,
        }  # fmt: skip
    want_final, want_early = counts_before(parts, positions[final]), counts_before(parts, positions[early])
    moves = sorted(((want_final[u] - want_early[u], u) for u in want_final), key=lambda t: (-t[0], t[1]))[:5]
    movers_ok = [(m["clicks"], m["user"]) for m in movers] == moves
    out["movers_passed"] = movers_ok
    out["passed"] = passed and movers_ok
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    base = Path(args.dir).resolve() if args.dir else _fresh_dir()
    input_dir, out_dir, root = base / "input", base / "output", (base / "state").as_uri()
    timing: dict[str, float] = {}
    t = time.monotonic()
    parts = generate(input_dir, args.events, args.users, args.partitions, args.seed)
    total = sum(map(len, parts))
    timing["generate_s"] = time.monotonic() - t

    env = StreamExecutionEnvironment(
        parallelism=2,
        checkpoint_interval_s=1.0,
        mode="exactly_once_aligned",
        state_root=root,
        restart_strategy=FixedDelay(attempts=3, delay_s=0.5),
        retain_checkpoints=1000,  # keep them all: the demo queries an early one
        materializer={"interval_s": args.materialize_every},
    )
    rate = args.rate / 2 if args.rate else None  # per source subtask
    build(env, input_dir, out_dir, rate)
    t = time.monotonic()
    client = env.execute_async("clickstream")
    kill = kill_half_way(client, root, total, random.Random(args.seed), timeout_s=120)
    result = client.wait(300)
    timing["job_s"] = time.monotonic() - t

    t = time.monotonic()
    outputs = [
        compare("windows", read_committed(out_dir / "windows"), expected_windows(parts)),
        compare("milestones", read_committed(out_dir / "milestones"), expected_milestones(parts)),
    ]
    timing["verify_s"] = time.monotonic() - t
    with statelog.open(root, create=False) as job:
        manifests = [cid for _, cid, _, _ in list_manifests(job.store)]
        final_meta = job.load_checkpoint(result.final_checkpoint)
        materialized = sorted({parse_manifest_key(k)[1] for k in final_meta.manifest_keys()})
    listing = list_checkpoints(root)
    early = kill.get("after_checkpoint") or result.completed_checkpoints[len(result.completed_checkpoints) // 2]
    t = time.monotonic()
    sql = spark_checks(root, parts, early, result.final_checkpoint)
    timing["spark_s"] = time.monotonic() - t
    timing["total_s"] = time.monotonic() - t_start
    passed = (
        kill.get("happened", False)
        and result.restarts >= 1
        and len(manifests) > 0
        and all(o["passed"] for o in outputs)
        and sql["passed"]
    )
    return {
        "passed": bool(passed),
        "dir": str(base),
        "root": root,
        "events": total,
        "users": args.users,
        "partitions": args.partitions,
        "kill": kill,
        "attempts": result.attempts,
        "restores": {str(a): dict(st) for a, st in result.restore_stats.items()},
        "failures": result.failures,
        "checkpoints": result.completed_checkpoints,
        "final_checkpoint": result.final_checkpoint,
        "final_checkpoint_materialization": materialized,
        "manifests": manifests,
        "outputs": outputs,
        "checkpoints_list": listing,
        "spark_sql": sql,
        "timing": {k: round(v, 2) for k, v in timing.items()},
    }


def _fresh_dir() -> Path:
    base = Path.cwd() / "demo-output" / f"clickstream-{time.strftime('%Y%m%d-%H%M%S')}"
    d, i = base, 1
    while d.exists():
        i += 1
        d = base.with_name(f"{base.name}-{i}")
    d.mkdir(parents=True)
    return d


def report(r: dict[str, Any]) -> None:
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True)
    ok = lambda b: "[bold green]PASS[/]" if b else "[bold red]FAIL[/]"  # noqa: E731
    con.print(f"[bold]clickstream demo[/]: {r['events']:,} clicks of {r['users']:,} users in "
              f"{r['partitions']} files, parallelism 2, checkpoints every second")
    con.print(f"  input, output and state under {r['dir']}")
    k = r["kill"]
    if k.get("happened"):
        con.print(f"worker pid {k['pid']} [bold]SIGKILLed[/] after checkpoint {k['after_checkpoint']} "
                  f"(it covered {k['covered']:.0%} of the input); the job ran {r['attempts']} attempts")
        for attempt, st in sorted(r["restores"].items()):
            if "first_record_s" in st:
                con.print(f"  attempt {attempt} restored {'on demand' if st.get('on_demand') else 'eagerly'}: "
                          f"first record {st['first_record_s']:.3f}s after deployment, every key group loaded after "
                          f"{st.get('fully_loaded_s', float('nan')):.3f}s (slowest of {st['workers']} workers)")
    else:
        con.print("[red]no worker was killed: the job ended before half of the input was checkpointed[/]")
    for o in r["outputs"]:
        con.print(f"{ok(o['passed'])} {o['name']}: {o['records']:,} committed records, {o['expected']:,} "
                  f"expected, {o['duplicates']} duplicates, {o['missing']} missing, {o['unexpected']} unexpected")
    mats = r["final_checkpoint_materialization"]
    con.print(f"{len(r['checkpoints'])} checkpoints completed; the final one ({r['final_checkpoint']}) builds on "
              + (f"the materialization of checkpoint {mats[0]}" if mats else "no materialization yet"))
    con.print("[bold]$ statelog checkpoints list[/]")
    lines = r["checkpoints_list"].rstrip("\n").splitlines()
    shown = lines if len(lines) <= 14 else [*lines[:6], "  ...", *lines[-7:]]
    con.print("\n".join(shown), markup=False, soft_wrap=True)
    s = r["spark_sql"]
    for cid, c in s["checkpoints"].items():
        con.print(f"{ok(c['passed'])} Spark SQL at checkpoint {cid}: {c['users']:,} users, {c['clicks']:,} clicks "
                  f"in state = {c['events_before_positions']:,} events before its source positions")
    con.print(f"{ok(s['movers_passed'])} who clicked most between the two checkpoints:\n  {s['movers_sql']}")
    for m in s["movers"]:
        con.print(f"    {m['user']}  {m['before']:>6,} -> {m['after']:>6,}  (+{m['clicks']:,})")
    tm = r["timing"]
    con.print(f"time: {tm['total_s']:.1f} s (job {tm['job_s']:.1f} s, Spark {tm['spark_s']:.1f} s)")
    con.print(f"{ok(r['passed'])} clickstream demo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.clickstream", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="working directory (default: a fresh demo-output/clickstream-<time>)")
    p.add_argument("--events", type=int, default=300_000, help="number of clicks (default 300000)")
    p.add_argument("--users", type=int, default=5_000, help="number of users (default 5000)")
    p.add_argument("--partitions", type=int, default=4, help="input files (default 4)")
    p.add_argument("--rate", type=float, default=30_000, help="clicks/s read by the sources (default 30000; 0: unpaced)")
    p.add_argument("--materialize-every", type=float, default=3.0, help="materializer interval in seconds (default 3)")
    p.add_argument("--seed", type=int, default=42, help="seed of the input and of the kill (default 42)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    args = p.parse_args(argv)
    if args.events < 1000 or args.users < 1 or args.partitions < 1:
        p.error("--events must be at least 1000, --users and --partitions at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
    else:
        report(r)
    return 0 if r["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
