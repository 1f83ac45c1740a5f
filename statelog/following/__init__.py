"""Followers (``statelog.follow(root)``): a read-only replica of a job's keyed state that
keeps up with its checkpoints.

* ``follower.py``: :class:`~statelog.following.follower.Follower` (``statelog.follow(root)``):
  restores the newest checkpoint, then applies each newer checkpoint's changelog, polled by
  :meth:`~statelog.following.follower.Follower.poll` or a background thread; point lookups;
* ``replica.py``: one operator's replica (a keyed backend without changelog) and the
  changelog position it has applied per stream; whether a checkpoint extends it;
* ``flushed.py``: the changelog segments flushed after the newest checkpoint (consistency
  ``"flushed"``);
* ``newest.py``: noticing a newer checkpoint (a listing; metadata read only when newer);
* ``position.py``: the consistency levels and the follower's position.

A follower never takes the writer lease and never writes to the root. docs/follow.md says
what it guarantees. This package imports none of its modules here (and is not named
``follow``: that name is the function :func:`statelog.follow`, which a subpackage's name
would replace as an attribute of :mod:`statelog` once imported).
"""
