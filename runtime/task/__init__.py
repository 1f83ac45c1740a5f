"""What a worker runs: tasks, each a chain of operators driven by one loop.

* :mod:`~runtime.task.task`: :class:`Task`, its loop over its source splits or input
  channels, watermarks and the synchronous part of checkpoints;
  :mod:`~runtime.task.unaligned` its part in unaligned checkpoints;
* :mod:`~runtime.task.host`: what a task needs from the worker that runs it;
* :mod:`~runtime.task.operators`: the operators a task chains (map, filter, keyed process
  functions; windows are :mod:`runtime.api.windows`, sinks :mod:`runtime.connectors`).
"""
