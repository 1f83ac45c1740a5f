"""``ObjectStore.put_if_absent``: atomic create-if-absent on file:// and on real SeaweedFS."""

from __future__ import annotations

import io
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest
import urllib3

from statelog.errors import ConfigError, StoreError, TransientStoreError
from statelog.store import ObjectStore, open_store
from statelog.store.s3.object_store import S3ObjectStore
from statelog.testing import FaultInjectingStore
from tests.support.s3server import RootSpec, S3Server

FAST_RETRY = {"max_attempts": 3, "base_delay": 0.001, "max_delay": 0.002}


def race(store: ObjectStore, key: str, writers: int) -> list[tuple[int, bool]]:
    """``writers`` threads call put_if_absent on one key at once; (writer, created) each."""
    barrier = threading.Barrier(writers)
    results: list[tuple[int, bool]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        try:
            barrier.wait()
            created = store.put_if_absent(key, f"writer-{i}".encode())
            with lock:
                results.append((i, created))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_created_once_then_false(store_root: RootSpec) -> None:
    with store_root.open() as store:
        assert store.put_if_absent("lease/a.json", b"first") is True
        assert store.get("lease/a.json") == b"first"
        assert store.put_if_absent("lease/a.json", b"second") is False
        assert store.put_if_absent("lease/a.json", b"first") is False  # same bytes: still False
        assert store.get("lease/a.json") == b"first"
        assert [i.key for i in store.list("lease/")] == ["lease/a.json"]
        assert store.put_if_absent("lease/b.json", bytearray(b"")) is True
        assert store.get("lease/b.json") == b""


def test_put_and_put_if_absent_share_the_write_once_rule(store_root: RootSpec) -> None:
    with store_root.open() as store:
        store.put("k", b"x")
        assert store.put_if_absent("k", b"y") is False
        assert store.put_if_absent("k2", b"y") is True
        store.put("k2", b"y")  # identical bytes: the idempotent put is a no-op


def test_rejects_non_bytes_and_bad_keys(store_root: RootSpec) -> None:
    with store_root.open() as store:
        with pytest.raises(TypeError, match="put_if_absent"):
            store.put_if_absent("k", "text")  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            store.put_if_absent("../escape", b"x")


# SeaweedFS serialises conditional PUTs on one key with a lock whose waiters retry about
# once a second, so a many-way race costs seconds there; the local store takes many more.
WRITERS = {"file": (12, 4), "s3": (4, 2)}  # (writers, rounds)


def test_thread_race_has_exactly_one_winner(store_root: RootSpec) -> None:
    writers, rounds = WRITERS["s3" if store_root.url.startswith("s3://") else "file"]
    with store_root.open() as store:
        for r in range(rounds):
            key = f"race/{r}/deep/er/key.json"  # fresh directories on the local store
            results = race(store, key, writers=writers)
            winners = [i for i, created in results if created]
            assert len(results) == writers and len(winners) == 1, results
            assert store.get(key) == f"writer-{winners[0]}".encode()


def _process_writer(
    url: str, options: dict[str, Any], key: str, i: int, barrier: Any, out: Any
) -> None:
    store = open_store(url, options)
    barrier.wait()
    out.put((i, store.put_if_absent(key, f"proc-{i}".encode())))


def test_process_race_has_exactly_one_winner(store_root: RootSpec) -> None:
    ctx = multiprocessing.get_context("fork")
    writers = 6 if store_root.url.startswith("file:") else 3
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [
        ctx.Process(
            target=_process_writer,
            args=(store_root.url, dict(store_root.options), "p/key", i, barrier, out),
        )
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=20) for _ in range(writers)]
    for p in procs:
        p.join(timeout=20)
        assert p.exitcode == 0
    winners = [i for i, created in results if created]
    assert len(winners) == 1, results
    with store_root.open() as store:
        assert store.get("p/key") == f"proc-{winners[0]}".encode()


def test_local_key_that_is_a_prefix_is_an_error(file_root: RootSpec) -> None:
    with file_root.open() as store:
        store.put("a/b", b"x")
        with pytest.raises(StoreError, match="prefix"):
            store.put_if_absent("a", b"y")
        with pytest.raises(StoreError, match="parent of it is an object"):
            store.put_if_absent("a/b/c", b"y")


def test_local_leaves_no_temp_files(file_root: RootSpec, tmp_path: Any) -> None:
    with file_root.open() as store:
        store.put_if_absent("d/k", b"1")
        store.put_if_absent("d/k", b"2")
    names = [p.name for p in (tmp_path / "root" / "d").iterdir()]
    assert names == ["k"]


# -- S3 specifics ---------------------------------------------------------------------------


def s3_store(s3_server: S3Server, root: RootSpec) -> S3ObjectStore:
    store = open_store(root.url, s3_server.options(retry=FAST_RETRY))
    assert isinstance(store, S3ObjectStore)
    return store


def patch_put(
    monkeypatch: pytest.MonkeyPatch, store: S3ObjectStore, wrapper: Callable[..., None]
) -> list[int]:
    """Wrap the conditional PUT; returns a list that counts the calls."""
    real = store._conditional_put
    calls: list[int] = []

    def patched(name: str, data: bytes) -> None:
        calls.append(1)
        wrapper(len(calls), real, name, data)

    monkeypatch.setattr(store, "_conditional_put", patched)
    return calls


@pytest.mark.s3
def test_seaweedfs_honours_if_none_match(
    s3_server: S3Server, s3_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skip the pre-stat so the conditional PUT itself meets the existing object: 412."""
    with s3_store(s3_server, s3_root) as store:
        store.put("k", b"original")
        monkeypatch.setattr(store, "_stat", lambda name: None)
        assert store.put_if_absent("k", b"intruder") is False
        monkeypatch.undo()
        assert store.get("k") == b"original"


@pytest.mark.s3
def test_retry_after_lost_answer_reports_created(
    s3_server: S3Server, s3_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first PUT lands but its answer is lost; the retry meets its own object."""

    def lose_first_answer(
        n: int, real: Callable[[str, bytes], None], name: str, data: bytes
    ) -> None:
        real(name, data)
        if n == 1:
            raise urllib3.exceptions.ProtocolError("connection reset after the request")

    with s3_store(s3_server, s3_root) as store:
        calls = patch_put(monkeypatch, store, lose_first_answer)
        assert store.put_if_absent("k", b"mine") is True
        assert len(calls) == 1  # the retry found the object by its stat: no second PUT
        assert store.get("k") == b"mine"


@pytest.mark.s3
def test_retry_after_lost_answer_412_path(
    s3_server: S3Server, s3_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same, but the retry's stat misses (stale) and its PUT gets 412: still ours."""

    def lose_first_answer(
        n: int, real: Callable[[str, bytes], None], name: str, data: bytes
    ) -> None:
        real(name, data)
        if n == 1:
            raise urllib3.exceptions.ProtocolError("connection reset after the request")

    with s3_store(s3_server, s3_root) as store:
        calls = patch_put(monkeypatch, store, lose_first_answer)
        real_stat = store._stat
        stats: list[int] = []

        def stale_stat(name: str) -> Any:
            stats.append(1)
            return None if len(stats) <= 2 else real_stat(name)

        monkeypatch.setattr(store, "_stat", stale_stat)
        assert store.put_if_absent("k", b"mine") is True
        assert len(calls) == 2  # second PUT answered 412, then the content matched


@pytest.mark.s3
def test_retry_finds_someone_elses_object(
    s3_server: S3Server, s3_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our PUT never reached the server; meanwhile another writer created the key."""
    raw = s3_server.raw_client()

    with s3_store(s3_server, s3_root) as store:

        def fail_before_sending(
            n: int, real: Callable[[str, bytes], None], name: str, data: bytes
        ) -> None:
            if n == 1:
                raw.put_object(s3_server.bucket, name, io.BytesIO(b"theirs"), 6)
                raise urllib3.exceptions.ProtocolError("connection reset before the request")
            real(name, data)

        patch_put(monkeypatch, store, fail_before_sending)
        assert store.put_if_absent("k", b"mine") is False
        assert store.get("k") == b"theirs"


@pytest.mark.s3
def test_errors_go_through_the_retry_layer(
    s3_server: S3Server, s3_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    def always_reset(n: int, real: Callable[[str, bytes], None], name: str, data: bytes) -> None:
        raise urllib3.exceptions.ProtocolError("connection reset")

    with s3_store(s3_server, s3_root) as store:
        calls = patch_put(monkeypatch, store, always_reset)
        with pytest.raises(TransientStoreError, match=r"put_if_absent .* failed after 3 attempt"):
            store.put_if_absent("k", b"x")
        assert len(calls) == 3


# -- fault injection ------------------------------------------------------------------------


def test_faulty_store_passes_through_and_injects(file_root: RootSpec) -> None:
    store = FaultInjectingStore(file_root.open())
    store.fail_next("put_if_absent", 1, key_prefix="lease/")
    with pytest.raises(TransientStoreError, match="injected put_if_absent failure"):
        store.put_if_absent("lease/x", b"1")
    assert store.inner.head("lease/x") is None  # failed before the inner call
    assert store.put_if_absent("lease/x", b"1") is True
    assert store.put_if_absent("lease/x", b"2") is False
    crashed: list[str] = []
    store.after("put_if_absent", lambda op, key: crashed.append(key))
    assert store.put_if_absent("lease/y", b"1") is True
    assert crashed == ["lease/y"]
    assert store.calls["put_if_absent"] == 4 and store.injected["put_if_absent"] == 1
