"""What a GC run reports: objects and bytes per category deleted, kept and protected.

:func:`category` names what an object is (by :func:`statelog.layout.parse_key`);
:class:`Counts` adds objects up while GC runs, :class:`GcReport` is the result of a run
(``statelog gc --json`` prints its :meth:`~GcReport.to_json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from statelog.layout import ObjectKind, parse_key
from statelog.store.base import ObjectInfo

CATEGORIES = ("segments", "manifests", "table_files", "other")

_CATEGORY = {ObjectKind.SEGMENT: "segments", ObjectKind.MANIFEST: "manifests", ObjectKind.TABLE: "table_files"}


def category(key: str) -> str:
    """The report category of an object GC may delete, by what :func:`statelog.layout.parse_key`
    says it is: ``"other"`` for a key no statelog module writes."""
    parsed = parse_key(key)
    return "other" if parsed is None else _CATEGORY.get(parsed.kind, "other")


@dataclass(frozen=True)
class Tally:
    """Objects and bytes of one category."""

    objects: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class GcReport:
    """What one GC run found and did (or, with ``dry_run``, would do)."""

    root: str
    dry_run: bool
    now: float
    grace_s: float
    retain_checkpoints: int | None
    checkpoints_retained: tuple[int, ...]
    checkpoints_deleted: tuple[int, ...]
    savepoints: tuple[str, ...]
    deleted: dict[str, Tally]  # category -> objects and bytes deleted
    kept: dict[str, Tally]  # category -> live objects
    protected: dict[str, Tally]  # category -> not live but younger than the grace period
    deleted_keys: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def objects_deleted(self) -> int:
        return sum(t.objects for t in self.deleted.values())

    @property
    def bytes_deleted(self) -> int:
        return sum(t.bytes for t in self.deleted.values())

    def to_json(self) -> dict[str, Any]:
        def tallies(d: dict[str, Tally]) -> dict[str, Any]:
            return {c: asdict(d.get(c, Tally())) for c in CATEGORIES}

        return {
            "ok": self.ok,
            "root": self.root,
            "dry_run": self.dry_run,
            "now": self.now,
            "grace_s": self.grace_s,
            "retain_checkpoints": self.retain_checkpoints,
            "checkpoints_retained": list(self.checkpoints_retained),
            "checkpoints_deleted": list(self.checkpoints_deleted),
            "savepoints": list(self.savepoints),
            "deleted": tallies(self.deleted),
            "kept": tallies(self.kept),
            "protected": tallies(self.protected),
            "objects_deleted": self.objects_deleted,
            "bytes_deleted": self.bytes_deleted,
            "deleted_keys": list(self.deleted_keys),
            "errors": list(self.errors),
            "duration_s": round(self.duration_s, 3),
        }


class Counts:
    """Objects and bytes per category while GC runs."""

    def __init__(self) -> None:
        self.d: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}

    def add(self, obj: ObjectInfo) -> None:
        t = self.d[category(obj.key)]
        t[0] += 1
        t[1] += obj.size

    def tallies(self) -> dict[str, Tally]:
        return {c: Tally(*v) for c, v in self.d.items()}

    def objects(self, cat: str | None = None) -> int:
        return sum(v[0] for c, v in self.d.items() if cat in (None, c))
