"""Keys: their canonical bytes, their key groups, and columns of them.

* :mod:`~statelog.keys.encoding`: a key's canonical bytes and back (the key encoding,
  ``docs/format.md`` section 3; custom key types; version-1 keys);
* :mod:`~statelog.keys.groups`: the key group of a key, ``KeyGroupRange``, the key groups
  of a subtask and the subtask of a key group;
* :mod:`~statelog.keys.columns`: Arrow columns of encoded keys decoded in bulk, version-1
  keys found in them, keys read into a declared Arrow type.
"""
