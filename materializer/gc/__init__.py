"""Garbage collection of a job root: delete what no retained checkpoint or savepoint needs.

Rules (``docs/gc.md``):

1. **Retention** (only with ``retain_checkpoints``): delete the metadata of all but the newest
   N checkpoints, oldest first. From that moment those checkpoints no longer exist.
2. **Live set**: every object that a retained checkpoint references (changelog segments,
   materialization manifests and every table file each manifest lists, also files it reuses
   from older materializations or savepoints), every savepoint (metadata, manifest, files),
   the newest published materialization (a backend may adopt it at its next checkpoint) and
   every materialization that was the newest less than ``grace_s`` ago (a backend may have
   listed it just before it was superseded and adopt it in a checkpoint still in flight).
3. **Candidates**: objects below ``changelog/`` and ``materializations/`` that are not live
   and whose mtime is older than ``grace_s``. Younger ones are *protected by grace*: segments
   of running writers that no checkpoint references yet, and table files of a
   materialization whose manifest is not written yet. Also every object below
   ``savepoints/<name>/`` of a savepoint without metadata (an unpublished write), all
   together once the newest of them is older than ``grace_s``; a writer in progress keeps
   them young with its files and its renewed in-progress marker
   (:mod:`statelog.state_processor.progress`).
4. **Rescan**: right before deleting, list the checkpoints (and the newest materialization)
   again; whatever a checkpoint published since the first scan references is removed from
   the candidates, and so are the objects of a savepoint whose metadata appeared since.
5. **Delete**: manifests first, then table files, then segments. Nothing else is ever
   deleted: not ``job.json``, not the lease objects below ``materializer/``, nothing of a
   published savepoint (savepoints are removed only by ``delete_savepoint``).

Why a crash never hurts: checkpoint metadata goes first, so a retained checkpoint never
loses an object it references (the objects deleted afterwards are unreachable from every
checkpoint that still exists). A manifest goes before its files, so every manifest that
exists still lists only existing files; files left behind by a crash are unreachable and the
next run deletes them.

Why concurrent publications are safe: a new reference to an *old* object can only come from
(a) a checkpoint published after the first scan: the rescan sees every checkpoint published
before the deletion starts, and one published later references segments written since the
previous checkpoint of its writer (younger than the grace period if the grace period exceeds
the checkpoint interval plus a checkpoint's duration) or the materialization its backends
adopted, which was the newest one when they listed it and is therefore live or protected as
"recently superseded"; (b) a materialization in progress: its new files are younger than
the grace period (if the grace period exceeds the longest materialization), the files it
reuses belong to the base of a retained checkpoint. Objects deleted are thus objects that
nothing references and nothing will reference (DESIGN invariant 4), provided the grace period
covers those durations and the clock skew between this host and the store.

The modules, by role:

* :mod:`~materializer.gc.collect`: :func:`~materializer.gc.collect.collect_garbage`, one run
  of the steps above and its report;
* :mod:`~materializer.gc.reachable`: what is live (:class:`~materializer.gc.reachable.LiveSet`,
  ``scan_live``, the recently superseded manifests), step 2 and the rescan's reading;
* :mod:`~materializer.gc.plan`: which objects are deleted, kept or protected (steps 2 to 4);
* :mod:`~materializer.gc.delete`: the deletions (steps 1 and 5), in order, ending the run at
  the first delete the store refuses for lack of permission;
* :mod:`~materializer.gc.report`: the report (``GcReport``) and the categories it counts.
"""
