"""Restore and rescale: a Spark job that writes a checkpoint's state as a savepoint laid out
for a new parallelism (``statelog restore ROOT --checkpoint ID --parallelism P``).

For every operator (minus dropped ones, under its new uid if renamed) and every new subtask
``i`` of ``P``, one Spark task restores key groups ``key_group_range_for_subtask(M, P, i)``
of the checkpoint (the overlapping materialized parts and changelog ranges of the old
handles, restricted to those key groups, exactly what a runtime restore reads) and writes
them as Parquet state tables with the engine's table writer
(:class:`statelog.materialization.table_writer.StateTableWriter`, as a materialization), self-contained
below ``savepoints/<name>/data/``. Files are cut at unit boundaries inside the new subtask's
range, so each new subtask reads only its own files. The driver then writes one manifest
(``savepoints/<name>/manifest.json``, kind ``savepoint``) and, last, the savepoint metadata
(``savepoints/<name>/_metadata.json``, kind ``savepoint``) with one handle per new subtask::

    SubtaskStateHandle(uid, subtask=i, parallelism=P, key_groups=R_i, changelog=(),
                       materialization=(MaterializedPart(manifest key, R_i),))

A job then restores subtask ``i`` with ``job.backend(uid, subtask=i, parallelism=P,
restore="savepoint:NAME")`` and resumes from the checkpoint's source positions (kept in the
savepoint metadata). ``max_parallelism`` is preserved; GC never deletes savepoints.

Before any task runs, ``prepare`` checks that the savepoint can be written
(``check_writable``: a small probe object below ``savepoints/<name>/``, written and
deleted again), so credentials that may not write fail in about a second, not at the first
write of a Spark task.

The modules, in the order the job runs them:

* :mod:`~statelog.spark.rescale.plan`: one :class:`~statelog.spark.rescale.plan.RestoreTask`
  per operator and new subtask, with the merged handle of the old subtasks' state;
* :mod:`~statelog.spark.rescale.checks`: the savepoint name (free, writable) before any
  task runs;
* :mod:`~statelog.spark.rescale.write`: one task, run in a Spark Python worker: the state
  tables of one new subtask;
* :mod:`~statelog.spark.rescale.publish`: the manifest and the savepoint metadata, from the
  tasks' results;
* :mod:`~statelog.spark.rescale.driver`: :func:`~statelog.spark.rescale.driver.prepare` and
  :func:`~statelog.spark.rescale.driver.restore`, the entry points (``statelog restore``).
"""
