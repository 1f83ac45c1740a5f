"""Store options that never show their secrets: the one place that decides what is secret.

Every object that holds store options (the options mapping of ``open_store``: endpoint,
region, credentials, ...) keeps them as a :class:`StoreOptions`, whose ``repr`` and ``str``
show ``'***'`` for every secret value, and renders options for logs and errors with
:func:`redact`. A name is secret when it is one of :data:`SECRET_NAMES` or contains one of
:data:`SECRET_WORDS` (case-insensitive), e.g. ``secret_key``, ``session_token``,
``aws_secret_access_key``, ``password``, ``credentials_file``.

:func:`resolve_store_options` turns the options of a root plus this process's ``AWS_*``
environment into explicit options, so that another process (a Spark executor on another
machine, a worker) opens exactly the same store without that environment. The result is a
:class:`StoreOptions` too: the secret travels inside pickles, never in a rendering.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from statelog.store.s3.config import S3Config

REDACTED = "***"
SECRET_NAMES = frozenset({
    "access_key",
    "secret_key",
    "session_token",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
})
SECRET_WORDS = ("secret", "password", "passwd", "token", "credential")


def is_secret(name: object) -> bool:
    """Whether an option (or environment variable) of this name holds a secret."""
    low = str(name).lower().replace("-", "_").replace(".", "_")
    return low in SECRET_NAMES or low.endswith(("_access_key", "_access_key_id")) or any(
        w in low for w in SECRET_WORDS
    )


def redact(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` safe to log: secret values (also in nested mappings) are ``'***'``."""
    out: dict[str, Any] = {}
    for k, v in (options or {}).items():
        if is_secret(k) and v is not None:
            out[k] = REDACTED
        elif isinstance(v, Mapping):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


class StoreOptions(Mapping[str, Any]):
    """An immutable options mapping for ``open_store`` whose renderings hide its secrets.

    Behaves like a read-only ``dict`` (``open_store(url, StoreOptions(...))``,
    ``dict(opts)``, equality with a ``dict``); ``repr``/``str``/``format`` show
    :func:`redact` of it. Pickling keeps the values (processes that open the store need
    them); never log a pickle.
    """

    __slots__ = ("_items",)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        items = dict(options or {})
        if isinstance(items.get("retry"), Mapping):
            items["retry"] = dict(items["retry"])
        object.__setattr__(self, "_items", items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("StoreOptions is immutable; build a new one")

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._items == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(sorted(map(str, self._items))))

    def __repr__(self) -> str:
        return f"StoreOptions({redact(self._items)!r})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StoreOptions, (self._items,))

    def __bool__(self) -> bool:
        return bool(self._items)

    def redacted(self) -> dict[str, Any]:
        return redact(self._items)


def resolve_store_options(
    root: str, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> StoreOptions:
    """Explicit store options for ``root``: ``options`` plus what this process's environment adds.

    For an ``s3://`` root the endpoint (with its scheme), the region and the credentials that
    :class:`~statelog.store.s3.config.S3Config` resolves from ``options`` and the ``AWS_*``
    environment (``environ``, default ``os.environ``) become options, so a process without
    that environment (a Spark executor) opens the same store with them. Other roots take no
    options: ``options`` is returned as it is (``open_store`` checks it).
    """
    opts = dict(options or {})
    if not (isinstance(root, str) and root.lower().startswith("s3://")):
        return StoreOptions(opts)
    cfg = S3Config.from_options(opts, environ)
    opts.pop("secure", None)  # the endpoint carries the scheme
    opts["endpoint"] = cfg.endpoint_url
    opts["region"] = cfg.region
    for name in ("access_key", "secret_key", "session_token"):
        value = getattr(cfg, name)
        if value is None:
            opts.pop(name, None)
        else:
            opts[name] = value
    return StoreOptions(opts)


__all__ = ["REDACTED", "SECRET_NAMES", "SECRET_WORDS", "StoreOptions", "is_secret", "redact",
           "resolve_store_options"]
