"""A fault-injecting wrapper around any :class:`~statelog.store.base.ObjectStore`, for tests.

Use it in your own tests to see what a job does when its store fails: wrap the store a
:class:`~statelog.job.StateJob` writes to, and tell the wrapper which calls fail, how, and
when. Every call passes through these stages, each optional and configured per operation
(``put``, ``put_if_absent``, ``get``, ``get_range``, ``head``, ``list``, ``delete``, or
``"*"`` for all) and optional key prefix::

    latency -> injected failure -> before hook -> inner call -> after hook -> read corruption

* :meth:`FaultInjectingStore.fail_next` fails the next *n* matching calls,
  :meth:`~FaultInjectingStore.fail_randomly` fails each matching call with probability *p*
  (seeded, so runs are reproducible). The default error is a
  :class:`~statelog.errors.TransientStoreError` (what a flaky network looks like).
* :meth:`~FaultInjectingStore.add_latency` sleeps before the call.
* :meth:`~FaultInjectingStore.before` / :meth:`~FaultInjectingStore.after` install a hook
  ``hook(op, key)``; a hook that raises simulates a crash before the inner call happened
  (nothing stored) or after it (the object is durable, but the caller never learns it).
* :meth:`~FaultInjectingStore.corrupt_reads` flips one byte of what ``get``/``get_range``
  return for matching keys, to exercise checksum verification.
* :data:`OUTAGES` names error factories for the ways a store fails that are not the data's
  fault, each raising what the S3 store (:mod:`statelog.store.s3.error_mapping`) raises
  for it (the object key in the message and in ``.key``): ``timeout``, ``connection``
  (refused or reset), ``server`` (HTTP 503): :class:`~statelog.errors.TransientStoreError`;
  ``permission``: :class:`~statelog.errors.StorePermissionError` (not retryable).
* ``calls`` and ``injected`` count the calls and the injected failures per operation;
  :meth:`~FaultInjectingStore.reset` removes every fault.

Example (a job whose store fails twice on upload, then crashes once the object is durable,
and returns corrupt changelog reads; ``docs/testing.md`` has a complete test)::

    from statelog.store import open_store
    from statelog.testing import OUTAGES, FaultInjectingStore

    store = FaultInjectingStore(open_store(root), seed=7)
    store.fail_next("put", 2)                        # two transient put failures
    store.fail_next("get", 1, error=OUTAGES["timeout"])
    store.after("put", crash_after_put)              # crash once the object is durable
    store.corrupt_reads(key_prefix="changelog/")     # every changelog read is corrupt
    job = statelog.StateJob(root, store=store)
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from statelog.errors import ConfigError, StoreError, StorePermissionError, TransientStoreError
from statelog.store.base import ObjectInfo, ObjectStore

OPS = ("put", "put_if_absent", "get", "get_range", "head", "list", "delete")

Hook = Callable[[str, str], None]
"""``hook(op, key)``; for ``list`` the key is the prefix."""

ErrorSpec = BaseException | type[BaseException] | Callable[[str, str], BaseException] | None
"""An exception instance, an exception class (called with a message), a factory
``f(op, key) -> exception``, or ``None`` for a :class:`TransientStoreError`."""


def timeout_error(op: str, key: str) -> StoreError:
    """A read or write that timed out (retryable)."""
    return TransientStoreError(f"{op} {key}: timed out after 30s (injected)", key=key)


def connection_error(op: str, key: str) -> StoreError:
    """The store cannot be reached: connection refused or reset (retryable)."""
    return TransientStoreError(f"{op} {key}: cannot reach the store (ConnectionResetError, injected)", key=key)


def server_error(op: str, key: str) -> StoreError:
    """The store answered HTTP 503 (retryable)."""
    return TransientStoreError(f"{op} {key}: HTTP 503 (injected)", key=key)


def permission_error(op: str, key: str) -> StoreError:
    """The store refused the operation for lack of permission (not retryable)."""
    return StorePermissionError(f"permission denied: {op} of {key} (injected)", key=key)


OUTAGES: dict[str, Callable[[str, str], StoreError]] = {
    "timeout": timeout_error,
    "connection": connection_error,
    "server": server_error,
    "permission": permission_error,
}
"""Store failures that are not the data's fault, by name (``fail_next(op, error=OUTAGES[...])``)."""


@dataclass
class _Rule:
    op: str
    key_prefix: str
    remaining: int | None  # None: unlimited (probability rules)
    probability: float
    error: ErrorSpec

    def matches(self, op: str, key: str) -> bool:
        return self.op in ("*", op) and key.startswith(self.key_prefix)


def _check_op(op: str) -> str:
    if op != "*" and op not in OPS:
        raise ConfigError(
            f"unknown store operation {op!r}; expected one of {', '.join(OPS)} or '*'"
        )
    return op


class FaultInjectingStore(ObjectStore):
    """Wraps ``inner`` and injects failures, latency, crashes and corruption on demand."""

    def __init__(self, inner: ObjectStore, *, seed: int = 0) -> None:
        self.inner = inner
        self.url = inner.url
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._latency: dict[str, float] = {}
        self._before: dict[str, Hook] = {}
        self._after: dict[str, Hook] = {}
        self._corrupt: list[str] = []
        self.calls: Counter[str] = Counter()  # calls per operation, injected or not
        self.injected: Counter[str] = Counter()  # injected failures per operation

    def __repr__(self) -> str:
        return f"FaultInjectingStore({self.inner!r})"

    # -- configuration ---------------------------------------------------------------------

    def fail_next(
        self, op: str, count: int = 1, *, error: ErrorSpec = None, key_prefix: str = ""
    ) -> None:
        """Fail the next ``count`` calls of ``op`` whose key starts with ``key_prefix``."""
        with self._lock:
            self._rules.append(_Rule(_check_op(op), key_prefix, count, 1.0, error))

    def fail_randomly(
        self, op: str, probability: float, *, error: ErrorSpec = None, key_prefix: str = ""
    ) -> None:
        """Fail each matching call of ``op`` with ``probability`` (seeded RNG)."""
        if not 0.0 <= probability <= 1.0:
            raise ConfigError(f"probability must be in [0, 1], got {probability}")
        with self._lock:
            self._rules.append(_Rule(_check_op(op), key_prefix, None, probability, error))

    def add_latency(self, op: str, seconds: float) -> None:
        """Sleep ``seconds`` before every call of ``op``."""
        with self._lock:
            self._latency[_check_op(op)] = seconds

    def before(self, op: str, hook: Hook | None) -> None:
        """Run ``hook(op, key)`` before the inner call (``None`` removes it)."""
        self._set_hook(self._before, op, hook)

    def after(self, op: str, hook: Hook | None) -> None:
        """Run ``hook(op, key)`` after the inner call succeeded (``None`` removes it)."""
        self._set_hook(self._after, op, hook)

    def _set_hook(self, table: dict[str, Hook], op: str, hook: Hook | None) -> None:
        with self._lock:
            if hook is None:
                table.pop(_check_op(op), None)
            else:
                table[_check_op(op)] = hook

    def corrupt_reads(self, key_prefix: str = "") -> None:
        """Flip one byte of every ``get``/``get_range`` result whose key matches."""
        with self._lock:
            self._corrupt.append(key_prefix)

    def reset(self) -> None:
        """Remove every fault, hook and counter."""
        with self._lock:
            self._rules.clear()
            self._latency.clear()
            self._before.clear()
            self._after.clear()
            self._corrupt.clear()
            self.calls.clear()
            self.injected.clear()

    # -- machinery -------------------------------------------------------------------------

    def _enter(self, op: str, key: str) -> None:
        with self._lock:
            self.calls[op] += 1
            delay = self._latency.get(op, self._latency.get("*", 0.0))
            error: BaseException | None = None
            for rule in self._rules:
                if not rule.matches(op, key):
                    continue
                if rule.remaining is not None:
                    if rule.remaining <= 0:
                        continue
                    rule.remaining -= 1
                elif self._rng.random() >= rule.probability:
                    continue
                error = self._make_error(rule.error, op, key)
                self.injected[op] += 1
                break
            hook = self._before.get(op) or self._before.get("*")
        if delay > 0:
            time.sleep(delay)
        if error is not None:
            raise error
        if hook is not None:
            hook(op, key)

    def _leave(self, op: str, key: str) -> None:
        with self._lock:
            hook = self._after.get(op) or self._after.get("*")
        if hook is not None:
            hook(op, key)

    @staticmethod
    def _make_error(spec: ErrorSpec, op: str, key: str) -> BaseException:
        message = f"injected {op} failure for {key!r}"
        if spec is None:
            return TransientStoreError(message, key=key)
        if isinstance(spec, BaseException):
            return spec
        if isinstance(spec, type):
            return spec(message)
        return spec(op, key)

    def _maybe_corrupt(self, key: str, data: bytes) -> bytes:
        with self._lock:
            if not data or not any(key.startswith(p) for p in self._corrupt):
                return data
            index = self._rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[index] ^= 0xFF
        return bytes(flipped)

    # -- ObjectStore -----------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        self._enter("put", key)
        self.inner.put(key, data)
        self._leave("put", key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._enter("put_if_absent", key)
        created = self.inner.put_if_absent(key, data)
        self._leave("put_if_absent", key)
        return created

    def get(self, key: str) -> bytes:
        self._enter("get", key)
        data = self.inner.get(key)
        self._leave("get", key)
        return self._maybe_corrupt(key, data)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self._enter("get_range", key)
        data = self.inner.get_range(key, offset, length)
        self._leave("get_range", key)
        return self._maybe_corrupt(key, data)

    def head(self, key: str) -> ObjectInfo | None:
        self._enter("head", key)
        info = self.inner.head(key)
        self._leave("head", key)
        return info

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._enter("list", prefix)
        items = self.inner.list(prefix)
        self._leave("list", prefix)
        return items

    def delete(self, key: str) -> None:
        self._enter("delete", key)
        self.inner.delete(key)
        self._leave("delete", key)

    def close(self) -> None:
        self.inner.close()
