"""What an S3 or HTTP failure means for statelog: the :mod:`statelog.errors` class and a message.

Each error says what to do: a missing bucket names the command that creates it, refused
credentials name the variables that set them, a valid identity without a permission names
the permission, a skewed clock says so. Retryable failures (throttling, 5xx, timeouts,
unreachable server) become :class:`~statelog.errors.TransientStoreError`. Messages show
the access key by its first four characters only and never a secret.
"""

from __future__ import annotations

import urllib3
from minio.error import InvalidResponseError, S3Error, ServerError

from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConfigError,
    ObjectNotFoundError,
    StatelogError,
    StoreError,
    StorePermissionError,
    TransientStoreError,
)
from statelog.store.s3.config import S3Config

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


def bucket_not_found(bucket: str, cfg: S3Config) -> BucketNotFoundError:
    return BucketNotFoundError(
        f"bucket {bucket!r} does not exist on {cfg.endpoint_url}; create it "
        f"(e.g. 'aws s3 mb s3://{bucket}') or fix the job root URL"
    )


def translate_error(
    exc: Exception, op: str, key: str | None, *, url: str, bucket: str, cfg: S3Config, checked: bool
) -> StatelogError:
    """The statelog error for ``exc`` raised by operation ``op`` on ``key`` of the store at ``url``.

    ``checked`` says whether the same credentials passed the bucket check, which tells a
    missing permission from refused credentials.
    """
    where = f"{url}/{key}" if key else url
    if isinstance(exc, S3Error):
        code, status = exc.code or "", exc.response.status if exc.response else 0
        if code == "NoSuchBucket":
            return bucket_not_found(bucket, cfg)
        if code in ("NoSuchKey", "NotFound") or status == 404:
            return ObjectNotFoundError(f"object {key!r} not found in {url}", key=key)
        if code == "RequestTimeTooSkewed":
            return StoreError(
                f"{op} {where}: the S3 server rejected the request time; fix this "
                "machine's clock (NTP)",
                key=key,
            )
        if code in _PERMISSION_CODES and cfg.access_key and checked and op != "check":
            # the same credentials passed the bucket check: valid, but not allowed this
            perm = _PERMISSIONS.get(op, f"{op} permission")
            return StorePermissionError(
                f"permission denied: the S3 server at {cfg.endpoint_url} accepted access key "
                f"{cfg.access_key_hint!r} but denied {op} of {where} ({code}): the identity "
                f"lacks {perm} on bucket {bucket!r}; grant it, or use credentials that "
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
                f"the identity may access bucket {bucket!r}",
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
