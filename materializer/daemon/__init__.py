"""The materializer daemon: materialize due checkpoints under a leader lease, then collect garbage.

One :class:`~materializer.daemon.loop.MaterializerDaemon` watches one job root. Every cycle

1. makes sure it holds the leader lease (:class:`~materializer.lease.LeaderLease`): acquire
   it if free, renew it when a third of its ttl has passed; a daemon that is not the holder
   (a *standby*) does nothing else and tries again next cycle;
2. loads the newest completed checkpoint and the newest published materialization and asks
   the trigger policy :func:`~materializer.options.due` whether the checkpoint must be
   materialized now: it is newer than the materialization and its changelog tail (the bytes
   after its base) reached ``max_tail_bytes``, or ``interval_s`` passed since the last
   materialization, or there is no materialization yet (or the cycle is forced);
3. materializes it (:class:`~materializer.build.Materializer`) with the lease generation
   as fencing token. While it runs, a keeper thread renews the lease; right before the
   manifest is written the lease is checked again (``before_publish``) with a margin that
   covers the write, so a daemon whose lease expired or was taken over never publishes;
4. runs garbage collection (:func:`materializer.gc.collect.collect_garbage`) after a
   publication and otherwise every ``gc_interval_s``, while it still holds the lease.

The modules, by role:

* :mod:`~materializer.daemon.loop`: ``MaterializerDaemon``, its cycles, the loop until
  stopped, forced cycles, backoff, health;
* :mod:`~materializer.daemon.fencing`: the hold on the lease (step 1), standby, and the
  ``FencedError`` that ends the loop once a held lease is lost;
* :mod:`~materializer.daemon.publish`: plan, build and publish a materialization (2, 3);
* :mod:`~materializer.daemon.gc_schedule`: when GC runs and the run under the lease (4);
* :mod:`~materializer.daemon.report` and :mod:`~materializer.daemon.metrics`: the summaries
  as plain data and the Prometheus metrics.

:mod:`materializer.background` runs the same loop in a daemon thread of the current process
(``start_background``): the embedded default for single-process jobs, examples and tests.
See ``docs/materializer.md``.
"""
