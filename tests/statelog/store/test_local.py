"""LocalObjectStore: the durability path, temp files, directories, concurrency."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest

from statelog.errors import ConfigError, ObjectExistsError, StoreError
from statelog.store import open_store
from statelog.store.local import TEMP_PREFIX, LocalObjectStore


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "root")


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_objects_are_plain_files_under_the_root(store: LocalObjectStore) -> None:
    store.put("changelog/000001.seg", b"data")
    assert (store.root / "changelog" / "000001.seg").read_bytes() == b"data"
    assert repr(store) == f"LocalObjectStore({store.root.as_uri()!r})"


def test_put_leaves_no_temp_files(store: LocalObjectStore) -> None:
    for i in range(5):
        store.put(f"d/{i}", b"x" * i)
        store.put(f"d/{i}", b"x" * i)  # idempotent retry path
        with pytest.raises(ObjectExistsError):
            store.put(f"d/{i}", b"y")  # conflict path
    assert all_files(store.root) == [f"d/{i}" for i in range(5)]


def test_put_durability_sequence(store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """write+fsync the temp file, link it (no overwrite), unlink temp, fsync directories."""
    events: list[tuple[str, str]] = []
    me = threading.get_ident()  # os is patched process-wide: other threads' calls pass through
    real_fsync, real_link, real_unlink, real_open = os.fsync, os.link, os.unlink, os.open
    fd_paths: dict[int, str] = {}

    def fsync(fd: int) -> None:
        if threading.get_ident() == me:
            events.append(("fsync", fd_paths.get(fd, "?")))
        real_fsync(fd)

    def open_(path: str, flags: int, *args: int) -> int:
        fd = real_open(path, flags, *args)
        if threading.get_ident() != me:
            return fd
        is_temp = os.path.basename(path).startswith(TEMP_PREFIX)
        fd_paths[fd] = "tmp" if is_temp else f"dir:{os.path.relpath(path, store.root.parent)}"
        return fd

    def link(src: str, dst: str) -> None:
        if threading.get_ident() != me:
            return real_link(src, dst)
        assert os.path.basename(src).startswith(TEMP_PREFIX)
        assert os.path.dirname(src) == os.path.dirname(dst)
        events.append(("link", os.path.relpath(dst, store.root)))
        real_link(src, dst)

    def unlink(path: str) -> None:
        if threading.get_ident() != me:
            return real_unlink(path)
        events.append(("unlink", "tmp" if TEMP_PREFIX in path else path))
        real_unlink(path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "open", open_)
    store.put("a/b", b"payload")
    # New directories: root, root/a; each new entry's parent directory is fsynced.
    assert events == [
        ("fsync", "dir:."),
        ("fsync", "dir:root"),
        ("fsync", "tmp"),
        ("link", "a/b"),
        ("unlink", "tmp"),
        ("fsync", "dir:root/a"),
    ]


def test_crash_leftover_temp_files_are_never_listed(store: LocalObjectStore) -> None:
    store.put("seg/1", b"one")
    # A crash between writing the temp file and linking it leaves this behind.
    fd, _ = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=store.root / "seg")
    os.write(fd, b"partial")
    os.close(fd)
    (store.root / f"{TEMP_PREFIX}dir").mkdir()
    (store.root / f"{TEMP_PREFIX}dir" / "x").write_bytes(b"")
    assert [i.key for i in store.list()] == ["seg/1"]
    store.put("seg/2", b"two")
    assert [i.key for i in store.list("seg/")] == ["seg/1", "seg/2"]


def test_temp_prefix_is_reserved_in_keys(store: LocalObjectStore) -> None:
    with pytest.raises(ConfigError, match="reserves for temporary files"):
        store.put(f"a/{TEMP_PREFIX}x", b"")
    with pytest.raises(ConfigError):
        store.get(f"{TEMP_PREFIX}x/y")


def test_directories_are_not_objects(store: LocalObjectStore) -> None:
    store.put("p/q/r", b"1")
    assert store.head("p/q") is None
    assert store.list("p/q/") is not None
    with pytest.raises(StoreError, match="both an object and a prefix"):
        store.put("p/q", b"2")  # p/q is a directory
    with pytest.raises(StoreError, match="both an object and a prefix"):
        store.put("p/q/r/s", b"3")  # p/q/r is an object
    store.delete("p/q")  # a prefix: nothing to delete, not an error
    assert store.get("p/q/r") == b"1"


def test_delete_prunes_empty_directories(store: LocalObjectStore) -> None:
    store.put("x/y/z/1", b"1")
    store.put("x/keep", b"k")
    store.delete("x/y/z/1")
    assert not (store.root / "x" / "y").exists()
    assert (store.root / "x" / "keep").exists()
    assert store.root.is_dir()
    store.delete("x/keep")
    assert store.root.is_dir() and list(store.root.iterdir()) == []


def test_put_recreates_a_directory_pruned_concurrently(store: LocalObjectStore) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn(n: int) -> None:
        try:
            i = 0
            while not stop.is_set():
                store.put(f"hot/dir/{n}-{i}", b"v")
                assert store.get(f"hot/dir/{n}-{i}") == b"v"
                store.delete(f"hot/dir/{n}-{i}")
                i += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    threading.Event().wait(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []


def test_concurrent_puts_with_different_bytes_have_one_winner(store: LocalObjectStore) -> None:
    results: dict[int, str] = {}

    def put(i: int) -> None:
        try:
            store.put("contended", f"writer {i}".encode())
            results[i] = "ok"
        except ObjectExistsError:
            results[i] = "exists"

    threads = [threading.Thread(target=put, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if r == "ok"]
    assert len(winners) == 1
    assert store.get("contended") == f"writer {winners[0]}".encode()
    assert all_files(store.root) == ["contended"]


def test_get_range_reads_large_objects_in_chunks(store: LocalObjectStore) -> None:
    data = os.urandom(3 * (1 << 20) + 17)
    store.put("big", data)
    assert store.get_range("big", 5, len(data)) == data[5:]
    assert store.get_range("big", -(1 << 20), 1 << 21) == data[-(1 << 20) :]


def test_put_requires_bytes(store: LocalObjectStore) -> None:
    with pytest.raises(TypeError, match="needs bytes"):
        store.put("k", "text")  # type: ignore[arg-type]
    store.put("mv", memoryview(b"abc"))
    assert store.get("mv") == b"abc"


def test_os_errors_become_store_errors_naming_the_key(
    store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statelog.store.local as local_module

    store.put("locked", b"x")

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(local_module, "open", refuse, raising=False)
    with pytest.raises(
        StoreError, match="could not read object 'locked'.*Permission denied"
    ) as info:
        store.get("locked")
    assert info.value.key == "locked"


def test_open_store_file_url_roundtrip(tmp_path: Path) -> None:
    store = open_store((tmp_path / "job").as_uri())
    store.put("k", b"v")
    assert open_store(str(tmp_path / "job")).get("k") == b"v"
