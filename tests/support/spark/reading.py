"""Reading a job with Spark in tests: the ``statelog`` data source's reader with a built job's
options, collecting DataFrames side by side, and the reference the change feed is checked
against (the state restored by the library, and a feed applied to it)."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import statelog
from statelog.descriptors import StateKind
from statelog.keys.encoding import encode_key
from statelog.readers.options import to_spark_options
from statelog.readers.restore import restored_backend, state_entries, timer_entries
from tests.support.spark import jobs


def reader(spark: Any, b: jobs.Built, **options: Any) -> Any:
    r = spark.read.format("statelog").option("root", b.root)
    for k, v in {**to_spark_options(b.options), **options}.items():
        r = r.option(k, str(v))
    return r


def collect_all(dfs: list[Any]) -> list[list[Any]]:
    """Collect several DataFrames concurrently (Spark runs the jobs side by side)."""
    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(lambda df: df.collect(), dfs))


def state_at(job: statelog.StateJob, cid: int, name: str) -> dict[Any, Any]:
    """The state with expiry, as the library restores it: (key bytes, ns bytes) -> entry."""
    meta = job.load_checkpoint(cid)
    op = meta.operators["op"]
    out: dict[Any, Any] = {}
    for i in range(2):
        b = restored_backend(job.store, meta, op, name, i, 2)
        if name.startswith("__timers"):
            for key, _ns, nsb, ts in timer_entries(b, name):
                out[(encode_key(key), nsb, ts)] = True
            continue
        info = op.states[name]
        for key, _ns, nsb, value, exp in state_entries(b, info):
            if info.kind is StateKind.LIST:
                entry: Any = [(x, e) for x, e in zip(value, exp or [None] * len(value), strict=True)]
            elif info.kind is StateKind.MAP:
                entry = {k: (x, (exp or {}).get(k)) for k, x in value.items()}
            else:
                entry = (value, exp)
            out[(encode_key(key), nsb)] = entry
    return out


def _value(r: Any, name: str, field: str = "value") -> Any:
    d = r.asDict()
    if f"{field}_pickle" in d:
        return None if d[f"{field}_pickle"] is None else pickle.loads(d[f"{field}_pickle"])
    v = d[field]
    return v.asDict() if hasattr(v, "asDict") else v


def apply_feed(state: dict[Any, Any], rows: list[Any], name: str) -> dict[Any, Any]:
    out = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in state.items()}
    for r in sorted(rows, key=lambda r: (r["key_group"], r["replay_order"])):
        k = (bytes(r["key_bytes"]), bytes(r["namespace_bytes"]))
        op = r["op"]
        if op == "timer_add":
            out[(*k, r["timestamp"])] = True
        elif op == "timer_remove":
            out.pop((*k, r["timestamp"]), None)
        elif op == "put":
            out[k] = (_value(r, name), r["expires_ms"])
        elif op == "delete":
            out.pop(k, None)
        elif op == "list_append":
            out.setdefault(k, []).extend((x, r["expires_ms"]) for x in _value(r, name))
        elif op == "list_replace":
            out[k] = [(x, r["expires_ms"]) for x in _value(r, name)]
        elif op == "map_put":
            out.setdefault(k, {})[_value(r, name, "user_key")] = (_value(r, name), r["expires_ms"])
        elif op == "map_remove":
            m = out.get(k)
            if m is not None:
                m.pop(_value(r, name, "user_key"), None)
                if not m:
                    del out[k]
        else:
            raise AssertionError(f"unexpected op {op}")
    return out
