"""The materializer: turns completed checkpoints into Parquet state tables (the daemon,
its in-process background mode, savepoints and garbage collection; docs/materializer.md).

``materializer.start_background(job, ...)`` runs it in a thread of the current process
(:func:`materializer.background.start_background`); the engine (``statelog``) never starts it.
Both names are exported lazily (PEP 562): importing a submodule (``materializer.gc``,
``materializer.savepoint``) does not load the daemon and its metrics.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from materializer.background import BackgroundMaterializer, start_background

__all__ = ["BackgroundMaterializer", "start_background"]


def __getattr__(name: str) -> Any:
    """Import :mod:`materializer.background` on first use of an exported name."""
    if name not in __all__:
        raise AttributeError(f"module 'materializer' has no attribute {name!r}")
    value = getattr(import_module("materializer.background"), name)
    globals()[name] = value
    return value
