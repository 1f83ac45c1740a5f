"""Object keys and range arguments as every store checks them (one rule for all stores).

Below the store implementations (``local.py``, ``s3.py``) and ``open_store`` in
``__init__.py``, so neither imports the other to validate a key.
"""

from __future__ import annotations

from statelog.errors import ConfigError


def check_segments(value: str, what: str) -> None:
    if "\x00" in value:
        raise ConfigError(f"{what} {value!r} contains a NUL character; use printable characters")
    if value.startswith("/"):
        raise ConfigError(
            f"{what} {value!r} starts with '/'; keys are relative to the store root "
            f"(write {value.lstrip('/')!r})"
        )
    for segment in value.split("/"):
        if segment == "":
            raise ConfigError(
                f"{what} {value!r} has an empty segment ('//' or a trailing '/'); "
                "use single '/' separators"
            )
        if segment in (".", ".."):
            raise ConfigError(
                f"{what} {value!r} contains a '{segment}' segment; keys must not navigate "
                "the path, name the object directly"
            )


def validate_key(key: str) -> str:
    """Check that ``key`` is a relative, ``/``-separated object key; return it.

    Raises :class:`ConfigError` for a non-string, empty key, leading ``/``, empty segments
    (``a//b``, ``a/``) and ``.``/``..`` segments.
    """
    if not isinstance(key, str):
        raise ConfigError(f"object key must be a str, got {type(key).__name__}")
    if not key:
        raise ConfigError("object key is empty; name the object, e.g. 'changelog/000001.seg'")
    check_segments(key, "object key")
    return key


def validate_prefix(prefix: str) -> str:
    """Check a listing prefix: ``""`` or a key-like string that may end in ``/``."""
    if not isinstance(prefix, str):
        raise ConfigError(f"list prefix must be a str, got {type(prefix).__name__}")
    if prefix:
        body = prefix[:-1] if prefix.endswith("/") else prefix
        if not body:
            raise ConfigError("list prefix '/' is not allowed; use '' to list everything")
        check_segments(body, "list prefix")
    return prefix


def validate_range(key: str, offset: int, length: int) -> None:
    """Check ``get_range`` arguments: int ``offset`` (negative = from the end), int ``length >= 0``."""
    for name, value in (("offset", offset), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"get_range({key!r}) needs an int {name}, got {type(value).__name__}")
    if length < 0:
        raise ConfigError(
            f"get_range({key!r}) needs length >= 0, got {length}; to read the last n bytes "
            "use offset=-n, length=n"
        )
