"""Uploading a changelog writer's records: batching into segments, store writes, back-pressure.

The :class:`~statelog.changelog.writer.ChangelogWriter` owns the streams and their
durability; below it, by role (as Flink's DSTL splits its writer):

* :mod:`~statelog.changelog.upload.scheduler`: the flusher thread, which batches the
  buffered records of every stream into one segment per flush;
* :mod:`~statelog.changelog.upload.uploader`: writes a segment object to the store, retrying
  transient errors (:mod:`statelog.store.retry`);
* :mod:`~statelog.changelog.upload.throttle`: back-pressure, the segment bytes in flight
  against a cap and which streams' tasks must wait.
"""
