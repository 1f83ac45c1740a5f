"""Bootstrap on the standalone cluster into an ``s3://`` root (S3 settings in the driver's ``AWS_*``
only): value, list, map and aggregating states from DataFrames; ``statelog verify`` passes; a
runtime job restores the savepoint at parallelism 3 and continues with a stream that updates
every state kind, and its final checkpoint holds exactly the model's entries (the input
tables plus the stream). ``STATELOG_BOOTSTRAP_KEYS`` sets the number of keys (default 3000;
the acceptance run uses 10**7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from runtime import FileSink, GeneratorSource, KeyedProcessFunction
from statelog import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from statelog.readers.restore import FAR_PAST_MS, descriptor_of
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec, S3Server
from tests.support.spark import bootstrap_driver, cluster
from tests.support.state_kinds import AVG_TYPE, Avg
from tools.roots import open_root
from tools.verify import verify_root

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.xdist_group("cluster")]

REPO = Path(__file__).resolve().parents[3]
KEYS = int(os.environ.get("STATELOG_BOOTSTRAP_KEYS", "3000"))
SPLITS, PER_SPLIT = 3, 2000  # the stream after the restore
IN_PROCESS_CHECK_KEYS = 100_000  # above: the final state is compared on the cluster


def stream_event(split: int, i: int) -> list[int]:
    """Event ``i`` of split ``split``: ``[k, d]``; a key's events all come from one split (k % 3),
    so each key sees them in order."""
    return [(i * 7919) % (KEYS // SPLITS) * SPLITS + split, i % 11]


def event_key(e: list[int]) -> str:
    return f"u{e[0]}"


class Continue(KeyedProcessFunction):
    """Updates the bootstrapped states of operator ``counter``: every state kind."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", pa.int64()))
        self.seen = ctx.get_state(ListStateDescriptor("seen", pa.string()))
        self.attrs = ctx.get_state(MapStateDescriptor("attrs", pa.int64(), key_type=pa.string()))
        self.avg = ctx.get_state(AggregatingStateDescriptor("avg", AVG_TYPE, aggregate=Avg()))

    def process_element(self, e: list[int], ctx: Any) -> None:
        k, d = e
        self.count.update((self.count.value() or 0) + d)
        self.seen.add(f"s{d}")
        self.attrs.put("c", (self.attrs.get("c") or 0) + 1)
        self.avg.add(d)


def stream_deltas() -> dict[int, list[int]]:
    """Per key, the deltas the stream brings, in order."""
    out: dict[int, list[int]] = {}
    for split in range(SPLITS):
        for i in range(PER_SPLIT):
            k, d = stream_event(split, i)
            out.setdefault(k, []).append(d)
    return out


def expected(state: str, k: int, deltas: list[int]) -> Any:
    """The model: state ``state`` of key ``u<k>`` after the bootstrap tables and then the stream
    (``None``: no entry)."""
    v = bootstrap_driver.value_of(k).get(state)
    for d in deltas:
        if state == "count":
            v += d
        elif state == "seen":
            v = [*(v or []), f"s{d}"]
        elif state == "attrs":
            v = {**(v or {}), "c": (v or {}).get("c", 0) + 1}
        else:
            v = {"sum": v["sum"] + d, "count": v["count"] + 1}
    return v


@pytest.mark.timeout(max(600, KEYS // 2500))
def test_bootstrap_on_the_cluster_into_s3(s3_server: S3Server, standalone_cluster: cluster.SparkCluster,
                                          tmp_path: Path) -> None:
    root = f"s3://{s3_server.bucket}/bootstrap-{uuid.uuid4().hex}"
    args, out = tmp_path / "args.json", tmp_path / "out.json"
    args.write_text(json.dumps({"master": standalone_cluster.master_url, "root": root, "keys": KEYS, "out": str(out)}))
    run = subprocess.run([sys.executable, "-m", "tests.support.spark.bootstrap_driver", str(args)], cwd=REPO,
                         env=cluster.driver_env(s3_server), capture_output=True, timeout=1800)
    assert run.returncode == 0 and out.exists(), run.stderr.decode(errors="replace")[-5000:]
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    assert result["rows"] == 2 * KEYS + 2 * len(range(0, KEYS, 3))
    with open_root(root, s3_server.options()) as r:
        report = verify_root(r)
    assert report.ok and report.savepoints == ["boot"], report.faults
    # the job continues from the savepoint at parallelism 3 with a stream over every state kind
    # (at 10**7 keys a subtask's first checkpoint waits for its restore to start: tens of seconds)
    env = make_env(RootSpec(root, s3_server.options()), parallelism=3, store_options=s3_server.options(),
                   checkpoint_timeout_s=max(30.0, KEYS / 50_000))
    (env.from_source(GeneratorSource(stream_event, PER_SPLIT, splits=SPLITS), uid="events")
        .key_by(event_key).process(Continue(), uid=bootstrap_driver.OPERATOR)
        .sink_to(FileSink(tmp_path / "out"), uid="out"))
    done = env.execute("continued", restore="savepoint:boot", timeout_s=max(600, KEYS // 5000))
    final = done.completed_checkpoints[-1]
    if KEYS <= IN_PROCESS_CHECK_KEYS:
        _check_in_process(root, s3_server, final)
    else:
        _check_on_the_cluster(root, s3_server, standalone_cluster, final, tmp_path)


def _check_in_process(root: str, s3_server: S3Server, final: int) -> None:
    """Every entry of every state at ``final`` equals the model's (restored at parallelism 3)."""
    infos, deltas = bootstrap_driver.infos(), stream_deltas()
    with statelog.open(root, store_options=s3_server.options(), create=False) as job:
        for s, info in infos.items():
            got: dict[str, Any] = {}
            for i in range(3):
                b = job.backend(bootstrap_driver.OPERATOR, subtask=i, parallelism=3, restore=final,
                                changelog=False, clock=lambda: FAR_PAST_MS)
                b.get_state(descriptor_of(info))
                got.update({k: v for k, _ns, v in b.entries(s)})
                b.close()
            want = {f"u{k}": v for k in range(KEYS) if (v := expected(s, k, deltas.get(k, []))) is not None}
            assert got == want, s


def _check_on_the_cluster(root: str, s3_server: S3Server, spark: cluster.SparkCluster, final: int,
                          tmp_path: Path) -> None:
    """The same on the cluster (a full outer join per state): at 10**7 keys the entries do not fit
    in this process as Python objects."""
    args, check = tmp_path / "check-args.json", tmp_path / "check.json"
    deltas = stream_deltas()
    args.write_text(json.dumps({"master": spark.master_url, "root": root, "keys": KEYS, "out": str(check),
                                "check": final, "deltas": {str(k): ds for k, ds in deltas.items()}}))
    run = subprocess.run([sys.executable, "-m", "tests.support.spark.bootstrap_driver", str(args)], cwd=REPO,
                         env=cluster.driver_env(s3_server), capture_output=True, timeout=KEYS // 2500 + 600)
    assert run.returncode == 0 and check.exists(), run.stderr.decode(errors="replace")[-5000:]
    result = json.loads(check.read_text())
    assert "error" not in result, result["error"]
    lists = len(set(range(0, KEYS, 3)) | set(deltas))
    assert result["rows"] == {"count": KEYS, "avg": KEYS, "seen": lists, "attrs": lists}, result["rows"]
    assert result["mismatches"] == {s: 0 for s in result["rows"]}, result["examples"]
