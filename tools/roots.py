"""Opening job roots read-only for the command line (store options, metadata loading)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statelog.checkpoint.catalog import (
    JobCatalog,
    JobInfo,
    load_savepoint,
    missing_checkpoint_message,
)
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptionError,
)
from statelog.layout import checkpoint_key
from statelog.options.values import parse_checkpoint_ref
from statelog.store import open_store, redact_url
from statelog.store.options import REDACTED, StoreOptions, is_secret, redact

log = logging.getLogger("tools.cli")

# -- store options and roots ---------------------------------------------------------------------


class StoreOptionArg:
    """One ``--store-option KEY=VALUE`` as argparse keeps it (its ``type``): the parsed
    arguments' ``repr`` shows ``KEY=***`` for a secret option (:func:`is_secret`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        key, sep, _ = self.text.partition("=")
        return repr(f"{key}={REDACTED}" if sep and is_secret(key.strip()) else self.text)

    __str__ = __repr__


def parse_store_options(items: Sequence[str | StoreOptionArg]) -> StoreOptions:
    """``KEY=VALUE`` strings to an options mapping; ``retry.FIELD=N`` builds the retry dict.

    Error messages name the key at most, never a value (values may be secrets).
    """
    options: dict[str, Any] = {}
    for n, arg in enumerate(items, 1):
        item = arg.text if isinstance(arg, StoreOptionArg) else arg
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"--store-option #{n} is not of the form KEY=VALUE (e.g. endpoint=http://host:8333)"
            )
        target, name = options, key
        if key.startswith("retry."):
            target, name = options.setdefault("retry", {}), key.split(".", 1)[1]
            value = _number(value, key)
        if name in target or not isinstance(target, dict):
            raise ConfigError(f"--store-option {key} is given twice; give each option once")
        target[name] = value
    return StoreOptions(options)


def _number(value: str, key: str) -> int | float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--store-option {key} needs a number, got {value!r}") from None
    return int(number) if number.is_integer() and "." not in value else number


def redacted_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return redact(options)


@dataclass
class Root:
    """An opened job root (read-only use): its URL without credentials, and its catalog."""

    url: str
    catalog: JobCatalog

    def require_job(self) -> JobInfo:
        """The job descriptor; a root without one is an error (it is never created here)."""
        return self.catalog.open_job(None, create=False)


@contextlib.contextmanager
def open_root(url: str, options: dict[str, Any]) -> Iterator[Root]:
    log.info("opening %s with store options %s", redact_url(url), redacted_options(options))
    store = open_store(url, options)
    try:
        yield Root(store.url, JobCatalog(store))
    finally:
        store.close()


def load_metadata(root: Root, cid: int) -> CheckpointMetadata:
    """``catalog.load``, making sure every corruption error names the metadata object."""
    try:
        return root.catalog.load(cid)
    except CorruptionError as e:
        if e.key is not None:
            raise
        key = checkpoint_key(cid)  # nested decoders raise without the object's name
        raise CorruptionError(f"checkpoint metadata {key} is malformed: {e}", key=key) from e


def resolve_checkpoint_id(root: Root, which: str, option: str = "checkpoint") -> int:
    """The retained checkpoint named by ``which`` (an id or ``latest``); errors list them.

    ``which`` is parsed by the one parser of checkpoint references
    (:func:`statelog.options.values.parse_checkpoint_ref`); a ``savepoint:NAME`` is refused here with
    a message saying so (use :func:`load_checkpoint_or_savepoint` where a savepoint is fine)."""
    ref = parse_checkpoint_ref(which, option)
    if ref.kind == "savepoint":
        raise ConfigError(
            f"{option}: {which!r} names a savepoint, this command needs a retained checkpoint "
            "(an id or latest); list them with `statelog checkpoints list ROOT`"
        )
    ids = root.catalog.checkpoint_ids()
    if ref.kind == "latest":
        if not ids:
            raise CheckpointNotFoundError(f"{root.url} has no retained checkpoint yet")
        return ids[-1]
    cid = ref.checkpoint_id
    assert cid is not None
    if cid not in ids:
        raise CheckpointNotFoundError(missing_checkpoint_message(cid, ids, root.url))
    return cid


def load_checkpoint_or_savepoint(root: Root, which: str, option: str = "checkpoint") -> CheckpointMetadata:
    """The metadata ``which`` names: ``latest``, a retained checkpoint id or ``savepoint:NAME``
    (as ``sql``, ``inspect`` and ``restore`` accept them)."""
    ref = parse_checkpoint_ref(which, option)
    if ref.kind == "savepoint":
        assert ref.savepoint is not None
        return load_savepoint(root.catalog.store, ref.savepoint)
    return load_metadata(root, resolve_checkpoint_id(root, which, option))
