"""The user API of the runtime: what a job is built of.

* :mod:`~runtime.api.environment`: :class:`StreamExecutionEnvironment`, its settings, its
  sources and running the job;
* :mod:`~runtime.api.datastream`: the streams and their transformations (map, filter,
  ``key_by``, keyed process functions, windows, ``union``, ``connect``, sinks);
* :mod:`~runtime.api.functions`: the user functions of keyed operators and their contexts;
* :mod:`~runtime.api.windows`: event-time windows and their operator.

The names are exported by :mod:`runtime` itself.
"""
