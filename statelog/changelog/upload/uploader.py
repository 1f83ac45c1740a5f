"""Writes changelog segment objects to the store.

The store I/O of a changelog writer: a pool of ``upload_threads`` threads puts segment
objects, each put retried on transient store errors by the writer's
:class:`~statelog.store.retry.RetryPolicy`. Several segments may be in flight at once; the
writer makes records durable in sequence order whatever order their uploads complete in.
"""

from __future__ import annotations

import concurrent.futures as cf

from statelog.store.base import ObjectStore
from statelog.store.retry import RetryPolicy, call_with_retry


class SegmentUploader:
    """Puts segment objects on ``store`` from ``threads`` upload threads, retried by ``retry``."""

    def __init__(self, store: ObjectStore, retry: RetryPolicy, threads: int) -> None:
        self.store = store
        self.retry = retry
        self._pool = cf.ThreadPoolExecutor(threads, thread_name_prefix="statelog-upload")

    def upload(self, name: str, data: bytes) -> cf.Future[None]:
        """Start putting ``data`` as object ``name``; the future fails with the last error."""
        return self._pool.submit(call_with_retry, self.retry, lambda: self.store.put(name, data), f"upload of {name}")

    def close(self) -> None:
        """Wait for the uploads in flight to end; no upload starts afterwards."""
        self._pool.shutdown(wait=True)
