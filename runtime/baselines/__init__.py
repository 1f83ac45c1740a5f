"""Benchmark baselines: what statelog is measured against, never used by a job by default.

* :mod:`~runtime.baselines.state_dump_backend`: ``state_backend="state-dump"``, checkpoints
  that write a subtask's whole keyed state.
"""
