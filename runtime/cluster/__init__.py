"""The job master's side of a running job.

* :mod:`~runtime.cluster.master`: :class:`JobMaster`, the attempts of a job and their
  failures and restarts; :mod:`~runtime.cluster.control` its end of the workers' control
  connections, :mod:`~runtime.cluster.savepoints` the savepoints it takes,
  :mod:`~runtime.cluster.restore_plan` what a job starts from;
* :mod:`~runtime.cluster.coordinator`: the checkpoint coordinator;
* :mod:`~runtime.cluster.restart`: restart strategies;
* :mod:`~runtime.cluster.launcher`: starting the workers as local processes, and
  :mod:`~runtime.cluster.spark` as the tasks of a Spark barrier stage;
* :mod:`~runtime.cluster.metrics`: the job's Prometheus metrics and health;
* :mod:`~runtime.cluster.client`: :class:`JobClient`, the handle of a running job.
"""
