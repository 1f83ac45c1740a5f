"""``statelog checkpoints list|show``: the retained checkpoints of a root (``docs/cli.md``).

Both open the root read-only. The records are the JSON views of
:mod:`tools.cli.checkpoint_json` (``--json``); the tables here print the same records,
one row per checkpoint (``list``) or a checkpoint's fields, statistics, source positions and
operators (``show``).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import CheckpointNotFoundError
from tools.cli.checkpoint_json import checkpoint_detail, checkpoint_summary, materialization_summary
from tools.cli.output import NONE, _console, _json, _row, _short, _table, human_bytes
from tools.roots import Root, load_checkpoint_or_savepoint, load_metadata, open_root

log = logging.getLogger("tools.cli")

EXIT_OK = 0


def declare_show(show: argparse.ArgumentParser) -> None:
    """The arguments of ``checkpoints show`` (its commands are in :mod:`tools.cli.commands`)."""
    show.add_argument("checkpoint", metavar="ID", help="checkpoint id, 'latest' or 'savepoint:NAME'")


def list_checkpoints(root: Root) -> list[CheckpointMetadata]:
    """Every retained checkpoint, oldest first."""
    root.require_job()
    rows = []
    for cid in root.catalog.checkpoint_ids():
        try:
            rows.append(load_metadata(root, cid))
        except CheckpointNotFoundError:
            log.info("checkpoint %d was removed by retention while listing", cid)
    return rows


def load_checkpoint(root: Root, which: str) -> CheckpointMetadata:
    """A retained checkpoint (an id or ``latest``) or a savepoint (``savepoint:NAME``)."""
    root.require_job()
    return load_checkpoint_or_savepoint(root, which)


def cmd_list(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        checkpoints = list_checkpoints(root)
    checkpoint_list(checkpoints, root.url, as_json=args.json)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        meta = load_checkpoint(root, args.checkpoint)
    render_checkpoint(meta, root.url, as_json=args.json)
    return EXIT_OK


# -- rendering -----------------------------------------------------------------------------------


def _mat_text(items: Sequence[Mapping[str, Any]]) -> str | None:
    if not items:
        return None
    return "\n".join(
        f"{m['id']}" + (f" (checkpoint {m['checkpoint_id']})" if m["checkpoint_id"] is not None else "")
        for m in items
    )


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


def checkpoint_list(checkpoints: Sequence[CheckpointMetadata], root: str, *, as_json: bool) -> None:
    rows = [checkpoint_summary(m) for m in checkpoints]
    if as_json:
        _json(list(rows))
        return
    console = _console()
    if not rows:
        console.print(f"no retained checkpoints in {root}")
        return
    # the operators and their states are listed below the table, once per layout shared by
    # checkpoints: a column of them would be too wide for a table at 80 columns
    table = _table(
        f"Checkpoints in {root}",
        "id",
        "time (UTC)",
        "kind",
        "changelog",
        "materialized",
        "stats",
        right=("id", "changelog"),
    )
    layouts: dict[tuple[str, ...], list[int]] = {}
    for r in rows:
        ops = tuple(
            f"{op['uid']} (p={op['parallelism']}): {', '.join(op['states']) or NONE}" for op in r["operators"]
        )
        layouts.setdefault(ops, []).append(r["id"])
        _row(
            table,
            r["id"],
            r["timestamp"].replace("T", " ")[:19],
            r["kind"],
            human_bytes(r["changelog_bytes"]),
            _mat_text(r["materialization"]),
            stats_text(r["stats"]),
        )
    console.print(table)
    for ops, ids in layouts.items():
        which = f"checkpoint {ids[0]}" if len(ids) == 1 else f"checkpoints {', '.join(map(str, ids))}"
        console.print(f"operators of {which}:" if ops else f"operators of {which}: {NONE}", soft_wrap=True)
        for line in ops:
            console.print(f"  {line}", soft_wrap=True)


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
