"""Checks of a job root after each SIGKILL of a crash loop (``tests/e2e/test_crash.py``,
``tests/e2e/test_materializer_crash.py``): every listed checkpoint complete and unchanged,
restores equal to the reference model (``tests.support.crash_ops``)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import statelog
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import JobNotFoundError
from statelog.layout import checkpoint_key
from tests.support.crash_ops import OPERATOR_UID, ModelReplay
from tests.support.crash_worker import DISK_CACHE_ENTRIES
from tests.support.harness import (
    Model,
    assert_state_equal,
    backend_timers,
    backend_view,
    register_all,
)


@dataclass
class CrashStats:
    kills: int = 0
    kills_with_checkpoint: int = 0  # a completed checkpoint was listed after the kill
    kills_before_ready: int = 0  # during startup / restore
    kills_in_two_phase: int = 0  # after SNAP, before the publish
    kills_in_two_phase_published: int = 0  # ... of which the metadata was written already
    kills_in_one_call: int = 0  # after BEGIN, before CHECKPOINT was announced
    checkpoints_announced: int = 0
    restores_compared: int = 0
    older_restores_compared: int = 0
    segments_verified: int = 0
    checkpoints_past_seal: int = 0  # last segment holds records after the seal (filtered)
    latest_offsets: list[int] = field(default_factory=list)
    seconds: float = 0.0
    startup_seconds: float = 0.0  # from spawn to READY, summed
    check_seconds: float = 0.0  # checks after the kills, summed


class CrashChecker:
    """Checks the job root after each kill against everything seen so far."""

    def __init__(self, root: str, options: Mapping[str, Any], seed: int) -> None:
        self.root = root
        self.options = dict(options)
        self.seed = seed
        self.disk = False  # restores into the disk-backed working set
        self.replay = ModelReplay(seed)
        self.rng = random.Random(seed + 17)
        self.digests: dict[int, str] = {}  # checkpoint id -> sha256 of its metadata object
        self.verified: dict[str, int] = {}  # segment name -> size, verified byte for byte
        self.past_seal: set[int] = set()  # checkpoints whose last segment goes past the seal
        self.announced: dict[int, int] = {}  # id -> offset of announced (or sealed) checkpoints
        self.begun: set[int] = set()  # offsets of one-call checkpoints that were started
        self.stats = CrashStats()

    # -- after a kill ---------------------------------------------------------------------

    def after_kill(self, lines: list[str]) -> None:
        st = self.stats
        st.kills += 1
        done: list[tuple[int, int]] = []
        last_snap: tuple[int, int] | None = None
        last_begin: int | None = None
        for line in lines:
            word, *rest = line.split()
            if word == "CHECKPOINT":
                cid, off = int(rest[0]), int(rest[1])
                done.append((cid, off))
                self.announced[cid] = off
                last_snap = last_begin = None
            elif word == "SNAP":
                last_snap = (int(rest[0]), int(rest[1]))
                self.announced[last_snap[0]] = last_snap[1]
            elif word == "BEGIN":
                last_begin = int(rest[0])
                self.begun.add(last_begin)
        st.checkpoints_announced += len(done)
        if not any(line.startswith("READY") for line in lines):
            st.kills_before_ready += 1

        ids, metas = self.check_listing()
        if ids:
            st.kills_with_checkpoint += 1
        if last_snap is not None:
            st.kills_in_two_phase += 1
            st.kills_in_two_phase_published += last_snap[0] in ids
        if last_begin is not None:
            st.kills_in_one_call += 1

        # what the worker announced as published is there (unless retention removed it)
        if done:
            newest = max(cid for cid, _ in done)
            assert ids and (newest in ids or newest < ids[0]), (
                f"checkpoint {newest} was announced as published but is not listed: {ids}"
            )
            for cid, off in done:
                if cid in metas:
                    assert metas[cid].sources["offset"] == off, (cid, metas[cid].sources, off)

        if not ids:
            return
        latest = metas[ids[-1]]
        offset = int(latest.sources["offset"])
        if st.latest_offsets:
            assert offset >= st.latest_offsets[-1], (
                f"the latest checkpoint went back from offset {st.latest_offsets[-1]} to {offset}"
            )
        st.latest_offsets.append(offset)
        self.compare_restore(latest)
        st.restores_compared += 1
        if len(ids) > 1:
            self.compare_restore(metas[self.rng.choice(ids[:-1])])
            st.older_restores_compared += 1

    def check_listing(self) -> tuple[list[int], dict[int, CheckpointMetadata]]:
        """Every listed checkpoint is complete, unchanged and one the worker produced."""
        try:
            job = statelog.open(self.root, store_options=self.options, create=False)
        except JobNotFoundError:
            return [], {}
        try:
            ids = job.catalog.checkpoint_ids()
            metas: dict[int, CheckpointMetadata] = {}
            reader = SegmentReader(job.store)
            prev_offset = -1
            for cid in ids:
                data = job.store.get(checkpoint_key(cid))
                digest = hashlib.sha256(data).hexdigest()
                assert self.digests.setdefault(cid, digest) == digest, (
                    f"checkpoint {cid} metadata changed after it was listed"
                )
                meta = job.load_checkpoint(cid)  # verifies the checksum
                metas[cid] = meta
                assert meta.checkpoint_id == cid and meta.job_id == job.job_id
                assert set(meta.sources) == {"offset"}, meta.sources
                off = meta.sources["offset"]
                assert type(off) is int and off > prev_offset, (cid, off, prev_offset)
                prev_offset = off
                assert self.announced.get(cid) == off or off in self.begun, (
                    f"checkpoint {cid} at offset {off} is listed, but the worker never started "
                    f"a checkpoint with that id and offset (announced: {self.announced.get(cid)})"
                )
                assert set(meta.operators) == {OPERATOR_UID}, meta.operators
                self.check_segments(meta, reader)
            return ids, metas
        finally:
            job.close()

    def check_segments(self, meta: CheckpointMetadata, reader: SegmentReader) -> None:
        for handle in meta.operators[OPERATOR_UID].subtasks:
            for rng in handle.changelog:
                segs = sorted(rng.segments, key=lambda s: s.start)
                assert rng.end > rng.start and segs, (meta.checkpoint_id, rng)
                assert segs[0].start <= rng.start and segs[-1].end >= rng.end, (
                    meta.checkpoint_id,
                    rng,
                )
                if segs[-1].end > rng.end and meta.checkpoint_id not in self.past_seal:
                    self.past_seal.add(meta.checkpoint_id)
                    self.stats.checkpoints_past_seal += 1
                for a, b in zip(segs, segs[1:], strict=False):
                    assert a.end == b.start, f"gap between segments {a} and {b} of {rng.stream}"
                for seg in segs:
                    known = self.verified.get(seg.name)
                    if known is None:
                        footer = reader.verify_segment(seg.name, seg.size)
                        spans = {s.stream: s for s in footer.streams}
                        span = spans.get(rng.stream)
                        assert span is not None and (span.start, span.end) == (
                            seg.start,
                            seg.end,
                        ), (
                            f"segment {seg.name} does not hold records {seg.start}..{seg.end} of "
                            f"{rng.stream}: {footer.streams}"
                        )
                        self.verified[seg.name] = seg.size
                        self.stats.segments_verified += 1
                    else:
                        assert known == seg.size, (seg, known)

    def compare_restore(self, meta: CheckpointMetadata) -> None:
        offset = int(meta.sources["offset"])
        job = statelog.open(
            self.root, store_options=self.options, create=False, state_store="disk" if self.disk else "memory"
        )
        if self.disk:
            job.state_cache_entries = DISK_CACHE_ENTRIES
        try:
            backend = job.backend(OPERATOR_UID, restore=meta, changelog=False, clock=lambda: offset)
            states = register_all(backend)
            model = self.replay.model_at(offset)
            try:
                assert_state_equal(backend, states, model, offset)
            except AssertionError:
                raise AssertionError(
                    f"checkpoint {meta.checkpoint_id} (offset {offset}) does not restore to the "
                    f"model (ops [0, {offset}) of seed {self.seed}):\n"
                    + describe_diff(backend, states, model, offset)
                ) from None
        finally:
            job.close()


def describe_diff(
    backend: Any, states: dict[str, Any], model: Model, now: int, limit: int = 5
) -> str:
    """What differs between a restored backend and the model, a few entries per state."""
    out = []
    got, want = backend_view(backend, states), model.visible(now)
    for name in want:
        g, w = got[name], want[name]
        diff = [(k, g.get(k, "<absent>"), w.get(k, "<absent>")) for k in g.keys() | w.keys()]
        diff = [d for d in diff if d[1] != d[2]]
        if diff:
            shown = "; ".join(f"{k!r}: got {a!r}, want {b!r}" for k, a, b in diff[:limit])
            out.append(f"  state {name!r}: {len(diff)} entries differ, e.g. {shown}")
    timers = backend_timers(backend)
    if timers != model.timers:
        extra, missing = (
            sorted(timers - model.timers, key=repr),
            sorted(model.timers - timers, key=repr),
        )
        out.append(f"  timers: unexpected {extra[:limit]}, missing {missing[:limit]}")
    return "\n".join(out) or "  (no difference found by describe_diff)"
