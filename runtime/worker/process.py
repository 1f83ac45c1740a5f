"""A worker process: runs subtask ``i`` of every vertex of the job (slot sharing).

Threads of a worker:

* the **task thread** (the process's main thread) runs :meth:`Worker.run`: a mailbox loop
  that handles control messages from the job master (trigger, complete, abort, stop), steps
  every task, fires processing-time timers and periodically lets the backends adopt the
  newest materialization (``job.adopt_latest_materialization()``). All operator code and all
  state access happen on this thread;
* the **control reader** receives messages from the job master's pipe into the mailbox;
* **channel** threads: one sender per outgoing and one reader per incoming remote channel
  (:mod:`runtime.network`);
* the **snapshot pool** runs the asynchronous part of checkpoints (``pending.result()``)
  and sends acknowledgements;
* statelog's own changelog flusher and uploaders.

Protocol with the job master (tuples over a ``multiprocessing`` pipe): the worker sends
``("ready", i, address, pid)``, receives ``("deploy", spec)``, sends ``("running", i)``;
then it receives ``("trigger", cid)``, ``("complete", cid)``, ``("abort", cid)``, ``("stop",)``
and sends ``("ack", cid, task, handles, sources, stats)``, ``("decline", cid, task, reason)``,
``("committables", cid, task, {uid: records})``, ``("source_finished", task)``,
``("failed", i, traceback)`` and ``("stopped", i)``. On ``deploy`` the worker opens the
job root and builds its tasks and their channels with :func:`runtime.worker.deploy.build_tasks`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import pickle
import sys
import threading
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from runtime.config import JobConfig
from runtime.errors import ChannelError
from runtime.graph import JobGraph
from runtime.network.server import ChannelServer
from runtime.task.task import Task
from runtime.worker.deploy import build_tasks
from runtime.worker.lease_grant import LeaseGrant
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.job import StateJob
from statelog.state.snapshot import PendingSnapshot

log = logging.getLogger(__name__)

ADOPT_EVERY_S = 0.5
TIMERS_EVERY_S = 0.01
IDLE_WAIT_S = 0.005
# The interpreter's switch interval while an asynchronous part is in flight (default 5 ms).
ASYNC_SWITCH_INTERVAL_S = 0.0005


def worker_main(index: int, conn: Connection, log_level: int | None, secret: bytes) -> None:
    """Entry point of a worker process (a local one: ``secret`` came with its arguments)."""
    if log_level is not None:
        logging.basicConfig(level=log_level, format=f"%(asctime)s worker-{index} %(name)s %(levelname)s %(message)s")
    worker = Worker(index, conn, secret)
    try:
        worker.main()
    except ChannelError as e:  # secondary: the job master sees the peer's death as well
        log.warning("worker %d: %s", index, e)
        with contextlib.suppress(Exception):
            worker.send(("failed", index, f"ChannelError: {e}"))
        os._exit(1)
    except BaseException:
        tb = traceback.format_exc()
        log.error("worker %d failed:\n%s", index, tb)
        with contextlib.suppress(Exception):  # the job master notices the exit anyway
            worker.send(("failed", index, tb))
        os._exit(1)
    os._exit(0)


class Worker:
    """``secret``: the job secret (:mod:`runtime.network.auth`) its channels authenticate with;
    ``host``: the address its channel server listens on (and peers connect to)."""

    def __init__(self, index: int, conn: Connection, secret: bytes, host: str = "127.0.0.1") -> None:
        self.index = index
        self.conn = conn
        self.secret = secret
        self.host = host
        self._send_lock = threading.Lock()
        self.mailbox: deque[tuple[Any, ...]] = deque()
        self.wake = threading.Event()
        self.tasks: list[Task] = []
        self.stopping = False
        self._async: dict[int, list[PendingSnapshot]] = {}
        self._async_lock = threading.Lock()
        self._inflight = 0  # asynchronous parts not finished (pending.result() may still run)
        self._adopt_now = False  # adopt the newest materialization at the next chance ("adopt")
        self.strategy_bytes = 0  # written by the job's snapshot strategy (JobConfig.snapshot_strategy)
        self.pool = cf.ThreadPoolExecutor(2, thread_name_prefix="snapshot")
        self._errors: deque[str] = deque()

    # -- messages ------------------------------------------------------------------------------

    def send(self, msg: tuple[Any, ...]) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def _read_control(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == "lease":  # not queued: a task may wait for it in a write
                    self.grant.update(msg[1])
                    continue
                self.mailbox.append(msg)
                self.wake.set()
        except (EOFError, OSError):
            if not self.stopping:  # stopped: the job master closed the connection after "stopped"
                os._exit(3)  # the job master is gone: nothing may continue

    def channel_error(self, message: str) -> None:
        if not self.stopping:
            self._errors.append(message)
            self.wake.set()

    # -- setup ---------------------------------------------------------------------------------

    def main(self) -> None:
        self.server = ChannelServer(self.channel_error, self.secret, self.host)
        self.send(("ready", self.index, self.server.address, os.getpid()))
        msg = self.conn.recv()
        if msg[0] == "stop":
            return
        assert msg[0] == "deploy", msg
        self.deployed_at = time.monotonic()
        self.deploy(msg[1])
        threading.Thread(target=self._read_control, name="control", daemon=True).start()
        self.send(("running", self.index))
        self.run()

    def deploy(self, spec: dict[str, Any]) -> None:
        """Open the job root, resolve the checkpoint to restore and build this worker's tasks
        (:mod:`runtime.worker.deploy`), then open them (each task opens its chain downstream first)."""
        self.config: JobConfig = pickle.loads(spec["config"])  # by value: runtime.cluster.master.serialize_config
        self.run_id: str = spec["run_id"]
        self.attempt: int = spec["attempt"]
        self.batch_size = self.config.batch_size
        graph: JobGraph = pickle.loads(spec["graph"])
        cfg = self.config
        self.grant = LeaseGrant(cfg.state_root, spec["lease_valid_until"], cfg.writer_lease_ttl_s)
        self.job = StateJob(
            cfg.state_root,
            max_parallelism=cfg.max_parallelism,
            store_options=cfg.store_options,
            writer_options=cfg.writer_options,
            retain_checkpoints=cfg.retain_checkpoints,
            create=False,
            writer_lease=False,  # the master holds the root's writer lease and publishes
            write_guard=self.grant.check,  # ... and grants its workers writes while it is valid
            on_demand_restore=cfg.on_demand_restore,
            state_store=cfg.state_store,
            state_memory=cfg.state_memory,
            state_dir=cfg.state_dir,
            local_copies=cfg.local_copies,
        )
        self.restore_meta: CheckpointMetadata | None = self.job.resolve_checkpoint(spec["restore"])
        self.tasks = build_tasks(self, graph, spec["peers"], spec["assignments"])
        for t in self.tasks:
            t.open()

    # -- the task thread -----------------------------------------------------------------------

    def run(self) -> None:
        next_timers = next_adopt = time.monotonic()
        wake, mailbox = self.wake, self.mailbox
        switch_interval, fast_switch = sys.getswitchinterval(), False
        # time to the first record and to every key group loaded, reported once after a restore
        first_record_s: float | None = None
        restoring = self.restore_meta is not None
        while not self.stopping:
            wake.clear()
            while mailbox:
                self._handle(mailbox.popleft())
                if self.stopping:
                    return
            if self._errors:
                raise ChannelError(self._errors.popleft())
            progressed = False
            for t in self.tasks:
                if t.step():
                    progressed = True
            if restoring:
                if progressed and first_record_s is None:
                    first_record_s = time.monotonic() - self.deployed_at
                if self.job.loading:
                    self.job.poll_loading()  # install what the background loader prepared
                elif first_record_s is not None:
                    restoring = False
                    self.send(("restored", self.index, {
                        "first_record_s": round(first_record_s, 4),
                        "fully_loaded_s": round(time.monotonic() - self.deployed_at, 4),
                        **self._copy_stats(),
                    }))  # fmt: skip
            if self._inflight:
                # an asynchronous part waits for the changelog writer's flusher (or the snapshot
                # pool): hand it the GIL between two steps, and within a step after a short
                # switch interval: the flusher releases the GIL in every pyarrow call and
                # zstd run, and each time waits for this thread to hand it back
                if not fast_switch:
                    fast_switch = True
                    sys.setswitchinterval(ASYNC_SWITCH_INTERVAL_S)
                time.sleep(0)
            elif fast_switch:
                fast_switch = False
                sys.setswitchinterval(switch_interval)
            now = time.monotonic()
            if now >= next_timers:
                next_timers = now + TIMERS_EVERY_S
                now_ms = int(time.time() * 1000)
                for t in self.tasks:
                    t.on_processing_time(now_ms)
            if (now >= next_adopt or self._adopt_now) and not self._inflight:
                # never while an asynchronous part runs: adoption forgets the changelog segments
                # the new base covers, which a pending snapshot's handle may still list
                next_adopt = now + ADOPT_EVERY_S
                self.job.adopt_latest_materialization(max_age_s=0.0 if self._adopt_now else None)
                self._adopt_now = False
            if not progressed:
                wake.wait(IDLE_WAIT_S)

    def _copy_stats(self) -> dict[str, int]:
        """What the restore read from local copies and from the store (with local_copies)."""
        copies = self.job.local_copies
        if copies is None:
            return {}
        st = copies.stats
        return {"objects_local": st.hits, "objects_remote": st.misses, "bytes_local": st.bytes_local,
                "bytes_remote": st.bytes_remote, "copies_dropped": st.dropped}  # fmt: skip

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "trigger":
            cid = msg[1]
            # the barriers take a while to reach the keyed operators (alignment included):
            # upload what is buffered meanwhile, so that their snapshots wait for less
            self.job.flush_soon()
            for t in self.tasks:
                if t.source is not None:
                    t.checkpoint(cid)
        elif kind == "adopt":  # before the final checkpoint: build on the newest materialization now
            if self._inflight:
                self._adopt_now = True
            else:
                self.job.adopt_latest_materialization(max_age_s=0.0)
        elif kind == "complete":
            cid = msg[1]
            for t in self.tasks:
                t.checkpoint_complete(cid)
        elif kind == "abort":
            for t in self.tasks:
                t.abort_checkpoint(msg[1])
            with self._async_lock:
                pendings = self._async.pop(msg[1], [])
            for p in pendings:
                p.cancel()
        elif kind == "stop":
            self.stop()
        else:
            raise RuntimeError(f"unknown control message {kind!r}")

    def stop(self) -> None:
        self.stopping = True
        for t in self.tasks:
            t.router.close()
            t.close()
        self.server.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.job.close(flush=False)
        self.send(("stopped", self.index))

    # -- asynchronous part of checkpoints ------------------------------------------------------

    def hold_async(self) -> None:
        """Pending snapshots exist (unaligned: between the first and the last barrier): no
        materialization may be adopted meanwhile."""
        with self._async_lock:
            self._inflight += 1

    def release_async(self) -> None:
        with self._async_lock:
            self._inflight -= 1

    def acknowledge_async(
        self,
        checkpoint_id: int,
        task: str,
        pending: list[PendingSnapshot],
        sources: dict[str, Any] | None,
        stats: dict[str, Any],
        *,
        blob: tuple[str, bytes] | None = None,
        held: bool = False,
    ) -> None:
        """Run the asynchronous part of ``checkpoint_id`` at ``task`` and acknowledge it.

        ``blob``: an object (in-flight data of an unaligned checkpoint) written under the job
        root before the acknowledgement. ``held``: the caller already counted the pending
        snapshots with :meth:`hold_async` (unaligned: from the first barrier on)."""
        if pending:
            with self._async_lock:
                self._async.setdefault(checkpoint_id, []).extend(pending)
                if not held:
                    self._inflight += 1
        stats["bytes_uploaded"] = self.job.writer.bytes_uploaded + self.strategy_bytes if pending else 0
        stats["worker"] = self.index
        if self.job.local_copies is not None:
            stats["local_copies"] = self.job.local_copies.figures()
        timeout = self.config.checkpoint_timeout_s
        started = time.monotonic()

        def finish() -> None:
            try:
                if blob is not None:
                    self.job.store.put(*blob)
                handles = [p.result(timeout) for p in pending]
                written = sum(p.nbytes for p in pending) if self.config.snapshot_strategy is not None else 0
                with self._async_lock:  # counted once the asynchronous part wrote its objects
                    self.strategy_bytes += written
                    stats["bytes_uploaded"] = self.job.writer.bytes_uploaded + self.strategy_bytes
            except Exception as e:  # noqa: BLE001 - declined, the coordinator decides
                self.send(("decline", checkpoint_id, task, f"{type(e).__name__}: {e}"))
                return
            finally:
                with self._async_lock:
                    left = [p for p in self._async.get(checkpoint_id, []) if p not in pending]
                    if left:
                        self._async[checkpoint_id] = left
                    else:
                        self._async.pop(checkpoint_id, None)
                    if pending:
                        self._inflight -= 1
            stats["async_ms"] = (time.monotonic() - started) * 1000
            self.send(("ack", checkpoint_id, task, handles, sources, stats))

        if pending or blob is not None:
            self.pool.submit(finish)
        else:
            stats["async_ms"] = 0.0
            self.send(("ack", checkpoint_id, task, [], sources, stats))
