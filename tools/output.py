"""How the CLI's results look: JSON views of the library's objects, ``rich`` tables, errors.

The views (``checkpoint_summary``, ``checkpoint_detail``) turn checkpoint metadata into the
plain dicts that ``--json`` prints; the renderers print those dicts as JSON or as tables to
stdout (errors go to stderr). Values that come from the store (uids, keys, messages) are
rendered as plain text, never as ``rich`` markup.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata, OperatorState
from statelog.descriptors import StateInfo
from statelog.layout import (
    checkpoint_key,
    parse_manifest_key,
    parse_savepoint_manifest_key,
    savepoint_metadata_key,
)
from statelog.types import PICKLE, ValueType
from tools.widths import FitConsole, FitTable

NONE = "-"
INTERNAL_PREFIX = "__"  # internal states (timers) are not listed among the user states

# -- JSON views ----------------------------------------------------------------------------------


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def type_name(value_type: ValueType | None) -> str | None:
    if value_type is None:
        return None
    return "pickle" if value_type is PICKLE else str(value_type)


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


def state_json(info: StateInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "kind": info.kind.value,
        "value_type": type_name(info.value_type),
        "user_key_type": type_name(info.user_key_type),
        "ttl_ms": None if info.ttl is None else info.ttl.ttl_ms,
    }


def checkpoint_summary(meta: CheckpointMetadata) -> dict[str, Any]:
    """The ``checkpoints list`` record of one checkpoint."""
    return {
        "id": meta.checkpoint_id,
        "kind": meta.kind,
        "timestamp": iso_utc(meta.timestamp_ms),
        "timestamp_ms": meta.timestamp_ms,
        "job_id": meta.job_id,
        "max_parallelism": meta.max_parallelism,
        "sources": meta.sources,
        "operators": [
            {
                "uid": op.uid,
                "parallelism": op.parallelism,
                "states": sorted(n for n in op.states if not is_internal(n)),
            }
            for _, op in sorted(meta.operators.items())
        ],
        "changelog_bytes": meta.changelog_bytes,
        "segments": len(meta.segment_names()),
        "materialization": materialization_summary(meta.manifest_keys()),
        "stats": meta.stats,
    }


def materialization_summary(keys: set[str]) -> list[dict[str, Any]]:
    """The materializations a checkpoint builds on: manifest key, id and checkpoint id."""
    out = []
    for key in sorted(keys):
        parsed = parse_manifest_key(key)
        if parsed is not None:
            out.append({"manifest": key, "id": parsed[0], "checkpoint_id": parsed[1]})
        elif (name := parse_savepoint_manifest_key(key)) is not None:
            out.append({"manifest": key, "id": f"savepoint {name}", "checkpoint_id": None})
        else:
            out.append({"manifest": key, "id": key, "checkpoint_id": None})
    return out


def _mat_text(items: Sequence[Mapping[str, Any]]) -> str | None:
    if not items:
        return None
    return "\n".join(
        f"{m['id']}" + (f" (checkpoint {m['checkpoint_id']})" if m["checkpoint_id"] is not None else "")
        for m in items
    )


def _range_json(r: ChangelogRange) -> dict[str, Any]:
    return {
        "stream": r.stream,
        "start": r.start,
        "end": r.end,
        "key_groups": r.key_groups.to_json(),
        "bytes": r.bytes,
        "segments": [asdict(s) for s in r.segments],
    }


def _operator_detail(op: OperatorState) -> dict[str, Any]:
    states = sorted(op.states.values(), key=lambda s: s.name)
    return {
        "uid": op.uid,
        "parallelism": op.parallelism,
        "changelog_bytes": op.changelog_bytes,
        "states": [state_json(s) for s in states if not is_internal(s.name)],
        "internal_states": [s.name for s in states if is_internal(s.name)],
        "subtasks": [
            {
                "subtask": h.subtask,
                "key_groups": h.key_groups.to_json(),
                "materialization": [
                    {"manifest": p.manifest, "key_groups": p.key_groups.to_json()} for p in h.materialization
                ],
                "changelog_ranges": len(h.changelog),
                "segments": len(h.segment_names()),
                "changelog_bytes": h.changelog_bytes,
                "ranges": [_range_json(r) for r in h.changelog],
            }
            for h in op.subtasks
        ],
    }


def checkpoint_detail(meta: CheckpointMetadata) -> dict[str, Any]:
    """Everything ``checkpoints show`` prints about one checkpoint."""
    sizes = {
        s.name: s.size
        for op in meta.operators.values()
        for h in op.subtasks
        for r in h.changelog
        for s in r.segments
    }
    out = checkpoint_summary(meta)
    out["metadata_key"] = (
        savepoint_metadata_key(meta.savepoint) if meta.kind == "savepoint" and meta.savepoint
        else checkpoint_key(meta.checkpoint_id)
    )
    out["segment_bytes"] = sum(sizes.values())
    out["operators"] = [_operator_detail(op) for _, op in sorted(meta.operators.items())]
    return out


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``; plain bytes below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _ms(value: Any) -> str:
    v = float(value)
    return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def _rate(value: Any) -> str:
    v = float(value)
    if v >= 1_000_000:
        return f"{v / 1_000_000:.1f}M ev/s"
    if v >= 1_000:
        return f"{v / 1_000:.0f}k ev/s" if v >= 10_000 else f"{v / 1_000:.1f}k ev/s"
    return f"{v:.0f} ev/s"


# (stats key, label in ``checkpoints show``, compact prefix in ``checkpoints list``, formatter)
_STATS: tuple[tuple[str, str, str, Any], ...] = (
    ("duration_ms", "duration", "total", _ms),
    ("sync_ms", "synchronous part", "sync", _ms),
    ("async_ms", "asynchronous part", "async", _ms),
    ("alignment_ms", "alignment", "align", _ms),
    ("incremental_bytes", "bytes uploaded", "", lambda v: human_bytes(int(v))),
    ("inflight_bytes", "in-flight data", "in-flight", lambda v: human_bytes(int(v))),
    ("records_per_s", "throughput", "", _rate),
    ("source_records", "source records", None, lambda v: f"{int(v):,}"),
    ("mode", "mode", None, str),
    ("attempt", "attempt", None, str),
    ("final", "final", None, lambda v: "yes" if v else "no"),
)


def stats_items(stats: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """``checkpoints show``: (label, formatted value) for every statistic; unknown keys last."""
    if not stats:
        return []
    out, known = [], set()
    for key, label, _, fmt in _STATS:
        known.add(key)
        if key in stats and stats[key] is not None:
            try:
                out.append((label, fmt(stats[key])))
            except (TypeError, ValueError):
                out.append((label, _short(stats[key])))
    out.extend((k, _short(v)) for k, v in sorted(stats.items()) if k not in known)
    return out


def stats_text(stats: Mapping[str, Any] | None) -> str | None:
    """``checkpoints list``: ``"sync 1.2 ms, async 8.0 ms, align 0.3 ms, 12.0 KiB, 40k ev/s"``."""
    if not stats:
        return None
    parts = []
    for key, _, prefix, fmt in _STATS:
        if prefix is None or key == "duration_ms" or stats.get(key) is None:
            continue
        if key == "inflight_bytes" and not stats[key]:
            continue  # only unaligned checkpoints that stored overtaken records have any
        try:
            text = fmt(stats[key])
        except (TypeError, ValueError):
            continue
        parts.append(f"{prefix} {text}" if prefix else text)
    return ", ".join(parts) or None


def _console() -> Console:
    """Standard output; its ``soft_wrap=True`` lines wrap at words on a terminal (:mod:`tools.widths`)."""
    return FitConsole(file=sys.stdout, highlight=False, markup=False)


def _json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _table(title: str | None, *columns: str, right: Sequence[str] = ()) -> Table:
    """A table that fits any width without cutting a value (:class:`tools.widths.FitTable`)."""
    table = FitTable(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        table.add_column(c, justify="right" if c in right else "left", overflow="fold")
    return table


def _row(table: Table, *cells: Any) -> None:
    table.add_row(*(Text(NONE if c is None else str(c)) for c in cells))


@contextlib.contextmanager
def log_to_stderr(verbosity: int) -> Iterator[None]:
    """Send the log records of statelog, the materializer, the runtime and the tools to stderr.

    The warning per retry of a store call (``statelog.store.retry``) only with ``-v``: without
    it, a store that cannot be reached is the one error line after the last attempt."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(n) for n in ("statelog", "tools", "materializer", "runtime", "statelog.store.retry")]
    saved = [lg.level for lg in loggers]
    logging.getLogger().addHandler(handler)
    for lg in loggers:
        lg.setLevel(level)
    if verbosity <= 0:
        logging.getLogger("statelog.store.retry").setLevel(logging.ERROR)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        for lg, lvl in zip(loggers, saved, strict=True):
            lg.setLevel(lvl)


def error(message: str) -> None:
    """One line on stderr, no traceback."""
    sys.stderr.write(f"statelog: error: {message}\n")
    sys.stderr.flush()


# -- checkpoints list / show ---------------------------------------------------------------------


def checkpoint_list(checkpoints: Sequence[CheckpointMetadata], root: str, *, as_json: bool) -> None:
    rows = [checkpoint_summary(m) for m in checkpoints]
    if as_json:
        _json(list(rows))
        return
    console = _console()
    if not rows:
        console.print(f"no retained checkpoints in {root}")
        return
    table = _table(
        f"Checkpoints in {root}",
        "id",
        "time (UTC)",
        "kind",
        "operators",
        "changelog",
        "materialization",
        "stats",
        right=("id", "changelog"),
    )
    for r in rows:
        ops = "\n".join(
            f"{op['uid']} (p={op['parallelism']}): {', '.join(op['states']) or NONE}"
            for op in r["operators"]
        )
        _row(
            table,
            r["id"],
            r["timestamp"].replace("T", " ")[:19],
            r["kind"],
            ops or NONE,
            human_bytes(r["changelog_bytes"]),
            _mat_text(r["materialization"]),
            stats_text(r["stats"]),
        )
    console.print(table)


def render_checkpoint(meta: CheckpointMetadata, root: str, *, as_json: bool) -> None:
    d = checkpoint_detail(meta)
    if as_json:
        _json(dict(d))
        return
    console = _console()
    title = f"Savepoint {meta.savepoint} (of checkpoint {d['id']})" if meta.kind == "savepoint" and meta.savepoint \
        else f"Checkpoint {d['id']}"
    head = _table(f"{title} in {root}", "field", "value")
    for name, value in (
        ("kind", d["kind"]),
        ("time (UTC)", d["timestamp"]),
        ("job id", d["job_id"]),
        ("max parallelism", d["max_parallelism"]),
        ("materialization", _mat_text(d["materialization"])),
        (
            "changelog",
            f"{human_bytes(d['changelog_bytes'])} in {d['segments']} segment(s) "
            f"of {human_bytes(d['segment_bytes'])}",
        ),
        ("metadata object", d["metadata_key"]),
    ):
        _row(head, name, value)
    console.print(head)
    console.print()
    if d["stats"]:
        stats = _table("Checkpoint statistics", "statistic", "value")
        for name, value in stats_items(d["stats"]):
            _row(stats, name, value)
        console.print(stats)
    else:
        console.print(Text("no checkpoint statistics"))
    sources = _table("Source positions", "source", "position")
    for name, pos in sorted(d["sources"].items()):
        _row(sources, name, _short(pos))
    console.print()
    console.print(sources if d["sources"] else Text("no source positions"))
    for op in d["operators"]:
        console.print()
        states = _table(
            f"Operator {op['uid']} (parallelism {op['parallelism']}): states",
            "state",
            "kind",
            "value type",
            "user key type",
            "ttl (ms)",
        )
        for s in op["states"]:
            _row(states, s["name"], s["kind"], s["value_type"], s["user_key_type"], s["ttl_ms"])
        console.print(states if op["states"] else Text(f"operator {op['uid']}: no user states"))
        subtasks = _table(
            None,
            "subtask",
            "key groups",
            "ranges",
            "segments",
            "changelog",
            "materialization",
            right=("subtask", "ranges", "segments", "changelog"),
        )
        for h in op["subtasks"]:
            start, end = h["key_groups"]
            _row(
                subtasks,
                h["subtask"],
                f"{start}..{end}",
                h["changelog_ranges"],
                h["segments"],
                human_bytes(h["changelog_bytes"]),
                "\n".join(
                    f"{materialization_summary({p['manifest']})[0]['id']} {p['key_groups'][0]}..{p['key_groups'][1]}"
                    for p in h["materialization"]
                ) or None,
            )
        console.print(subtasks)


# -- verify --------------------------------------------------------------------------------------


def verify_report(report: Mapping[str, Any], *, as_json: bool) -> None:
    if as_json:
        _json(dict(report))
        return
    console = _console()
    summary = (
        f"{report['root']}: {report['checkpoints_checked']} checkpoint(s), "
        f"{len(report.get('savepoints', ()))} savepoint(s), "
        f"{report['segments_checked']} segment(s), "
        f"{report['ranges_checked']} changelog range(s) with {report['records_checked']} record(s), "
        f"{report.get('manifests_checked', 0)} materialization(s) with "
        f"{report.get('table_files_checked', 0)} table file(s); "
        f"{human_bytes(report['bytes_checked'])} checked"
    )
    console.print(summary, soft_wrap=True)
    if report["ok"]:
        console.print("OK: no faults found", soft_wrap=True)
        return
    faults = report["faults"]
    console.print(f"FAILED: {len(faults)} fault(s)", soft_wrap=True)
    for f in faults:
        refs = ", ".join(map(str, f["checkpoints"]))
        where = f" (checkpoints {refs})" if refs else ""
        console.print(f"FAULT {f['object']}{where}: {f['error']}: {f['message']}", soft_wrap=True)
