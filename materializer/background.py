"""The materializer in a thread of this process: the embedded default (``docs/materializer.md``).

:func:`start_background` runs a :class:`~materializer.daemon.loop.MaterializerDaemon` loop in a
daemon thread of the current process, with its own handle on the job root
(:func:`statelog.store.reopen_store`; a store that cannot be reopened, such as a fault
injector, is shared), and returns a :class:`BackgroundMaterializer` to trigger, wait for and
stop it. Used by single-process jobs, examples, tests and the runtime's job master.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from materializer.daemon.loop import MaterializerDaemon
from materializer.options import MaterializerOptions, default_owner
from statelog.checkpoint.catalog import JobCatalog
from statelog.errors import ConfigError, FencedError, StatelogError
from statelog.job import StateJob
from statelog.store import open_store, reopen_store
from statelog.store.base import ObjectStore

__all__ = ["BackgroundMaterializer", "start_background"]

log = logging.getLogger(__name__)


def _own_store(store: ObjectStore) -> tuple[ObjectStore, bool]:
    """A separate handle on the same root (``True``), or ``store`` itself if it cannot be reopened."""
    twin = reopen_store(store)
    return (store, False) if twin is None else (twin, True)


class BackgroundMaterializer:
    """A :class:`MaterializerDaemon` looping in a daemon thread of this process.

    :meth:`trigger` forces a cycle and waits for it, :meth:`wait_idle` waits until no cycle
    runs or is pending, :meth:`stop` stops the loop and releases the lease (also registered
    with :mod:`atexit`). Use it as a context manager to stop it at the end of a block.
    """

    def __init__(self, daemon: MaterializerDaemon, owns_store: bool) -> None:
        self.daemon = daemon
        self._owns_store = owns_store
        self._thread = threading.Thread(target=self._main, name="statelog-materializer", daemon=True)
        self._stopped = False
        self.error: BaseException | None = None  # set if the loop itself died

    def _main(self) -> None:
        try:
            self.daemon.run()
        except FencedError as exc:  # it lost its lease for good: one line, no traceback
            self.error = exc
            log.error("background materializer stopped: %s", exc)
        except BaseException as exc:  # a fatal store error (FATAL_ERRORS) or a bug
            self.error = exc
            log.exception("background materializer died")

    def start(self) -> BackgroundMaterializer:
        self._thread.start()
        atexit.register(self.stop)
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def last_summary(self) -> dict[str, Any] | None:
        return self.daemon.last_summary

    def trigger(self, timeout: float = 60.0) -> dict[str, Any]:
        """Force a cycle now and wait for it; returns its summary (or raises its error)."""
        if not self.running:
            raise StatelogError("the background materializer is not running") from self.error
        ticket = self.daemon.request_cycle()
        if not self.daemon.wait_served(ticket, timeout):
            raise TimeoutError(f"the forced materializer cycle did not complete within {timeout}s")
        if self.daemon._stopping():
            raise StatelogError("the background materializer was stopped")
        # the cycle that served the ticket was forced (or a later forced one): its result, not
        # that of an unforced cycle which may have run since
        summary, error = self.daemon.forced_result
        if error is not None:
            raise error
        assert summary is not None
        return summary

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Wait until no cycle is running or requested; ``False`` on timeout."""
        return self.daemon.wait_idle(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop, release the lease and close the own store handle (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        self.daemon.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the background materializer did not stop within %.1fs", timeout)
            return
        if self._owns_store:
            self.daemon.store.close()

    def __enter__(self) -> BackgroundMaterializer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_background(
    job_or_root: Any,
    options: MaterializerOptions | None = None,
    *,
    store_options: dict[str, Any] | None = None,
    **opts: Any,
) -> BackgroundMaterializer:
    """Start a materializer loop in a daemon thread of this process and return its handle.

    ``job_or_root`` is a :class:`~statelog.job.StateJob`, an :class:`ObjectStore` or a job
    root URL (opened with ``store_options``); the loop uses its own store handle on that
    root. ``options`` (a :class:`~materializer.options.MaterializerOptions`) and ``opts`` are
    the :class:`MaterializerDaemon`'s (``interval_s``, ``max_tail_bytes``, ``lease_ttl_s``,
    ...; ``owner`` defaults to ``background@host:pid``).
    Several processes may each start one: the lease makes exactly one of them publish.
    """
    if isinstance(job_or_root, StateJob):
        store, owns = _own_store(job_or_root.store)
    elif isinstance(job_or_root, ObjectStore):
        store, owns = _own_store(job_or_root)
    elif isinstance(job_or_root, str):
        store, owns = open_store(job_or_root, store_options), True
    else:
        raise ConfigError(
            f"start_background needs a StateJob, an ObjectStore or a job root URL, got {type(job_or_root).__name__}"
        )
    try:
        JobCatalog(store).open_job(None, create=False)
        if (options is None or options.owner is None) and "owner" not in opts:
            opts["owner"] = default_owner("background")
        daemon = MaterializerDaemon(store, options, store_options=store_options, **opts)
    except BaseException:
        if owns:
            store.close()
        raise
    bg = BackgroundMaterializer(daemon, owns).start()
    if isinstance(job_or_root, StateJob):  # a job that lost its root stops its materializer too
        job_or_root.on_fenced(lambda _error: daemon.stop())
    return bg
