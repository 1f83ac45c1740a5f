"""A Kafka consumer loop with keyed statelog state, owned by one object: :class:`Application`.

``Application(root, topics=..., kafka=...)`` restores the state and the offsets, and
``app.run(fn)`` calls ``fn`` per record (or per batch), checkpoints every N records or T
seconds, runs the materializer in the background and stops on SIGINT or SIGTERM with a final
checkpoint (``docs/guide.md``). It needs the materializer and ``confluent-kafka`` (the
``kafka`` extra), so it sits in the runtime layer, but uses none of the runtime's workers.
"""

from runtime.app.application import Application
from runtime.app.options import ApplicationOptions

__all__ = ["Application", "ApplicationOptions"]
