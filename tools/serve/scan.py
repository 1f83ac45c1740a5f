"""Scans of ``statelog serve``: the entries of a state by key range or key group, a page at a time.

``GET /v1/scan/<operator>/<state>`` with query arguments (every one optional):

* ``from=<JSON>`` / ``to=<JSON>``: keys ``from <= key < to`` (a key that does not compare with the
  bounds, of another type, is outside the range);
* ``key_group=N``: keys of key group ``N`` (of the job's ``max_parallelism``);
* ``namespace=<JSON>``: that namespace only (default: every namespace);
* ``limit=N``: at most ``N`` entries per page (default 1000, at most 10000);
* ``cursor=C``: the page after the one that returned ``"next": C``.

The answer is ``{"entries": [[key, namespace, value], ...], "next": C or null,
"checkpoint_id", "flushed_records"}``. A cursor holds the checkpoint its scan started at: when
the replica has moved to another checkpoint, the next page is refused (409) and the scan starts
again, so the pages of one scan are all of one state.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import StatelogError
from statelog.following.follower import Follower
from statelog.following.json_values import KEY_EXPECTED, key_from_json, to_json
from statelog.following.position import Read
from statelog.following.replica import OperatorReplica
from statelog.keys.groups import key_group_of

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "ScanRequest", "scan_page"]

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
ARGS = ("from", "to", "key_group", "namespace", "limit", "cursor")
_UNSET = object()


class ScanError(StatelogError):
    """A scan request the server refuses with ``status``."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(text: str, what: str) -> Any:
    try:
        return key_from_json(json.loads(text), what)
    except json.JSONDecodeError:
        raise ScanError(HTTPStatus.BAD_REQUEST,
                        f"{what}: expected {KEY_EXPECTED}, URL-encoded; got {text[:80]!r}, which is not JSON") from None


def _int(text: str, what: str, low: int, high: int) -> int:
    try:
        n = int(text)
    except ValueError:
        n = low - 1
    if not low <= n <= high:
        raise ScanError(HTTPStatus.BAD_REQUEST, f"{what}: expected an integer {low}..{high}, got {text[:80]!r}")
    return n


class ScanRequest:
    """The parsed arguments of one scan page."""

    def __init__(self, query: str) -> None:
        args = parse_qs(query, keep_blank_values=True)
        unknown = sorted(set(args) - set(ARGS))
        repeated = sorted(k for k, v in args.items() if len(v) != 1)
        if unknown or repeated:
            raise ScanError(HTTPStatus.BAD_REQUEST,
                            f"a scan takes each of {', '.join(ARGS)} at most once; got unknown {unknown}, repeated {repeated}")
        one = {k: v[0] for k, v in args.items()}
        self.start = _json(one["from"], "from") if "from" in one else _UNSET
        self.end = _json(one["to"], "to") if "to" in one else _UNSET
        self.key_group = _int(one["key_group"], "key_group", 0, 1 << 15) if "key_group" in one else None
        self.namespace = _json(one["namespace"], "namespace") if "namespace" in one else _UNSET
        self.limit = _int(one["limit"], "limit", 1, MAX_LIMIT) if "limit" in one else DEFAULT_LIMIT
        self.checkpoint_id: int | None = None
        self.skip = 0
        if "cursor" in one:
            cp, _, skip = one["cursor"].partition(":")
            if not (cp.isdigit() and skip.isdigit()):
                raise ScanError(HTTPStatus.BAD_REQUEST,
                                f"cursor: expected the \"next\" of the previous page (like 7:1000), got {one['cursor'][:80]!r}")
            self.checkpoint_id, self.skip = int(cp), int(skip)

    def accept(self, max_parallelism: int) -> Callable[[Any, Any], bool]:
        start, end, kg, ns = self.start, self.end, self.key_group, self.namespace

        def accept(key: Any, namespace: Any) -> bool:
            if ns is not _UNSET and namespace != ns:
                return False
            try:
                if start is not _UNSET and key < start:
                    return False
                if end is not _UNSET and not key < end:
                    return False
            except TypeError:
                return False  # a key of another type than the bounds: outside the range
            return kg is None or key_group_of(key, max_parallelism) == kg

        return accept


def _accepted(rep: OperatorReplica, state: str, accept: Callable[[Any, Any], bool]) -> Iterator[tuple[Any, Any]]:
    rep.check_state(state)
    for key, ns, _ in rep.backend.entries(state):  # (one entry per key and namespace, every kind)
        if accept(key, ns):
            yield key, ns


class ScanCursors:
    """Where the last ``SIZE`` scans stopped: the next page goes on from there instead of
    walking the state from its start again, while the replica holds the same state (the same
    checkpoint, flushed records and replica object); otherwise it walks from the start."""

    SIZE = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[tuple[Any, ...], tuple[Any, int, Iterator[tuple[Any, Any]]]] = OrderedDict()

    def take(self, where: tuple[Any, ...], rep: OperatorReplica, ahead: int) -> Iterator[tuple[Any, Any]] | None:
        with self._lock:
            held = self._open.pop(where, None)
        return held[2] if held is not None and held[0] is rep and held[1] == ahead else None

    def keep(self, where: tuple[Any, ...], rep: OperatorReplica, ahead: int, it: Iterator[tuple[Any, Any]]) -> None:
        with self._lock:
            self._open[where] = (rep, ahead, it)
            while len(self._open) > self.SIZE:
                self._open.popitem(last=False)


def scan_page(follower: Follower, operator: str, state: str, query: str, cursors: ScanCursors) -> dict[str, Any]:
    """One page of a scan (see the module's doc)."""
    req = ScanRequest(query)
    max_parallelism = follower.backend(operator).max_parallelism
    if req.key_group is not None and req.key_group >= max_parallelism:
        raise ScanError(HTTPStatus.BAD_REQUEST,
                        f"key_group: expected 0..{max_parallelism - 1} (max_parallelism {max_parallelism}), got {req.key_group}")
    accept = req.accept(max_parallelism)

    def page(meta: CheckpointMetadata | None, replicas: dict[str, OperatorReplica], ahead: int) -> Read:
        checkpoint_id = None if meta is None else meta.checkpoint_id
        if req.checkpoint_id is not None and checkpoint_id != req.checkpoint_id:
            raise ScanError(HTTPStatus.CONFLICT,
                            f"cursor: the scan started at checkpoint {req.checkpoint_id}, the replica is now at "
                            f"{checkpoint_id}; start the scan again (without cursor)")
        if operator not in replicas:
            follower.backend(operator)  # raises the lookups' error (no checkpoint yet, unknown operator)
        rep = replicas[operator]
        args = tuple(sorted((k, tuple(v)) for k, v in parse_qs(query, keep_blank_values=True).items() if k != "cursor"))
        it = cursors.take((operator, state, args, checkpoint_id, req.skip), rep, ahead)
        if it is None:
            it = _accepted(rep, state, accept)
            for _ in itertools.islice(it, req.skip):
                pass
        out = [(key, ns, rep.get(state, key, ns)) for key, ns in itertools.islice(it, req.limit)]
        peek = next(it, None)
        done = peek is None
        if not done:
            it = itertools.chain([peek], it)
            cursors.keep((operator, state, args, checkpoint_id, req.skip + len(out)), rep, ahead, it)
        return Read((out, done), checkpoint_id, ahead)

    read = follower.with_replicas(page)
    entries, done = read.value
    return {
        "entries": [[to_json(k), to_json(ns), to_json(v)] for k, ns, v in entries],
        "next": None if done else f"{read.checkpoint_id}:{req.skip + len(entries)}",
        "checkpoint_id": read.checkpoint_id, "flushed_records": read.flushed_records,
    }  # fmt: skip
