"""``pyarrow.compute``, imported on first use.

Importing ``pyarrow.compute`` builds a Python wrapper with a docstring for each of its several
hundred kernels (it loads ``pydoc`` for that): ~30 ms on an idle machine, most of what is left
between a restarted process and its first record (docs/performance.md, "Start-up"). Engine
modules write ``from statelog.compute import pc`` and call ``pc.take(...)`` as before; the
module is imported by the first such call, and each function is then an attribute of ``pc``.
"""

from __future__ import annotations

import importlib
from typing import Any


class _Compute:
    def __getattr__(self, name: str) -> Any:
        value = getattr(importlib.import_module("pyarrow.compute"), name)
        setattr(self, name, value)  # the next lookup finds it without this method
        return value

    def __repr__(self) -> str:
        return "<pyarrow.compute, imported on first use>"


pc: Any = _Compute()
