"""A worker process: runs subtask ``i`` of every vertex of the job.

* :mod:`~runtime.worker.process`: the process (:func:`worker_main`, :class:`Worker`): its
  protocol with the job master, its task thread and the asynchronous part of checkpoints;
* :mod:`~runtime.worker.deploy`: building its tasks from the job graph, wired by channels;
* :mod:`~runtime.worker.start`: how local workers start, from ``python -m runtime.worker``
  (the runtime's fork server, or a spawned interpreter), never from the user's main module;
* :mod:`~runtime.worker.lease_grant`: the right to write under the job root that its job
  master grants it.
"""
