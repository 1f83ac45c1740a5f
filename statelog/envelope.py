"""The checksummed, versioned JSON envelope of every JSON object statelog persists.

One codec for the job descriptor, checkpoint and savepoint metadata, materialization
manifests and lease objects (``docs/format.md``, section 0 "JSON envelope")::

    {"body": {"format": "statelog.<name>", "version": <int>, ...}, "crc32": <CRC-32>}

``crc32`` is the CRC-32 of the canonical JSON of ``body`` (``sort_keys=True``, separators
``(",", ":")``). The wrapper itself is canonical JSON too, except the job descriptor's
(``job.json`` v1), which was written with Python's default separators and keeps them:
:func:`dump` with ``spaced=True`` (the bytes every format writes are unchanged).

:func:`load` verifies in this order: the bytes are a JSON object with a ``body`` object and a
``crc32``; the CRC matches; ``body.format`` is the expected format; ``body.version`` is one
this build reads. Every failure is a :class:`CorruptionError` (a
:class:`FormatVersionError` for an unknown version) naming the object key.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection
from typing import Any

from statelog.errors import CorruptionError, FormatVersionError

__all__ = ["canonical", "dump", "load"]


def canonical(body: dict[str, Any]) -> bytes:
    """The canonical JSON of ``body``: the input of its checksum."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def dump(body: dict[str, Any], *, spaced: bool = False) -> bytes:
    """``{"body": body, "crc32": CRC-32 of canonical(body)}`` as JSON bytes.

    ``spaced=True`` writes the wrapper with Python's default separators (``", "``,
    ``": "``): only the job descriptor, whose v1 bytes were written that way.
    """
    wrapped = {"crc32": zlib.crc32(canonical(body)), "body": body}
    if spaced:
        return json.dumps(wrapped, sort_keys=True).encode("utf-8")
    return json.dumps(wrapped, sort_keys=True, separators=(",", ":")).encode("utf-8")


def load(
    data: bytes,
    key: str,
    what: str,
    *,
    fmt: str | None = None,
    versions: Collection[int] = (),
) -> dict[str, Any]:
    """The verified body of an envelope read from object ``key``.

    ``what`` names the object in errors (e.g. ``"checkpoint metadata"``). With ``fmt`` the
    body's ``format`` must be ``fmt``, and its ``version`` one of ``versions``.
    """
    try:
        wrapped = json.loads(data)
        body = wrapped["body"]
        crc = wrapped["crc32"]
        if not isinstance(body, dict):
            raise TypeError("body is not a JSON object")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{what} {key} is not valid JSON of the expected shape: {e}", key=key) from None
    if zlib.crc32(canonical(body)) != crc:
        raise CorruptionError(f"{what} {key}: checksum mismatch; the object is corrupt", key=key)
    if fmt is not None:
        if body.get("format") != fmt:
            raise CorruptionError(
                f"{what} {key} has format {body.get('format')!r}, expected {fmt!r}: another kind of "
                "object is in its place",
                key=key,
            )
        if body.get("version") not in versions:
            readable = (
                f"version {next(iter(versions))}" if len(versions) == 1 else f"versions {tuple(versions)}"
            )
            raise FormatVersionError(
                f"{what} {key} has format version {body.get('version')}, this build reads {readable}; "
                "upgrade statelog",
                key=key,
            )
    return body
