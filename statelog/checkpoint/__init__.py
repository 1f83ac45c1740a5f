"""Checkpointing: what a checkpoint is, where it is published, and who may publish.

* :mod:`~statelog.checkpoint.metadata`: checkpoint metadata and the handles of subtasks'
  state (``CheckpointMetadata``, ``SubtaskStateHandle``, ``ChangelogRange``, ...) and their JSON;
* :mod:`~statelog.checkpoint.catalog`: the job descriptor and the published checkpoint and
  savepoint metadata objects of a job root (listing, loading, publishing, retention);
* :mod:`~statelog.checkpoint.lease`: a lease with a fencing generation on a job root, one
  holder at a time (its objects on the store: :mod:`~statelog.checkpoint.lease_objects`);
* :mod:`~statelog.checkpoint.writer_lease`: the writer lease, one checkpoint publisher per root;
  :mod:`~statelog.checkpoint.root_lease`: that lease as one process's job holds it (taken on
  first use, fencing callbacks, the check of every write);
* :mod:`~statelog.checkpoint.publish`: taking a checkpoint of a process's backends and
  publishing its metadata (ids, snapshots, the fencing generation, retention).

The materializer daemon's leader lease (``materializer/lease.py``) is a lease of the same kind.
"""
