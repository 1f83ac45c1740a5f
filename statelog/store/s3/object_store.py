"""An :class:`~statelog.store.base.ObjectStore` on any S3-compatible server, via ``minio``.

Key ``k`` is stored as object ``<prefix>/k`` in the bucket. Reads, listing and deletes are
here; the connection (set-up, bucket check, retries, error mapping) is
:class:`~statelog.store.s3.connection.S3Connection`, the writes
:class:`~statelog.store.s3.writes.S3Writes`.

Listing returns keys sorted, whatever the server's order (SeaweedFS lists directory by
directory, which is not key order), so a listing is collected before it is yielded.
"""

from __future__ import annotations

from collections.abc import Iterator

from minio.error import S3Error

from statelog.errors import ObjectNotFoundError
from statelog.store.base import ObjectInfo, ObjectStore
from statelog.store.s3.writes import S3Writes
from statelog.store.validation import validate_prefix, validate_range


class S3ObjectStore(S3Writes, ObjectStore):
    """Write-once objects in ``bucket`` below ``prefix`` on an S3-compatible server."""

    def reopen(self) -> S3ObjectStore:
        return S3ObjectStore(self.bucket, self.prefix, self.config)

    def get(self, key: str) -> bytes:
        name = self._object_name(key)
        return self._call("get", key, lambda: self._read(name))

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        validate_range(key, offset, length)
        name = self._object_name(key)

        def do_range() -> bytes:
            start = offset
            if length == 0 or (offset < 0 and length < -offset):
                stat = self._stat(name)
                if stat is None:
                    raise ObjectNotFoundError(f"object {key!r} not found in {self.url}", key=key)
                if length == 0:
                    return b""
                start = max(0, stat.size + offset)
            spec = f"bytes={offset}" if start < 0 else f"bytes={start}-{start + length - 1}"
            resp = None
            try:
                resp = self._client.get_object(self.bucket, name, request_headers={"Range": spec})
                data = resp.read()
                if resp.status == 200:  # the server ignored the Range header
                    begin = start if start >= 0 else max(0, len(data) + start)
                    return data[begin : begin + length]
                return data[:length]
            except S3Error as exc:
                if exc.code == "InvalidRange" or (exc.response and exc.response.status == 416):
                    return b""  # the object exists but the range starts at or after its end
                raise
            finally:
                if resp is not None:
                    resp.close()
                    resp.release_conn()

        return self._call("get_range", key, do_range)

    def head(self, key: str) -> ObjectInfo | None:
        name = self._object_name(key)

        def do_head() -> ObjectInfo | None:
            stat = self._stat(name)
            if stat is None or getattr(stat, "is_dir", False):
                return None
            mtime = stat.last_modified.timestamp() if stat.last_modified else 0.0
            return ObjectInfo(key=key, size=stat.size or 0, mtime=mtime)

        return self._call("head", key, do_head)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""

        def do_list() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            for obj in self._client.list_objects(self.bucket, prefix=base + prefix, recursive=True):
                name = obj.object_name or ""
                if obj.is_dir or name.endswith("/") or not name.startswith(base):
                    continue
                mtime = obj.last_modified.timestamp() if obj.last_modified else 0.0
                found.append(ObjectInfo(key=name[len(base) :], size=obj.size or 0, mtime=mtime))
            found.sort(key=lambda info: info.key)
            return found

        return iter(self._call("list", prefix or None, do_list))

    def delete(self, key: str) -> None:
        name = self._object_name(key)
        self._call("delete", key, lambda: self._client.remove_object(self.bucket, name))
