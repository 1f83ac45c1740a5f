"""Keep statelog's ``PICKLE`` marker a singleton across processes.

statelog compares value types with ``value_type is PICKLE``, but ``statelog.types.PICKLE``
is a plain instance: unpickled in a worker (inside a shipped descriptor) or in the job
master (inside an acknowledged state handle) it would be a different object. Registering a
reducer that pickles it by reference (``statelog.types.PICKLE``) keeps the identity.
The proper fix belongs in statelog (``_PickleType.__reduce__`` returning ``"PICKLE"``); this
registration is harmless once that exists.
"""

from __future__ import annotations

import copyreg

from statelog.types import PICKLE

_PickleType = type(PICKLE)


def _reduce_pickle_marker(obj: object) -> str:
    return "PICKLE"  # a global name: pickled as statelog.types.PICKLE


copyreg.pickle(_PickleType, _reduce_pickle_marker)
