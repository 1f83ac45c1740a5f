"""States and timers reach the current key through the backend's key context only."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.errors import KeyGroupError, StatelogError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes
from statelog.state.context import NO_KEY, NO_KEY_INFO, KeyContext

STATE_PACKAGE = Path(statelog.__file__).parent / "state"


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, wherever the import is (top level, function,
    ``if TYPE_CHECKING``), relative imports resolved."""
    package = "statelog.state"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def test_no_state_module_imports_the_backend():
    files = sorted(STATE_PACKAGE.glob("*.py"))
    assert {f.name for f in files} >= {"context.py", "kinds.py", "timers.py"}
    offenders = {
        f.name: sorted(m for m in _imported_modules(f) if m == "statelog.state.backend" or m.startswith("statelog.state.backend."))
        for f in files if f.name != "backend.py"
    }
    assert {n: m for n, m in offenders.items() if m} == {}


def test_states_and_timers_hold_the_key_context_not_the_backend(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    ctx = b.key_context
    assert type(ctx) is KeyContext
    states = [
        b.get_state(ValueStateDescriptor("v", pa.int64())),
        b.get_state(ListStateDescriptor("l", pa.int64())),
        b.get_state(MapStateDescriptor("m", pa.int64(), key_type=pa.string())),
    ]
    for holder in [*states, b.timers]:
        held = [v for v in vars(holder).values() if v is b]
        assert held == [], f"{type(holder).__name__} holds the backend"
        assert holder._ctx is ctx
    # the backend keeps no copy of the current key besides the context
    assert not any(hasattr(b, name) for name in ("_key", "_kinfo"))
    job.close()


def test_set_current_key_writes_the_context(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op", subtask=0, parallelism=2)
    ctx = b.key_context
    assert ctx.key is NO_KEY and ctx.key_info == NO_KEY_INFO and ctx.current_key is None
    assert b.current_key is None and b.current_key_group == -1
    with pytest.raises(StatelogError, match="no current key"):
        b.get_state(ValueStateDescriptor("v", pa.int64())).update(1)
    mine = [k for k in [*range(100), *map(str, range(100))] if key_group_of_bytes(encode_key(k), 128) < 64]
    other = next(k for k in range(100) if key_group_of_bytes(encode_key(k), 128) >= 64)
    for key in (mine[0], mine[0], mine[-1], mine[0]):  # cache misses and hits
        b.set_current_key(key)
        kb = encode_key(key)
        assert ctx.key == key
        assert ctx.key_info == (type(key), kb, key_group_of_bytes(kb, 128))
        assert b.current_key == key == ctx.current_key
        assert b.current_key_group == ctx.key_group == key_group_of_bytes(kb, 128)
    with pytest.raises(KeyGroupError):
        b.set_current_key(other)
    assert ctx.key == mine[0]  # a refused key leaves the context alone
    # the timer service sets the key of a firing timer through the context's setter
    assert ctx.set_current_key == b.set_current_key
    b.timers.register_event_time_timer(10)
    b.set_current_key(mine[-1])
    fired = list(b.timers.advance_watermark(10))
    assert [t.key for t in fired] == [mine[0]]
    assert ctx.key == mine[0] and ctx.key_info[1] == encode_key(mine[0])
    job.close()


def test_context_carries_clock_changelog_and_operator(tmp_path):
    now = [1_000]
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op", clock=lambda: now[0])
    assert b.key_context.clock() == 1_000 == b.clock()
    assert b.key_context.changelog_enabled is True is b.changelog_enabled
    assert b.key_context.operator_uid == "op"
    heap = job.backend("heap", changelog=False)
    assert heap.key_context.changelog_enabled is False is heap.changelog_enabled
    err = b.key_context.legacy_key_error("s", encode_key(1))
    assert "'op'" in str(err) and "'s'" in str(err)
    job.close()
