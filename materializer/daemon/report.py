"""The daemon's reports as plain data: a materialization's summary (also ``statelog
materializer status``) and a GC report as JSON."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from statelog.materialization.manifest import Manifest


def report_json(report: Any) -> Any:
    """A GC report as plain data (``to_json()``, a dataclass, or its attributes)."""
    if report is None:
        return None
    if hasattr(report, "to_json"):
        return report.to_json()
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        return dataclasses.asdict(report)
    if isinstance(report, dict):
        return report
    return {k: v for k, v in vars(report).items() if not k.startswith("_")}


def manifest_summary(m: Manifest, now: float | None = None) -> dict[str, Any]:
    """The JSON view of a materialization used by the daemon's summaries and ``status``."""
    now = time.time() if now is None else now
    return {
        "manifest": m.key,
        "id": m.mid,
        "checkpoint_id": m.checkpoint_id,
        "lease_generation": m.lease_generation,
        "created_ms": m.created_ms,
        "age_s": round(max(0.0, now - m.created_ms / 1000), 3),
        "rows": m.rows,
        "bytes": m.bytes,
        "files": sum(len(fs) for op in m.operators.values() for fs in op.files.values()),
        "operators": sorted(m.operators),
        "stats": dict(m.stats),
    }
