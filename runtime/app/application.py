"""The consumer loop of a Kafka application with statelog state, owned by one object.

:class:`Application` does what the hand-written loop of ``docs/guide.md`` ("Writing the loop
yourself") does: it opens the job root (or takes an open :class:`~statelog.job.StateJob`),
restores one keyed backend and the Kafka offsets from the same checkpoint
(:class:`statelog.kafka.KafkaOffsets`: ``assign`` at the recorded offsets), runs the
materializer in a background thread (:func:`materializer.start_background`), and in
:meth:`Application.run` consumes batches, sets each record's key, calls the user's function
per record or per batch (:meth:`Application.run_batches`: per Arrow record batch of key and
value columns), checkpoints every ``checkpoint_every`` records or
``checkpoint_interval_s`` seconds (between batches, with the consumer's positions as the
checkpoint's sources, then committed to the group for monitoring), and on SIGINT, SIGTERM or
:meth:`Application.stop` finishes the batch in hand, takes a final checkpoint and closes the
materializer, the job (its writer lease) and the consumer. A second SIGINT aborts at once
without a final checkpoint; so does an exception of the user's function (a restart replays
from the last checkpoint). State is exactly once across restarts; outputs are not
(``docs/guide.md``).

With ``metrics_port`` the job serves Prometheus metrics (``docs/monitoring.md``): its
checkpoints, the records read (``statelog_job_records_in_total``) and each partition's
consumer lag (reported at every checkpoint). For monitoring in code, the application keeps its :attr:`Application.consumer`, the
:class:`~statelog.kafka.KafkaOffsets` (:attr:`Application.offsets`), the number of records
processed (:attr:`Application.records`) and of checkpoints taken
(:attr:`Application.checkpoints`), and the last checkpoint (:attr:`Application.last_checkpoint`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import statelog
from materializer.background import BackgroundMaterializer, start_background
from runtime.app.batches import messages_batch, value_decoder
from runtime.app.options import KEY_STR, ApplicationOptions
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.descriptors import StateDescriptor
from statelog.errors import ConfigError
from statelog.job import StateJob
from statelog.kafka import KafkaOffsets
from statelog.restore.collector import gc_paused
from statelog.signals import stop_on_signals
from statelog.state.backend import KeyedStateBackend

try:  # the kafka extra; KafkaOffsets raises MissingDependencyError without it
    from confluent_kafka import KafkaError, KafkaException
except ImportError:  # pragma: no cover - exercised only without the extra
    KafkaError = KafkaException = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)


class Application:
    """A Kafka consumer loop with keyed statelog state: ``Application(root, topics=..., kafka=...)``,
    then :meth:`state` for each state and :meth:`run` with the function to call.

    ``root`` is a job root URL (opened with ``statelog.open(root, **open_options)``) or an open
    :class:`~statelog.job.StateJob` (the application closes it when it stops). The options are
    :class:`~runtime.app.options.ApplicationOptions`, as keyword arguments or as ``options``.
    The constructor restores the state and the offsets, so a bad topic or a held writer lease
    fails here; if :meth:`run` is never called, call :meth:`close` (or use ``with``). With
    ``standby=True`` the constructor first follows the root until its writer lease is free, then
    continues from the replica without a restore (``docs/follow.md``, "Hot standby").
    """

    def __init__(
        self, root: str | StateJob, options: ApplicationOptions | Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if options is not None and kwargs:
            raise ConfigError("Application takes its options as keyword arguments or as options=, not both")
        self.options = ApplicationOptions.from_mapping(options if options is not None else kwargs)
        if not isinstance(root, str | StateJob):
            raise ConfigError(f"Application needs a job root URL or a StateJob, got {type(root).__name__}")
        given = options if isinstance(options, Mapping) else kwargs
        if isinstance(root, StateJob) and (self.options.open_options or self.options.metrics_port is not None
                                           or "local_copies" in given or self.options.standby):
            raise ConfigError("open_options, local_copies, metrics_port and standby apply when the Application opens "
                              "the root; pass them to statelog.open yourself when you give it a StateJob")
        self.records = 0  # records given to the user's function
        self.checkpoints = 0  # checkpoints taken by this application (the final one included)
        self.last_checkpoint: CheckpointMetadata | None = None
        self.materializer: BackgroundMaterializer | None = None
        self._stop = threading.Event()
        self._closed = False
        opts = self.options
        if isinstance(root, StateJob):
            self.job = root
        else:
            self.job = statelog.open(root, **(opts.open_options or {}), metrics_port=opts.metrics_port,
                                     metrics_host=opts.metrics_host, local_copies=opts.local_copies,
                                     standby=opts.standby)
        try:
            restored = self.job.resolve_checkpoint(opts.restore)
            self.restored_from = restored
            self.backend: KeyedStateBackend = self.job.backend(opts.uid, restore=restored or "none")
            settings = {"group.id": opts.uid, **(opts.kafka or {})}
            self.offsets = KafkaOffsets(settings, list(opts.topics or ()), partitions=opts.partitions,
                                        start=opts.start)
            self.consumer = self.offsets.consumer
            try:
                self.start_offsets = self.offsets.restore(restored)
            except BaseException:
                self.consumer.close()
                raise
        except BaseException:
            self.job.close(flush=False)
            raise

    # -- what the user's function uses -------------------------------------------------------

    def state(self, descriptor: StateDescriptor) -> Any:
        """The state object of ``descriptor`` (``backend.get_state``), scoped to the current key."""
        return self.backend.get_state(descriptor)

    def key_of(self, msg: Any) -> Any:
        """The state key of message ``msg`` by the ``key`` option (``None``: the message key as is)."""
        how, raw = self.options.key, msg.key()
        if callable(how):
            return how(msg)
        if how == KEY_STR and raw is not None:
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(
                    f"the key of record {msg.topic()}[{msg.partition()}]@{msg.offset()} is not UTF-8 text "
                    f"({raw[:32]!r}); use key='bytes' or a key function"
                ) from None
        return raw

    def keyed(self, msgs: Iterable[Any]) -> Iterator[Any]:
        """Yield each message of a batch with its key set as the current key (the ``key`` option)."""
        for msg in msgs:
            self.backend.set_current_key(self.key_of(msg))
            yield msg

    def stop(self) -> None:
        """Stop :meth:`run` after the batch in hand, with a final checkpoint (any thread)."""
        self._stop.set()

    # -- the loop ----------------------------------------------------------------------------

    def run(self, process: Callable[[Any], Any], *, batch: bool = False) -> CheckpointMetadata | None:
        """Consume and call ``process`` until :meth:`stop`, SIGINT or SIGTERM; return the final checkpoint.

        ``process(msg)`` is called per ``confluent_kafka.Message`` with the current key set (unless
        ``key=None``); with ``batch=True``, ``process(msgs)`` per list of messages of one
        ``consume()`` (iterate ``app.keyed(msgs)`` to set each key). Messages with an error are
        skipped (logged; a fatal consumer error raises ``KafkaException``)."""
        if not callable(process):
            raise ConfigError(f"Application.run needs a function to call per record, got {type(process).__name__}")
        return self._run(process, "batch" if batch else "record")

    def run_batches(self, process: Callable[[Any], Any], *, value: Any = "bytes") -> CheckpointMetadata | None:
        """Like :meth:`run`, with ``process(batch)`` per ``consume()`` as a :class:`pyarrow.RecordBatch`
        of the columns ``key`` (by the ``key`` option: binary, UTF-8 text or the key function's
        values) and ``value`` (``value``: ``"bytes"``, ``"str"``, ``"json"`` or a fixed-width
        numpy dtype; :mod:`runtime.app.batches`). No current key is set: give the key column to
        the batch state calls (``state.add_many(batch["key"], ...)``, ``get_many``, ``put_many``)."""
        if not callable(process):
            raise ConfigError(f"Application.run_batches needs a function to call per batch, "
                              f"got {type(process).__name__}")
        decode = value_decoder(value)
        how = self.options.key if self.options.key is not None else "bytes"
        return self._run(lambda msgs: process(messages_batch(msgs, how, decode)), "columns")

    def _run(self, process: Callable[[Any], Any], mode: str) -> CheckpointMetadata | None:
        if self._closed:
            raise ConfigError("this Application has stopped; make a new one to run again")
        with self._signals():  # also during the final checkpoint: a repeated SIGTERM does not kill it
            finished = False
            try:
                self._start_materializer()
                self._loop(process, mode)
                finished = True
            finally:
                self._close(final_checkpoint=finished)
        return self.last_checkpoint

    def _loop(self, process: Callable[[Any], Any], mode: str) -> None:
        opts = self.options
        since, last_time = 0, time.monotonic()
        log.info("application %s reading %s from %s", opts.uid, list(opts.topics or ()), self.start_offsets)
        while not self._stop.is_set():
            # The client's Message objects are tracked by Python's cyclic collector: a batch of
            # 10^5 of them set off dozens of collections that traverse the batch again and
            # again (about half of the client's time in its consume() calls, measured). The
            # collector is paused while a batch is consumed and processed; the batch is freed
            # before it resumes, so what is left to collect is what the processing kept.
            with gc_paused():
                n = self._consume_and_process(process, mode)
            since += n
            now = time.monotonic()
            if since and (
                (opts.checkpoint_every is not None and since >= opts.checkpoint_every)
                or (opts.checkpoint_interval_s is not None and now - last_time >= opts.checkpoint_interval_s)
            ):
                self._checkpoint()
                since, last_time = 0, time.monotonic()

    def _consume_and_process(self, process: Callable[[Any], Any], mode: str) -> int:
        """One ``consume()`` and its processing; returns the number of records processed."""
        opts = self.options
        got = self.consumer.consume(opts.batch_size, opts.poll_timeout_s)
        msgs = [m for m in got if m.error() is None]
        if len(msgs) != len(got):  # skip (log) or raise the errors, then the usable messages
            msgs = [m for m in got if self._usable(m)]
        del got
        if not msgs:
            return 0
        if opts.key is not None and mode != "columns":  # batch state calls prefetch their keys
            self.backend.prefetch([self.key_of(m) for m in msgs])
        if mode != "record":
            process(msgs)
        elif opts.key is None:
            for msg in msgs:
                process(msg)
        else:
            for msg in self.keyed(msgs):
                process(msg)
        self.records += len(msgs)
        self.job.metrics.records_in(len(msgs))
        log.debug("%d records processed", self.records)
        return len(msgs)

    def _usable(self, msg: Any) -> bool:
        err = msg.error()
        if err is None:
            return True
        if err.code() == KafkaError._PARTITION_EOF:
            return False
        if err.fatal():
            raise KafkaException(err)
        log.warning("skipping a consumer error on %s[%s]: %s", msg.topic(), msg.partition(), err)
        return False

    def _checkpoint(self) -> CheckpointMetadata:
        opts = self.options
        meta = self.offsets.checkpoint(self.job, commit_offsets=opts.commit_offsets,
                                       timeout=opts.checkpoint_timeout_s)
        self.last_checkpoint = meta
        self.checkpoints += 1
        log.debug("checkpoint %d: %s", meta.checkpoint_id, meta.sources)
        return meta

    def _start_materializer(self) -> None:
        how = self.options.materializer
        if how is False or self.materializer is not None:
            return
        self.materializer = start_background(self.job, None if how is True else how)

    def _signals(self) -> contextlib.AbstractContextManager[None]:
        """SIGTERM and SIGINT stop the loop (:func:`statelog.signals.stop_on_signals`: a second
        SIGINT interrupts at once, a second SIGTERM changes nothing); main thread only."""
        if not self.options.handle_signals:
            return contextlib.nullcontext()
        return stop_on_signals(self._stop, "stopping after this batch with a final checkpoint", log)

    # -- shutdown ----------------------------------------------------------------------------

    def _close(self, final_checkpoint: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if final_checkpoint:
                meta = self._checkpoint()
                log.info("application %s stopped: final checkpoint %d after %d records",
                         self.options.uid, meta.checkpoint_id, self.records)
        finally:
            try:
                if self.materializer is not None:
                    self.materializer.stop()
                self.job.close(flush=final_checkpoint)
            finally:
                self.consumer.close()

    def close(self) -> None:
        """Close without running: the job (its writer lease) and the consumer; no checkpoint."""
        self._close(final_checkpoint=False)

    def __enter__(self) -> Application:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
