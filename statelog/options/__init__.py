"""Options: their value types and ranges (:mod:`~statelog.options.values`), the base of the option
objects (:mod:`~statelog.options.base`) and the engine's own options (:mod:`~statelog.options.engine`).

The materializer's options live in ``materializer/options.py``, the runtime's in ``runtime/config.py``;
all of them are built on these types.
"""
