"""Benchmark baselines: what statelog is measured against, never part of the product.

* :mod:`bench.baselines.state_dump`: the state-dump format (``statelog.state-dump``,
  ``docs/format.md`` section 6), a backend's whole keyed state in one object.
* :mod:`bench.baselines.state_dump_backend`: :class:`StateDumpBackend`, the runtime's
  ``state-dump`` baseline, a :class:`runtime.SnapshotStrategy` whose checkpoints write a
  subtask's whole keyed state.
"""
