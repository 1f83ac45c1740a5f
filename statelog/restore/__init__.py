"""Restore: turning a checkpoint's handles back into a subtask's keyed state.

* ``start.py``: where a new backend starts (an implicit empty start refused where the newest
  checkpoint holds the operator's state; the restore read at once or opened on demand);
* ``plan.py``: what a restore reads (the checkpoint ``restore=`` names, the table files and
  changelog ranges of a key-group range, the opening of an on-demand restore);
* ``eager.py``: everything read at once, then installed when the states register;
* ``ondemand/``: key groups loaded when first touched and in the background;
* ``changes.py``: what a restore read (``RestoredChanges``) and a state table's entries;
* ``appliers.py``: what each change operation does, per state kind (also the materializer's);
* ``install.py``: what these read, installed into the states' tables of a backend
  (:mod:`statelog.state.backend`);
* ``collector.py``: the cyclic garbage collector paused while state is built.

This package imports none of its modules here: the state kinds import ``appliers.py``, and
the rest imports the state kinds.
"""
