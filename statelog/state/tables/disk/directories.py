"""The local directories of disk-backed working sets: one per backend, never reused.

A directory is named ``statelog-ws-<pid>-<label><random>`` under the parent ``state_dir``.
It is created empty when a backend opens and deleted when it closes; the directory of a
process that died is deleted by the next backend that opens under the same parent.
"""

from __future__ import annotations

import logging
import os
import uuid

from statelog.errors import ConfigError

log = logging.getLogger(__name__)

DIR_PREFIX = "statelog-ws-"


def default_state_dir() -> str:
    """Where working-set directories go unless ``state_dir`` says otherwise."""
    import tempfile  # (and shutil) on first use: a process without a disk working set never needs them

    return os.path.join(tempfile.gettempdir(), "statelog-state")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(parent: str) -> None:
    """Delete working-set directories of processes that are gone (they are never reused)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(DIR_PREFIX):
            continue
        try:
            pid = int(name[len(DIR_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            log.info("deleting the working-set directory of a process that is gone: %s", name)
            import shutil

            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def new_directory(parent: str | None, label: str) -> str:
    """A new empty directory under ``parent`` (default: :func:`default_state_dir`), after
    deleting the stale ones there."""
    parent = parent or default_state_dir()
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"state_dir {parent!r} cannot be created ({e.strerror}); give a writable local directory"
        ) from None
    remove_stale(parent)
    path = os.path.join(parent, f"{DIR_PREFIX}{os.getpid()}-{label}{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


__all__ = ["DIR_PREFIX", "default_state_dir", "new_directory", "remove_stale"]
