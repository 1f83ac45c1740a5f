"""The materializer: turns completed checkpoints into Parquet state tables (the daemon,
its in-process background mode, savepoints and garbage collection; docs/materializer.md).

``materializer.start_background(job, ...)`` runs it in a thread of the current process
(:func:`materializer.background.start_background`); the engine (``statelog``) never starts it.
"""

from materializer.background import BackgroundMaterializer, start_background

__all__ = ["BackgroundMaterializer", "start_background"]
