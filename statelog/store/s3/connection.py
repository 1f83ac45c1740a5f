"""The connection to an S3-compatible server: the HTTP pool, the minio client, the bucket check.

Every call goes through :func:`~statelog.store.retry.call_with_retry`; the HTTP pool itself
never retries (``retries=False``) so there is exactly one retry layer and one place that
logs it. A failure is mapped to a statelog error by
:func:`~statelog.store.s3.error_mapping.translate_error`. The bucket and the credentials
are checked once, before the first operation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from statelog.errors import ConfigError, StatelogError
from statelog.store.retry import call_with_retry
from statelog.store.s3.config import S3Config
from statelog.store.s3.error_mapping import bucket_not_found, translate_error
from statelog.store.validation import validate_key

T = TypeVar("T")


class S3Connection:
    """``bucket`` below ``prefix`` on the server of ``config``: calls with retries and errors mapped.

    The base of :class:`~statelog.store.s3.object_store.S3ObjectStore`; its ``repr`` and
    ``url`` show no secret.
    """

    def __init__(self, bucket: str, prefix: str = "", config: S3Config | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.config = config or S3Config.from_options()
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        cfg = self.config
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=cfg.connect_timeout, read=cfg.read_timeout),
            retries=False,
            maxsize=16,
            cert_reqs="CERT_REQUIRED",
            ca_certs=os.environ.get("SSL_CERT_FILE") or None,  # None: the system trust store
        )
        try:
            self._client = Minio(
                cfg.endpoint,
                access_key=cfg.access_key,
                secret_key=cfg.secret_key,
                session_token=cfg.session_token,
                secure=cfg.secure,
                region=cfg.region,
                http_client=self._http,
            )
        except ValueError as exc:
            raise ConfigError(f"invalid S3 settings for {self.url}: {exc}") from None
        self._checked = False
        self._check_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.url!r}, endpoint={self.config.endpoint_url!r}, "
            f"access_key={self.config.access_key_hint!r})"
        )

    def _object_name(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, op: str, key: str | None, fn: Callable[[], T], *, check: bool = True) -> T:
        if check:
            self._ensure_checked()

        def attempt() -> T:
            try:
                return fn()
            except StatelogError:
                raise
            except (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                raise translate_error(
                    exc, op, key, url=self.url, bucket=self.bucket, cfg=self.config,
                    checked=self._checked,
                ) from exc

        where = f"{self.url}/{key}" if key else self.url
        return call_with_retry(self.config.retry, attempt, f"{op} {where}")

    def check(self) -> None:
        """Verify that the bucket exists and the credentials are accepted.

        Raises :class:`BucketNotFoundError`, :class:`AuthenticationError` or (after the
        retries) :class:`TransientStoreError`. Called lazily before the first operation.
        """
        exists = self._call(
            "check", None, lambda: self._client.bucket_exists(self.bucket), check=False
        )
        if not exists:
            raise bucket_not_found(self.bucket, self.config)
        self._checked = True

    def _ensure_checked(self) -> None:
        if self._checked:
            return
        with self._check_lock:
            if not self._checked:
                self.check()

    def _stat(self, name: str) -> Any:
        """``stat_object`` that returns ``None`` for a missing object."""
        try:
            return self._client.stat_object(self.bucket, name)
        except S3Error as exc:
            status = exc.response.status if exc.response else 0
            if exc.code != "NoSuchBucket" and (
                exc.code in ("NoSuchKey", "NotFound") or status == 404
            ):
                return None
            raise

    def _read(self, name: str) -> bytes:
        resp = self._client.get_object(self.bucket, name)
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    def close(self) -> None:
        self._http.clear()
