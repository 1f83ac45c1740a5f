"""The state the follow benchmarks start from: operator ``UID`` with a ``ValueState<int64>``
``VALUE`` of keys ``0 .. keys-1``, each holding its own number, in one checkpoint."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from statelog import ValueStateDescriptor

UID = "bench"
VALUE = ValueStateDescriptor("v", pa.int64(), default=0)


def seed(job: Any, keys: int) -> tuple[Any, Any]:
    """Write every key once into a fresh backend of ``job`` and checkpoint; returns the backend
    and its state."""
    b = job.backend(UID, restore="none")
    st = b.get_state(VALUE)
    for k in range(keys):
        b.set_current_key(k)
        st.update(k)
    job.checkpoint()
    return b, st
