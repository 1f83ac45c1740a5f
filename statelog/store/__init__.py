"""Object stores behind one narrow interface, opened from a job root URL.

Callers use :func:`open_store` and the :class:`ObjectStore` interface only; they never
import an implementation. Supported roots:

* ``file:///abs/path`` (or a bare absolute path ``/abs/path``): :mod:`statelog.store.local`.
* ``s3://bucket/optional/prefix``: :mod:`statelog.store.s3` (any S3-compatible server).

Credentials never go into the URL; they come from the options mapping or the standard
``AWS_*`` environment variables (see ``docs/store.md``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from statelog.errors import ConfigError
from statelog.store.base import ObjectInfo, ObjectStore
from statelog.store.retry import RetryPolicy, call_with_retry
from statelog.store.validation import (
    check_segments,
    validate_key,
    validate_prefix,
    validate_range,
)

__all__ = [
    "ObjectInfo",
    "ObjectStore",
    "RetryPolicy",
    "call_with_retry",
    "open_store",
    "redact_url",
    "reopen_store",
    "validate_key",
    "validate_prefix",
    "validate_range",
]

_EXPECTED = "expected file:///absolute/path, /absolute/path or s3://bucket/optional/prefix"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def redact_url(url: str) -> str:
    """Return ``url`` safe to log: user info and query string are replaced by ``***``."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.split("?", 1)[0] + ("?***" if "?" in url else "")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    tail = slash + path
    for mark in ("?", "#"):
        if mark in tail:
            tail = tail.split(mark, 1)[0] + mark + "***"
            break
    return f"{scheme}://{authority}{tail}"


def _parse_file_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ConfigError(f"file job root {redact_url(url)!r} has a query or fragment; {_EXPECTED}")
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"file job root {url!r} names host {parts.netloc!r}: a file root needs an "
            f"absolute path with three slashes, e.g. 'file:///{parts.netloc}{parts.path}'"
        )
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ConfigError(f"file job root {url!r} has no absolute path; {_EXPECTED}")
    return path


def _parse_s3_url(url: str) -> tuple[str, str]:
    scheme_rest = url.split("://", 1)[1]
    authority = scheme_rest.split("/", 1)[0]
    if "@" in authority:
        raise ConfigError(
            f"the S3 job root {redact_url(url)!r} embeds credentials; remove them from the URL "
            "and set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or the access_key/secret_key "
            "store options) instead"
        )
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ConfigError(
            f"the S3 job root {redact_url(url)!r} has a query string or fragment; put store "
            "settings into the options mapping (endpoint, region, ...), not the URL"
        )
    bucket = parts.netloc
    if not bucket:
        raise ConfigError(f"the S3 job root {url!r} names no bucket; expected s3://bucket/prefix")
    if ":" in bucket:
        raise ConfigError(
            f"the S3 job root {url!r} has a port in the bucket name; give the server "
            "with the 'endpoint' option (or AWS_ENDPOINT_URL) and write s3://bucket/prefix"
        )
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"{bucket!r} is not a valid S3 bucket name: expected 3-63 characters of "
            "lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
        )
    prefix = unquote(parts.path).strip("/")
    if prefix:
        try:
            check_segments(prefix, "S3 prefix")
        except ConfigError as exc:
            raise ConfigError(f"the S3 job root {url!r} has a malformed prefix: {exc}") from exc
    return bucket, prefix


def open_store(url: str, options: Mapping[str, Any] | None = None) -> ObjectStore:
    """Open the object store for a job root URL.

    ``options`` configures the S3 client (see :class:`statelog.store.s3.config.S3Config`); a
    ``file://`` root takes no options. Raises :class:`ConfigError` for malformed URLs and
    options; no network call is made here (S3 checks happen on first use or ``check()``).
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(f"job root URL must be a non-empty str; {_EXPECTED}")
    options = dict(options or {})
    if url.startswith("/"):
        path = url
    elif "://" not in url:
        hint = "" if ":" in url else f" (for this local directory: file://{os.path.abspath(url)})"
        raise ConfigError(
            f"job root {redact_url(url)!r} is neither a URL nor an absolute path; {_EXPECTED}{hint}"
        )
    else:
        scheme = url.split("://", 1)[0].lower()
        if scheme == "s3":
            bucket, prefix = _parse_s3_url(url)
            from statelog.store.s3.config import S3Config
            from statelog.store.s3.object_store import S3ObjectStore

            return S3ObjectStore(bucket, prefix, S3Config.from_options(options))
        if scheme != "file":
            raise ConfigError(
                f"unsupported job root scheme {scheme!r} in {redact_url(url)!r}; {_EXPECTED}"
            )
        path = _parse_file_url(url)
    if options:
        raise ConfigError(
            f"a file job root takes no options, got {', '.join(sorted(map(str, options)))}; "
            "store options (endpoint, credentials, ...) only apply to s3:// roots"
        )
    from statelog.store.local import LocalObjectStore

    return LocalObjectStore(os.path.normpath(path))


def reopen_store(store: ObjectStore) -> ObjectStore | None:
    """A separate handle on the root of ``store`` (its own connections, closed by whoever
    reopened it), as :func:`open_store` opened it; ``None`` for any other store (a wrapper such
    as a fault injector), which the caller then shares (:meth:`ObjectStore.reopen`). Callers
    need no implementation class, and a ``file://`` root's reopening imports no S3 client."""
    return store.reopen()
