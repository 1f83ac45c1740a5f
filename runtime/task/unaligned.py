"""A task's part in unaligned checkpoints (``mode="exactly_once_unaligned"``).

An input task snapshots at the *first* barrier ``n`` and sends it ahead of its buffered
output (urgent: ahead of what its remote outputs still queue too); until the last barrier
``n`` it records the records that barrier overtook, on its output and on the input
channels still without it; at the last barrier it writes them as the in-flight object of
checkpoint ``n`` (:mod:`runtime.network.inflight`), then acknowledges. A source task in
this mode sends its barrier urgent and stores what it overtook as output.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

from runtime.api.functions import MAX_WATERMARK
from runtime.network import inflight
from runtime.network.barriers import BarrierHandler, BarrierUnaligner
from runtime.network.frames import BARRIER
from runtime.network.input_channel import InputChannel
from runtime.network.router import Router
from runtime.task.host import TaskHost
from statelog.layout import inflight_key


class UnalignedCheckpointing:
    """The unaligned-checkpoint methods of :class:`~runtime.task.task.Task` (which sets the
    attributes below and provides the two callables)."""

    host: TaskHost
    key: str
    router: Router
    barriers: BarrierHandler
    unaligned: bool  # an input task in unaligned mode
    channel_wm: list[int]
    channel_edges: list[int]
    channel_inputs: list[int]
    records_in: int
    backpressured_s: float
    # the checkpoint being recorded (first barrier seen, not yet the last one)
    _u_pending: list[Any]
    _u_input: list[tuple[int, int, Any, Any]]
    _u_output: list[tuple[int, Any, Any]]
    _u_sync: dict[str, Any]
    _snapshot_operators: Callable[[int], tuple[list[Any], dict[str, Any]]]
    channel_stats: Callable[[], dict[str, dict[str, float]]]
    metric_stats: Callable[[], dict[str, Any]]

    def _may_overtake(self) -> bool:
        """Barriers may go out urgent until the final watermark was sent: the final checkpoint
        is taken aligned (see :meth:`runtime.network.barriers.BarrierUnaligner.on_barrier_unaligned`)."""
        return not self.router.sent_final_watermark()

    def _urgent_barrier(self, ci: int, channel: InputChannel) -> None:
        """An urgent barrier on channel ``ci``: the frames queued before it are overtaken."""
        frame, puts_at = channel.urgent.popleft()
        _records, (kind, checkpoint_id) = frame
        assert kind == BARRIER
        self._on_unaligned_barrier(ci, checkpoint_id, channel.queued(puts_at - channel.polls))

    def _on_unaligned_barrier(self, ci: int, checkpoint_id: int, overtaken: list[Any] | None = None) -> None:
        """Barrier ``checkpoint_id`` on channel ``ci``; ``overtaken``: the frames of that channel
        it overtook (urgent), in-flight input of the checkpoint when it is being recorded."""
        handler = self.barriers
        assert isinstance(handler, BarrierUnaligner)
        finished = self.channel_wm[ci] >= MAX_WATERMARK
        actions = handler.on_barrier_unaligned(ci, checkpoint_id, finished)
        record = bool(overtaken) and (
            "start" in actions or "done" in actions or (handler.recording and handler.current == checkpoint_id)
        )
        for action in actions:
            if action == "abandon":
                self._abandon()
            elif action == "start":
                self._start_unaligned(checkpoint_id)
            elif action == "done":
                if record:
                    self._record_overtaken(ci, overtaken)  # type: ignore[arg-type]
                    record = False
                self._finish_unaligned(checkpoint_id, handler.alignment_ms())
        if record:
            self._record_overtaken(ci, overtaken)  # type: ignore[arg-type]

    def _record_overtaken(self, ci: int, frames: list[Any]) -> None:
        edge, idx = self.channel_edges[ci], self.channel_inputs[ci]
        self._u_input.extend((edge, idx, v, t) for records, _event in frames for v, t in records)

    def _start_unaligned(self, checkpoint_id: int) -> None:
        """First barrier: snapshot now and send the barrier ahead of the buffered output.

        With urgent barriers, ahead of the frames the remote outputs still queue too: they
        are taken out of the queues, stored with the checkpoint and queued again behind the
        barrier; what an in-process channel queues the receiving task records."""
        t0 = time.monotonic()
        pending, committables = self._snapshot_operators(checkpoint_id)
        output = self._overtake_outputs(checkpoint_id, self.urgent_barriers and self._may_overtake())
        if committables:
            self.host.send(("committables", checkpoint_id, self.key, committables))
        if pending:
            self.host.hold_async()
        self._u_pending, self._u_input, self._u_output = pending, [], output
        self._u_sync = {"sync_ms": (time.monotonic() - t0) * 1000}

    def _overtake_outputs(self, checkpoint_id: int, urgent: bool) -> list[tuple[int, Any, Any]]:
        """Send barrier ``checkpoint_id`` ahead of the output buffers and, ``urgent``, of what
        the remote outputs still queue; returns those records (``(edge index, value, ts)``),
        sent again right behind the barrier."""
        output: list[tuple[int, Any, Any]] = []
        for k, edge in enumerate(self.router.edges):
            queued = []
            for j, channel in enumerate(edge.channels):
                items = channel.take_queued() if urgent else []
                for data in items:
                    if isinstance(data, bytes):  # a frame (not an earlier urgent barrier)
                        output.extend((k, v, t) for v, t in pickle.loads(data)[0])
                buf, edge.buffers[j] = edge.buffers[j], []
                output.extend((k, v, t) for v, t in buf)
                queued.append((channel, items, buf))
            if urgent:
                edge.urgent_event((BARRIER, checkpoint_id))
            else:
                edge.event((BARRIER, checkpoint_id))
            for channel, items, buf in queued:
                channel.requeue(items)
                if buf:
                    channel.send((buf, None))
        return output

    def _finish_unaligned(self, checkpoint_id: int, alignment_ms: float) -> None:
        """Last barrier: the in-flight data is complete; write it, then acknowledge."""
        pending, data_in, data_out = self._u_pending, self._u_input, self._u_output
        self._u_pending, self._u_input, self._u_output = [], [], []
        stats = dict(self._u_sync, alignment_ms=alignment_ms, records=0, **self.metric_stats())
        blob = sources = None
        if data_in or data_out:
            ref = self._inflight(checkpoint_id, data_in, data_out, pending, stats, held=True)
            if ref is None:
                return  # declined: too large
            blob, sources = ref
        self.host.acknowledge_async(checkpoint_id, self.key, pending, sources, stats, blob=blob, held=True)

    def _inflight(self, checkpoint_id: int, data_in: list[Any], data_out: list[Any], pending: list[Any],
                  stats: dict[str, Any], *, held: bool) -> tuple[tuple[str, bytes], dict[str, Any]] | None:  # fmt: skip
        """The in-flight object of this task and checkpoint and its reference for ``sources``
        (``stats`` get its size); None when it exceeds ``max_inflight_bytes`` (declined)."""
        vertex, subtask = self.key.split(".")
        payload = {
            "version": inflight.VERSION,
            "checkpoint": checkpoint_id,
            "task": self.key,
            "vertex": int(vertex),
            "subtask": int(subtask),
            "parallelism": self.host.config.parallelism,
            "input": data_in,
            "output": data_out,
        }
        data, digest = inflight.encode(payload)
        cap = self.host.config.max_inflight_bytes
        if cap is not None and len(data) > cap:
            self._decline_inflight(checkpoint_id, pending, len(data), cap, held)
            return None
        key = inflight_key(checkpoint_id, self.key)
        sources = {inflight.INFLIGHT_KEY: {self.key: {
            "key": key, "bytes": len(data), "sha256": digest, "version": inflight.VERSION,
            "parallelism": self.host.config.parallelism,
            "input": len(data_in), "output": len(data_out),
        }}}
        stats["inflight_bytes"] = len(data)
        stats["inflight_records"] = len(data_in) + len(data_out)
        return (key, data), sources

    def _decline_inflight(self, checkpoint_id: int, pending: list[Any], size: int, cap: int, held: bool) -> None:
        """The in-flight data of this task alone exceeds ``max_inflight_bytes``: decline."""
        for p in pending:
            p.cancel()
        if pending and held:
            self.host.release_async()
        self.host.send(("decline", checkpoint_id, self.key, inflight.too_large(size, cap, f"at task {self.key}")))

    def _abandon(self) -> None:
        pending, self._u_pending, self._u_input, self._u_output = self._u_pending, [], [], []
        for p in pending:
            p.cancel()
        if pending:
            self.host.release_async()

    def abort_checkpoint(self, checkpoint_id: int) -> None:
        if self.unaligned:
            assert isinstance(self.barriers, BarrierUnaligner)
            if self.barriers.abort(checkpoint_id):
                self._abandon()
