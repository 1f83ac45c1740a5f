"""What lives under a job root (statelog/layout.py): every key is built and parsed in one place.

The first test uses a root the way a deployment does (a runtime job with unaligned
checkpoints and the background materializer, a consumer-loop job with every kind of state,
a daemon cycle, a savepoint, GC, the state-dump baseline and a benchmark dump) and checks
that every object in it is one the layout module parses, and rebuilds, exactly.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from bench.baselines.state_dump import write_state_dump
from bench.baselines.state_dump_backend import StateDumpBackend
from materializer.daemon.loop import MaterializerDaemon
from materializer.gc.collect import collect_garbage
from materializer.gc.report import category
from materializer.savepoint import create_savepoint
from runtime import StreamExecutionEnvironment
from statelog import layout
from statelog.errors import ConfigError
from statelog.keys.groups import KeyGroupRange
from statelog.layout import ObjectKey, ObjectKind, parse_key
from tests.support import jobs
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec


def rebuilt(p: ObjectKey) -> str:
    """The key the layout module builds from what it parsed out of ``p.key``."""
    k = p.kind
    if k is ObjectKind.JOB:
        return layout.JOB_KEY
    if k is ObjectKind.CHECKPOINT:
        assert p.checkpoint_id is not None
        return layout.checkpoint_key(p.checkpoint_id)
    if k is ObjectKind.SEGMENT:
        assert p.writer_id is not None and p.segment is not None
        return layout.segment_key(p.writer_id, p.segment)
    if k is ObjectKind.MANIFEST:
        assert p.materialization_id is not None
        return layout.manifest_key(p.materialization_id)
    if k is ObjectKind.TABLE:
        assert p.materialization_id is not None
        return layout.table_dir(p.materialization_id) + str(p.file)
    if k is ObjectKind.SAVEPOINT_METADATA:
        return layout.savepoint_metadata_key(str(p.savepoint))
    if k is ObjectKind.SAVEPOINT_MANIFEST:
        return layout.savepoint_manifest_key(str(p.savepoint))
    if k is ObjectKind.SAVEPOINT_TABLE:
        assert p.materialization_id is not None
        return layout.table_dir(p.materialization_id, layout.savepoint_data_prefix(str(p.savepoint))) + str(p.file)
    if k is ObjectKind.HISTORY:
        assert p.segment_no is not None and p.entries is not None
        return layout.history_segment_key(p.segment_no, p.entries)
    if k is ObjectKind.MATERIALIZER_STATUS:  # named by a hash of the daemon's owner name
        return f"{layout.MATERIALIZER_STATUS_PREFIX}{p.file}.json"
    if k is ObjectKind.FOLLOWER_LEASE:
        assert p.file is not None and p.segment is not None
        return layout.follower_lease_key(p.file, p.segment)
    if k is ObjectKind.LEASE:
        assert p.lease is not None and p.generation is not None
        if p.lease_object == "acquire":
            return layout.lease_generation_key(p.lease, p.generation)
        if p.lease_object == "renew":
            assert p.renewal is not None
            return layout.lease_renewal_key(p.lease, p.generation, p.renewal)
        return layout.lease_released_key(p.lease, p.generation)
    if k is ObjectKind.INFLIGHT:
        assert p.checkpoint_id is not None and p.task is not None
        return layout.inflight_key(p.checkpoint_id, p.task)
    assert k is ObjectKind.STATE_DUMP
    if p.operator_uid is None:
        return layout.bench_state_dump_key(p.key[len(layout.STATE_DUMP_PREFIX):].removesuffix(".snapshot"))
    assert p.subtask is not None and p.checkpoint_id is not None
    return layout.state_dump_key(p.operator_uid, p.subtask, p.checkpoint_id)


def keys_of(root: RootSpec) -> set[str]:
    with statelog.open(root.url) as job:
        return {o.key for o in job.store.list()}


def test_every_key_under_a_used_root_parses_and_rebuilds(file_root: RootSpec, tmp_path: Path) -> None:
    # the state-dump baseline of the runtime (it publishes no checkpoint)
    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=0.2, state_root=file_root.url,
                                     state_backend=StateDumpBackend())
    jobs.build_deliveries(env, tmp_path / "out", 500, rate=5000)
    env.execute("baseline", timeout_s=120)
    # a runtime job: unaligned checkpoints whose barriers overtake records (in-flight data),
    # the background materializer, the writer and materializer leases
    env = make_env(file_root, mode="exactly_once_unaligned", checkpoint_interval_s=0.1, retain_checkpoints=50,
                   materializer={"interval_s": 1.0})
    jobs.build_join(env, tmp_path / "join", 1200, order_rate=3000, slow_payments=True)
    result = env.execute("layout", timeout_s=120)
    assert any(s.get("inflight_bytes", 0) > 0 for s in result.checkpoint_stats.values())
    # a consumer loop with every kind of state and timers, checkpointed
    with statelog.open(file_root.url) as job:
        b = job.backend("loop")
        value = b.get_state(statelog.ValueStateDescriptor("count", pa.int64()))
        items = b.get_state(statelog.ListStateDescriptor("seen.by-user", pa.string()))
        attrs = b.get_state(statelog.MapStateDescriptor("attrs", pa.int64(), key_type=pa.string()))
        for k in range(50):
            b.set_current_key(k)
            value.update(k)
            items.add(f"i{k}")
            attrs.put("a", k)
            b.timers.register_event_time_timer(1000 + k)
        loop_cid = job.checkpoint(sources={"loop": 50}).checkpoint_id
        write_state_dump(b, job.store, layout.bench_state_dump_key("0"))
    # a daemon cycle, a savepoint, GC of everything no retained checkpoint needs
    with statelog.open(file_root.url) as job:
        daemon = MaterializerDaemon(job.store, owner="layout-test", run_gc=False)
        assert daemon.run_once(force=True)["action"] == "materialized"
        daemon.stop()
        create_savepoint(job.store, loop_cid, "before-gc")
        report = collect_garbage(job.store, retain_checkpoints=2, grace_s=0.0)
        assert report.ok and report.checkpoints_deleted

    follower = statelog.follow(file_root.url, poll_s=None)  # its lease, below followers/
    keys = keys_of(file_root)
    follower.close()
    unknown = sorted(k for k in keys if parse_key(k) is None)
    assert not unknown, f"objects the layout module does not know: {unknown}"
    parsed = {k: parse_key(k) for k in keys}
    assert {k: rebuilt(p) for k, p in parsed.items() if p is not None} == {k: k for k in keys}
    assert {p.kind for p in parsed.values() if p is not None} == set(ObjectKind)
    assert {p.lease for p in parsed.values() if p is not None and p.kind is ObjectKind.LEASE} == {
        layout.MATERIALIZER_LEASE_PREFIX, layout.WRITER_LEASE_PREFIX}


def test_builders_and_parsers_are_inverse() -> None:
    assert layout.parse_checkpoint_key(layout.checkpoint_key(42)) == 42
    assert layout.checkpoint_key(42) == "checkpoints/chk-000000000042.json"
    wid = layout.new_writer_id()
    assert layout.parse_segment_key(layout.segment_key(wid, 7)) == (wid, 7)
    assert layout.segment_key(wid, 7) == f"changelog/{wid}/0000000007.seg"
    mid = layout.new_materialization_id(12, 3)
    assert layout.parse_manifest_key(layout.manifest_key(mid)) == (mid, 12, 3)
    f = layout.table_file_key(layout.table_dir(mid), 2, "my state/1", KeyGroupRange(5, 9))
    assert f.startswith(f"materializations/data/{mid}/002-my_state_1-") and f.endswith("-kg00005-00009.parquet")
    assert layout.parse_table_key(f) == (None, mid, f.rsplit("/", 1)[1])
    sp = layout.table_file_key(layout.table_dir(mid, layout.savepoint_data_prefix("nightly")), 0, "s", KeyGroupRange(0, 0))
    assert layout.parse_table_key(sp) == ("nightly", mid, sp.rsplit("/", 1)[1])
    assert layout.parse_savepoint_metadata_key(layout.savepoint_metadata_key("nightly")) == "nightly"
    assert layout.parse_savepoint_manifest_key(layout.savepoint_manifest_key("nightly")) == "nightly"
    assert layout.parse_savepoint_manifest_key(layout.savepoint_metadata_key("nightly")) is None
    assert layout.parse_inflight_key(layout.inflight_key(3, "4.1")) == (3, "4.1")
    assert layout.parse_follower_lease_key(layout.follower_lease_key("f-0123456789abcdef", 7)) == ("f-0123456789abcdef", 7)
    assert layout.parse_state_dump_key(layout.state_dump_key("a/b", 1, 9)) == ("a/b", 1, 9)
    for what, key in (("acquire", layout.lease_generation_key("x/", 2)), ("renew", layout.lease_renewal_key("x/", 2, 5)),
                      ("released", layout.lease_released_key("x/", 2))):
        assert layout.parse_lease_name(key[2:]) == (what, 2, 5 if what == "renew" else None)
    with pytest.raises(ConfigError, match="invalid savepoint name"):
        layout.check_savepoint_name("../x")


@pytest.mark.parametrize(
    "key",
    ["job.json.bak", "checkpoints/chk-42.json", "changelog/w/0000000000.seg", "materializations/manifests/x.json",
     "materializations/data/m-000000000001-000000-0000000a/x.parquet", "savepoints/a/other.json",
     "materializer/lease/gen-1.json", "writer/lease/gen-000000000001.renew-1.json",
     "runtime/inflight/chk-1/x.bin", "full-snapshots/a/b.snapshot", "elsewhere/x"],
)
def test_keys_no_module_writes_are_unknown(key: str) -> None:
    assert parse_key(key) is None


def test_gc_classifies_keys_through_the_layout() -> None:
    mid = layout.new_materialization_id(1, 1)
    assert category(layout.segment_key(layout.new_writer_id(), 0)) == "segments"
    assert category(layout.manifest_key(mid)) == "manifests"
    assert category(layout.table_file_key(layout.table_dir(mid), 0, "s", KeyGroupRange(0, 1))) == "table_files"
    assert category("materializations/stray") == "other"


_KEY_HEADS = ("job.json", "checkpoints/", "changelog/", "materializations/", "savepoints/", "materializer/lease",
              "writer/lease", "runtime/inflight", "full-snapshots/")
_KEY_TAILS = (".seg", ".parquet", ".snapshot", ".bin", ".released", "/_metadata.json", "/manifest.json")


def spelled_keys(root: Path) -> list[str]:
    """String literals and f-strings (not docstrings) outside statelog/layout.py that spell an
    object key, a key prefix or a regex over keys."""
    found = []
    for pkg in ("statelog", "materializer", "runtime", "tools", "bench", "examples"):
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "statelog/layout.py":
                continue
            tree = ast.parse(path.read_text())
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for n in ast.walk(tree):
                if isinstance(n, ast.JoinedStr):
                    consts = [v.value for v in n.values if isinstance(v, ast.Constant)]
                    head = consts[0] if consts and n.values[0] is not None and isinstance(n.values[0], ast.Constant) else ""
                    tail = consts[-1] if consts and isinstance(n.values[-1], ast.Constant) else ""
                    if str(head).startswith(_KEY_HEADS + ("chk-", "gen-", "m-")) or (
                            str(tail).endswith(_KEY_TAILS) and "/" in "".join(map(str, consts))):
                        found.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
                elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                    v = n.value.lstrip("^")
                    if v.startswith(_KEY_HEADS) or (v.endswith(_KEY_TAILS) and "/" in v):
                        found.append(f"{rel}:{n.lineno}: {n.value!r}")
    return found


def test_no_module_but_layout_spells_an_object_key() -> None:
    assert spelled_keys(Path(__file__).resolve().parents[2]) == []


def test_the_format_doc_lists_every_key_pattern_with_the_layout_functions() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    section = text[text.index("## 1. Job root layout"):text.index("## 2. ")]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    names = {n for r in rows for cell in r.split("|")[3:5] for n in re.findall(r"`([A-Za-z_]+)", cell)}
    assert names and all(hasattr(layout, n) for n in names), sorted(n for n in names if not hasattr(layout, n))
    # one row per key pattern: every parser of the module is named
    assert len(rows) == 17
    assert {n for n in layout.__all__ if n.startswith("parse_")} <= names
