"""On-demand restore: a restored backend's state, loaded key group by key group.

Opening a backend at a checkpoint on demand reads only the checkpoint's handles, the
manifests they build on (:func:`statelog.restore.plan.plan_reads`) and the timers (their
tables and changelog streams, which are small, and must be complete before event time may
pass a timer). Everything else is loaded per key group by a
:class:`~statelog.restore.ondemand.loader.KeyGroupLoader` (``loader.py``, the coordinator):

* the first time the task touches a key group (the key of a record, of a firing timer, of a
  query), the backend takes that key group from the loader: it is prepared at once in the
  task thread, or, if the background thread is preparing it already, waited for;
* a background thread (``background.py``) prepares the other key groups in key-group order,
  at most ``read_ahead`` key groups ahead of what the task thread has installed;
* only the task thread writes the states' tables: it installs what the background thread
  prepared whenever it passes a key it has not seen yet and at every snapshot;
* a task thread that waits for the whole state
  (:meth:`KeyedStateBackend.wait_loaded <statelog.state.backend.KeyedStateBackend.wait_loaded>`)
  stops the background thread and loads the rest as an eager restore does (``bulk.py``).

A key group with several row groups of its own in a table file is loaded by slices, the key
ranges of those row groups (``slices.py``). What the task thread takes has priority until
installed: the background thread pauses at its next safe point meanwhile (``progress.py``
holds each key group's state and the hand-over between the threads).

Preparing a key group reads the state-table files that hold it (``files.py``) and its share
of the changelog tail (``tail.py``); ``prepare.py`` turns both into the parts the backend
installs. If the state is only a small tail (no table file), the first touch installs it for
every key group at once. An object that is missing or corrupt fails the preparation of the
first key group that needs it, with the object's name; the error is raised in the task
thread at its next installation, never swallowed. The tuning of all of it is one
:class:`~statelog.restore.ondemand.options.OnDemandOptions` (``StateJob.on_demand_options``).

What a checkpoint taken while loading references does not depend on what was loaded: the
restored materialized parts and changelog ranges stay in the backend's handles until it
adopts a materialization, which it does only once fully loaded.
"""
