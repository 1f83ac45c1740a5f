"""What ``statelog sql`` and ``statelog inspect`` do whatever the engine (DuckDB or Spark).

* The views of a checkpoint and their names (:func:`view_names`, :func:`change_view_names`,
  :class:`ViewPlan`): one per operator state, one change feed per state with
  ``--changes-from``, one per metadata table.
* What a query may be: one read-only statement (:func:`check_read_only`), and which views
  it uses (:func:`referenced`: only those are built).
* One error line for an unknown view (:func:`unknown_view`), the same for both engines.
* The ``inspect`` report (:func:`inspect_report`; the engine counts the rows).

The engines are :mod:`tools.sql.duckdb` (in-process, the default) and :mod:`tools.sql.spark`;
both read the state through the ``statelog`` data source's own readers
(:mod:`statelog.spark`), so a view has the same rows and columns on both. The command line
(:mod:`tools.cli.spark`) prints their results.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statelog.changelog.format import TIMER_STATES
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError
from statelog.job import StateJob

METADATA_VIEW_PREFIX = "statelog_"
# the kind ``inspect`` gives each timer pseudo-state
TIMER_KINDS = {TIMER_STATES[0]: "event-time timers", TIMER_STATES[1]: "processing-time timers"}
CHANGES_SUFFIX = "__changes"


# -- view names ----------------------------------------------------------------------------------


def view_names(meta: Any) -> dict[str, tuple[str, str]]:
    """View name -> (operator uid, state) for every state of the checkpoint.

    ``<operator>__<state>`` with every character outside ``[A-Za-z0-9_]`` replaced by ``_``;
    the timer pseudo-states ``__timers_event`` / ``__timers_processing`` become
    ``<operator>__timers_event`` / ``<operator>__timers_processing``. A name taken twice
    gets a suffix ``_2``, ``_3``, ... (in operator, then state order).
    """
    out: dict[str, tuple[str, str]] = {}
    for uid in sorted(meta.operators):
        for state in sorted(meta.operators[uid].states):
            out[_unique(f"{_ident(uid)}__{_ident(state.lstrip('_'))}", out)] = (uid, state)
    return out


def change_view_names(views: Mapping[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Change feed view name -> (operator uid, state): ``<view>__changes`` for every state
    view, with a suffix ``_2``, ... where that name is a state view's name already."""
    taken: dict[str, Any] = dict(views)
    out: dict[str, tuple[str, str]] = {}
    for name, target in views.items():
        unique = _unique(name + CHANGES_SUFFIX, taken)
        taken[unique] = out[unique] = target
    return out


def _unique(base: str, taken: Mapping[str, Any]) -> str:
    lowered = {k.lower() for k in taken}
    name, n = base, 1
    while name.lower() in lowered:
        n += 1
        name = f"{base}_{n}"
    return name


def _ident(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", s) or "_"


def referenced(query: str, names: Sequence[str]) -> list[str]:
    """The names of ``names`` that occur in ``query`` as words (case-insensitive)."""
    words = {w.lower() for w in re.findall(r"[A-Za-z0-9_]+", query)}
    return [n for n in names if n.lower() in words]


@dataclass(frozen=True)
class ViewPlan:
    """The views of one ``statelog sql`` run: a checkpoint (or savepoint) of a root."""

    root: str  # the root URL as the job reports it
    meta: CheckpointMetadata
    target: str  # a checkpoint id, or savepoint:NAME
    changes_from: str | None  # --changes-from: the change feed views start after this checkpoint
    states: dict[str, tuple[str, str]]
    changes: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def metadata(self) -> dict[str, str]:
        """Metadata view name -> table of ``format("statelog-metadata")``."""
        from statelog.readers.metadata import TABLES

        return {METADATA_VIEW_PREFIX + t: t for t in TABLES}

    @property
    def names(self) -> list[str]:
        return [*self.states, *self.changes, *self.metadata]

    @property
    def where(self) -> str:
        return self.target if self.target.startswith("savepoint:") else f"checkpoint {self.target}"


def open_job(root: str, options: Mapping[str, Any]) -> StateJob:
    """The job at ``root``, read-only (never creates a job root)."""
    return StateJob(root, store_options=dict(options) or None, create=False)


def plan_views(root: str, options: Mapping[str, Any], checkpoint: str,
               changes_from: str | None = None) -> ViewPlan:
    """Resolve ``--checkpoint`` once (``latest`` stays that checkpoint for every view) and name
    the views. With ``changes_from``, every state also gets a change feed view."""
    from statelog.readers import options as opt  # the one resolver of the data sources

    job = open_job(root, options)
    try:
        meta = opt.resolve(job, checkpoint)
        if changes_from is not None:
            opt.resolve(job, changes_from, "--changes-from")  # an unknown checkpoint fails here, not later
        root_url = job.root
    finally:
        job.close()
    target = checkpoint.strip() if checkpoint.strip().startswith("savepoint:") else str(meta.checkpoint_id)
    states = view_names(meta)
    changes = change_view_names(states) if changes_from is not None else {}
    return ViewPlan(root_url, meta, target, changes_from, states, changes)


# -- what a query may be -------------------------------------------------------------------------

_READ_ONLY_STARTS = ("SELECT", "WITH", "FROM", "VALUES", "TABLE", "SHOW", "DESCRIBE", "DESC", "EXPLAIN")


def check_read_only(query: str) -> None:
    """``statelog sql`` runs queries only: a statement that would write or change the session
    (INSERT, CREATE, DROP, SET, COPY, ...) is refused before any engine starts. Each engine
    checks again with its own parser (a ``WITH ... INSERT`` starts like a query)."""
    text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", query, flags=re.S).lstrip(" \t\r\n(")
    first = re.match(r"[A-Za-z]+", text)
    word = first.group(0).upper() if first else ""
    if word not in _READ_ONLY_STARTS:
        shown = word or (text[:20] or "an empty statement")
        raise ConfigError(
            f"statelog sql runs read-only queries; the statement starts with {shown!r}: use SELECT "
            "(or WITH, SHOW, DESCRIBE, EXPLAIN)"
        )


def unknown_view(name: str, plan: ViewPlan) -> ConfigError:
    """The error of a query that names a view the checkpoint does not have."""
    hint = "" if plan.changes or not name.lower().endswith(CHANGES_SUFFIX) else \
        f" (change feed views {CHANGES_SUFFIX} need --changes-from ID)"
    return ConfigError(
        f"no view {name!r} in {plan.where} of {plan.root}{hint}; its views: {', '.join(plan.names)}"
    )


# -- inspect -------------------------------------------------------------------------------------

# rows of the state view of (operator uid, state) at a target; None: not counted (--no-count)
Counter = Callable[[str, str, str], int]


def inspect_report(root: str, options: Mapping[str, Any], checkpoint: str,
                   count: Counter | None) -> dict[str, Any]:
    """Operators and states of a checkpoint, with the row count of each state view when
    ``count`` is given (``count(uid, state, target)``)."""
    from statelog.readers.metadata import Catalog

    job = open_job(root, options)
    try:
        cat = Catalog(job, checkpoint)
        meta, sp_name, key = cat.entries[0]
        states = list(cat.states())
        root_url = job.root
    finally:
        job.close()
    views = {v: k for k, v in view_names(meta).items()}
    target = f"savepoint:{sp_name}" if sp_name else str(meta.checkpoint_id)
    out: dict[str, Any] = {
        "root": root_url,
        "checkpoint_id": meta.checkpoint_id,
        "kind": meta.kind,
        "savepoint": sp_name,
        "metadata_key": key,
        "max_parallelism": meta.max_parallelism,
        "sources": meta.sources,
        "operators": [],
    }
    for uid, op in sorted(meta.operators.items()):
        entry: dict[str, Any] = {"uid": uid, "parallelism": op.parallelism, "states": []}
        for row in states:
            if row[3] != uid:
                continue
            name = row[4]
            state = {
                "name": name, "kind": row[5], "value_type": row[6], "user_key_type": row[7], "ttl_ms": row[8],
                "internal": row[10], "view": views[(uid, name)],
                "rows": None if count is None else count(uid, name, target),
                "changelog_records": row[12], "changelog_bytes": row[13], "materialized_files": row[14],
                "materialized_rows": row[15], "materialized_bytes": row[16],
            }
            if name in TIMER_KINDS:
                # a timer pseudo-state: its rows are timers (timestamps in ms), not values;
                # "used": it holds timers, or held some (changes in the tail)
                state.update(kind=TIMER_KINDS[name], value_type="timestamp (ms)", used=bool(
                    state["rows"] or state["changelog_records"] or state["materialized_rows"]))
            entry["states"].append(state)
        out["operators"].append(entry)
    return out
