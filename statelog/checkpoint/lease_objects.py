"""The objects of a lease on a job root, how a listing reads them, and who holds a lease.

A lease (:class:`statelog.checkpoint.lease.Lease`) lives in the job root itself, as
write-once objects below a *prefix* that names the lease (``materializer/lease/`` for the
materializer daemon, ``writer/lease/`` for the checkpoint publisher of a job):

* ``gen-<g:012d>.json``: generation ``g`` was acquired (owner, instance id, host, pid,
  ``host_id``, ``proc_start``, ``acquired_ms``, ``ttl_ms``). Created with
  :meth:`ObjectStore.put_if_absent`, so of the contenders racing for ``g`` exactly one wins.
  ``g`` is the fencing token: it only grows.
* ``gen-<g:012d>.renew-<n:012d>.json``: the holder's ``n``-th renewal of ``g``.
* ``gen-<g:012d>.released``: the holder released ``g`` on clean shutdown.

Every object is checksummed JSON ``{"crc32": ..., "body": {...}}`` like the other JSON
objects of statelog (:mod:`statelog.envelope`). The identity recorded in an acquisition
(host name, boot id and pid namespace, pid and process start time) lets a contender on the
same host tell that a holder's process is gone (:func:`holder_process_is_gone`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from statelog import envelope
from statelog.errors import CorruptionError, ObjectNotFoundError, StoreError, TransientStoreError
from statelog.layout import (
    lease_generation_key,
    lease_released_key,
    lease_renewal_key,
    parse_lease_name,
)
from statelog.store.base import ObjectInfo, ObjectStore

LEASE_FORMAT = "statelog-lease"
LEASE_VERSION = 1

# the lease objects' keys (statelog.layout): gen-<g>.json, gen-<g>.renew-<n>.json, gen-<g>.released
generation_key = lease_generation_key
renewal_key = lease_renewal_key
released_key = lease_released_key


# -- this process's identity ------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def host_id() -> str | None:
    """What makes a pid meaningful: the boot id and the pid namespace of this process
    (Linux); ``None`` where unknown (then a holder is never declared dead by its pid)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pidns}" if boot else None


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), ``None`` if
    unknown: tells a live holder from another process that reuses its pid."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def holder_process_is_gone(body: dict[str, Any]) -> bool:
    """``True`` only when the acquisition ``body`` names a process of this very host (same
    host name, boot and pid namespace) that no longer runs: the pid does not exist, is a
    zombie, or now belongs to a process started at another time. Anything uncertain
    (another host, no identity recorded) is ``False``: then only the ttl decides."""
    pid, hid = body.get("pid"), body.get("host_id")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or hid is None:
        return False
    if body.get("host") != socket.gethostname() or hid != host_id():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, owned by someone else
    except OSError:
        return False
    stat = _read(f"/proc/{pid}/stat")
    if stat is not None and stat[stat.rindex(")") + 2 :].startswith("Z"):
        return True  # a zombie: dead, not reaped yet
    started = body.get("proc_start")
    return isinstance(started, int) and process_start(pid) not in (None, started)


# -- the objects -----------------------------------------------------------------------------


def _encode(body: dict[str, Any]) -> bytes:
    return envelope.dump(body)


def _decode(data: bytes, key: str, kind: str, generation: int) -> dict[str, Any]:
    body = envelope.load(data, key, "lease object", fmt=LEASE_FORMAT, versions=(LEASE_VERSION,))
    if body.get("kind") != kind or body.get("generation") != generation:
        raise CorruptionError(
            f"lease object {key} holds a {body.get('kind')!r} of generation "
            f"{body.get('generation')!r}, expected a {kind!r} of generation {generation}",
            key=key,
        )
    if kind == "acquire":
        ttl_ms = body.get("ttl_ms")
        if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise CorruptionError(f"lease object {key} has an invalid ttl_ms {ttl_ms!r}", key=key)
    return body


def read_object(store: ObjectStore, key: str, kind: str, generation: int) -> dict[str, Any]:
    """The verified body of the lease object ``key``: a ``kind`` (``"acquire"``, ``"renew"``)
    of ``generation``; :class:`CorruptionError` otherwise, :class:`ObjectNotFoundError` if gone."""
    return _decode(store.get(key), key, kind, generation)


def acquisition(generation: int, owner: str, instance: str, ttl_ms: int, wall_ms: int) -> bytes:
    """The ``gen-<g>.json`` object of this process taking ``generation``."""
    return _encode(
        {
            "format": LEASE_FORMAT,
            "version": LEASE_VERSION,
            "kind": "acquire",
            "generation": generation,
            "owner": owner,
            "instance": instance,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "host_id": host_id(),
            "proc_start": process_start(os.getpid()),
            "acquired_ms": wall_ms,
            "ttl_ms": ttl_ms,
        }
    )


def renewal(generation: int, seq: int, owner: str, instance: str, wall_ms: int) -> bytes:
    """The ``gen-<g>.renew-<seq>.json`` object: the holder's ``seq``-th renewal of ``generation``."""
    return _encode(
        {
            "format": LEASE_FORMAT,
            "version": LEASE_VERSION,
            "kind": "renew",
            "generation": generation,
            "seq": seq,
            "owner": owner,
            "instance": instance,
            "renewed_ms": wall_ms,
        }
    )


def release_marker(generation: int, owner: str, instance: str, wall_ms: int) -> bytes:
    """The ``gen-<g>.released`` object: the holder gave ``generation`` up."""
    return _encode(
        {
            "format": LEASE_FORMAT,
            "version": LEASE_VERSION,
            "kind": "release",
            "generation": generation,
            "owner": owner,
            "instance": instance,
            "released_ms": wall_ms,
        }
    )


def create_once(store: ObjectStore, key: str, data: bytes) -> bool:
    """``put_if_absent`` that settles an unknown outcome by reading the object back.

    Only a transient failure can hide a create that landed; any other store error (no
    permission to write, refused credentials, no bucket) propagates at once: it is not
    "another holder won" and retrying does not help.
    """
    try:
        return store.put_if_absent(key, data)
    except TransientStoreError as exc:
        # The create may have landed before the failure: our bytes (unique through
        # the instance id) under the key mean it did.
        try:
            return store.get(key) == data
        except ObjectNotFoundError:
            return False
        except StoreError:
            raise exc from None


# -- listing ---------------------------------------------------------------------------------


@dataclass
class GenerationObjects:
    """The objects of one generation found by a listing."""

    info: ObjectInfo | None = None  # the gen-<g>.json object (None: orphaned renewals)
    renewals: dict[int, ObjectInfo] = field(default_factory=dict)
    released: ObjectInfo | None = None

    def objects(self) -> list[ObjectInfo]:
        found = list(self.renewals.values())
        if self.released is not None:
            found.append(self.released)
        if self.info is not None:
            found.append(self.info)  # last: prune deletes the generation object last
        return found


@dataclass(frozen=True)
class LeaseView:
    """What one listing of a lease's objects shows."""

    generations: dict[int, GenerationObjects]
    newest: int  # the newest generation with a gen-<g>.json object; 0 if none

    @property
    def newest_renewal(self) -> int:
        gen = self.generations.get(self.newest)
        return max(gen.renewals, default=0) if gen else 0

    @property
    def released(self) -> bool:
        gen = self.generations.get(self.newest)
        return gen is not None and gen.released is not None

    @property
    def state(self) -> tuple[int, int, bool]:
        """What a contender compares between listings: newest generation, its newest
        renewal, released or not."""
        return (self.newest, self.newest_renewal, self.released)


def scan(store: ObjectStore, prefix: str) -> LeaseView:
    """List the lease objects below ``prefix``."""
    generations: dict[int, GenerationObjects] = {}
    for info in store.list(prefix):
        parsed = parse_lease_name(info.key[len(prefix) :])
        if parsed is None:
            continue
        what, g, seq = parsed
        if what == "acquire":
            generations.setdefault(g, GenerationObjects()).info = info
        elif what == "renew":
            assert seq is not None
            generations.setdefault(g, GenerationObjects()).renewals[seq] = info
        else:
            generations.setdefault(g, GenerationObjects()).released = info
    newest = max((g for g, gen in generations.items() if gen.info is not None), default=0)
    return LeaseView(generations, newest)


def prunable(view: LeaseView, keep: int) -> list[ObjectInfo]:
    """The objects of all but the newest ``keep`` generations, and every renewal but the
    newest of the kept ones (each generation's ``gen-<g>.json`` last)."""
    complete = sorted(g for g, gen in view.generations.items() if gen.info is not None)
    kept = set(complete[-keep:])
    doomed: list[ObjectInfo] = []
    for g, gen in sorted(view.generations.items()):
        if g in kept:
            newest_seq = max(gen.renewals, default=0)
            doomed.extend(info for seq, info in gen.renewals.items() if seq != newest_seq)
        elif g > view.newest:
            continue  # orphaned renewals above the newest generation: leave them be
        else:
            doomed.extend(gen.objects())
    return doomed


def current_holder(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    """Describe the newest generation of the lease at ``prefix``, for display; ``None`` if none.

    Keys: ``generation``, ``owner``, ``instance``, ``host``, ``pid``, ``acquired_ms``,
    ``ttl_ms``, ``renewals`` (newest renewal number), ``renewed_ms`` (holder's wall clock
    of the newest renewal, or ``None``), ``released``, ``expires_hint_ms`` (holder's wall
    clock of the last activity + ttl: a hint only, clocks may be skewed) and
    ``last_activity_mtime`` (the store's mtime of the newest lease object, seconds).
    """
    view = scan(store, prefix)
    if view.newest == 0:
        return None
    g = view.newest
    body = read_object(store, generation_key(prefix, g), "acquire", g)
    renewed_ms: int | None = None
    seq = view.newest_renewal
    if seq:
        with contextlib.suppress(ObjectNotFoundError):  # pruned meanwhile
            key = renewal_key(prefix, g, seq)
            renewed_ms = int(read_object(store, key, "renew", g)["renewed_ms"])
    gen = view.generations[g]
    last = max(info.mtime for info in gen.objects())
    return {
        "generation": g,
        "owner": body.get("owner"),
        "instance": body.get("instance"),
        "host": body.get("host"),
        "pid": body.get("pid"),
        "acquired_ms": body.get("acquired_ms"),
        "ttl_ms": body["ttl_ms"],
        "renewals": seq,
        "renewed_ms": renewed_ms,
        "released": gen.released is not None,
        "expires_hint_ms": (renewed_ms or int(body.get("acquired_ms") or 0)) + body["ttl_ms"],
        "last_activity_mtime": last,
    }
