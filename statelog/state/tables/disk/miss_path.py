"""The miss path of the disk-backed working set in pure Python: the reference of its C version.

A key that is not resident has its record read from the database and installed into the
states' dicts; an eviction picks its victims (CLOCK) and writes their records back; a
prefetch plans which keys to read and installs them. These run in C
(statelog/_ext/workingset.c) when it is built; the ``*_py`` functions here are its
reference and fallback (tests compare them), and the names without ``_py`` are the ones in
use: the C version when built, else the reference.

A key's record is the value at the key's prefix (:func:`key_prefix_py`, docs/format.md
section 10): ``{state id: entry}`` of its default-namespace entries of every state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from statelog import _ext
from statelog.keys.groups import key_group_of_bytes_py
from statelog.state.tables.base import KeyInfo

_MISSING: Any = object()

def key_prefix_py(kg: int, kb: bytes) -> bytes:
    """The database keys of every entry of one key start with this."""
    return ((kg << 32) | len(kb)).to_bytes(6, "big") + kb


def install_py(key: Any, rec: dict[int, Any], index: dict[int, int], primary: list[dict[Any, Any]],
                extra: dict[Any, dict[int, Any]]) -> None:
    """Put a key's record (``{state id: entry}``) into the states' dicts; the entries of states
    not registered yet are kept in ``extra`` with the key."""
    for sid, entry in rec.items():
        i = index.get(sid)
        if i is not None:
            primary[i][key] = entry
        else:
            extra.setdefault(key, {})[sid] = entry


def install_raw_py(
    key: Any, info: KeyInfo, raw: bytes | None, loads: Any, present: set[Any], index: dict[int, int],
    primary: list[dict[Any, Any]], extra: dict[Any, dict[int, Any]], res: dict[Any, KeyInfo],
) -> None:
    """Make ``key`` resident with its record ``raw`` (``None``: it has none): then it is
    ``present`` and its entries are in the states' dicts."""
    if raw is not None:
        present.add(key)
        rec = loads(raw)
        if not isinstance(rec, dict):
            raise TypeError("a key's record is not a dict")
        install_py(key, rec, index, primary, extra)
    res[key] = info


def admit_py(
    key: Any, info: KeyInfo, get: Any, loads: Any, present: set[Any], index: dict[int, int],
    primary: list[dict[Any, Any]], extra: dict[Any, dict[int, Any]], res: dict[Any, KeyInfo],
) -> bool:
    """Make ``key`` resident: its record, read by ``get``, into the states' dicts (when it has
    one: then it is ``present``). Returns whether it had one."""
    raw = get(key_prefix_py(info[2], info[1]))
    install_raw_py(key, info, raw, loads, present, index, primary, extra, res)
    return raw is not None


def write_back_py(
    keys: list[Any], res: dict[Any, KeyInfo], drop: bool, primary: list[dict[Any, Any]],
    sids: list[int], extra: dict[Any, dict[int, Any]], present: set[Any], put: Any, delete: Any,
    dumps: Any, protocol: int,
) -> int:
    """Write each of ``keys``' entries of every state as one record (``put``); a key with no
    entry left whose record is in the database is deleted (``delete``). The puts and deletes
    are made in the order of their database keys, after every key is done (RocksDB's memtable
    inserts a sorted batch faster). With ``drop`` the keys stop being resident: their entries
    leave the dicts. Returns the puts and deletes."""
    ops: list[tuple[bytes, bytes | None]] = []
    for key in keys:
        info = res[key]
        pre = key_prefix_py(info[2], info[1])
        rec: dict[int, Any] = {}
        for i, table in enumerate(primary):
            v = table.pop(key, _MISSING) if drop else table.get(key, _MISSING)
            if v is not _MISSING:
                rec[sids[i]] = v
        more = extra.pop(key, None) if drop else extra.get(key)
        if more:
            rec.update(more)
        if rec:
            data = dumps(rec, protocol)
            if not isinstance(data, bytes):
                raise TypeError("write_back: dumps did not return bytes")
            ops.append((pre, data))
            if not drop:
                present.add(key)
        elif key in present:
            ops.append((pre, None))
            present.discard(key)
        if drop:
            present.discard(key)
            del res[key]
    ops.sort(key=lambda op: op[0])
    for pre, data in ops:
        if data is None:
            delete(pre)
        else:
            put(pre, data)
    return len(ops)


def plan_py(
    keys: Iterable[Any], resident: dict[Any, KeyInfo], lo: int, hi: int, maxp: int, encode: Any,
) -> tuple[list[Any], list[KeyInfo], list[bytes]]:
    """The keys of a prefetch to read, in their order: each of ``keys`` once, not resident,
    hashable and encodable (others are skipped), of a key group in ``lo..hi``. Returns the
    keys, their key infos and their records' database keys."""
    seen: set[Any] = set()
    out: tuple[list[Any], list[KeyInfo], list[bytes]] = ([], [], [])
    for key in keys:
        try:
            if key in resident or key in seen:
                continue
            kb = encode(key)
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - set_current_key reports it for its record
            continue
        kg = key_group_of_bytes_py(kb, maxp)
        if lo <= kg <= hi:
            seen.add(key)
            out[0].append(key)
            out[1].append((type(key), kb, kg))
            out[2].append(key_prefix_py(kg, kb))
    return out


def install_many_py(
    keys: list[Any], infos: list[KeyInfo], raws: list[bytes | None], loads: Any, present: set[Any],
    index: dict[int, int], primary: list[dict[Any, Any]], extra: dict[Any, dict[int, Any]],
    res: dict[Any, KeyInfo],
) -> None:
    """Make each of ``keys`` resident with its record already read (``raws``; ``None``: none)."""
    for key, info, raw in zip(keys, infos, raws, strict=True):
        install_raw_py(key, info, raw, loads, present, index, primary, extra, res)


def clock_victims_py(res: dict[Any, Any], n: int, touched: set[Any], cur: Any, missing: Any) -> list[Any]:
    """The resident keys an eviction writes back, oldest first (CLOCK): of the oldest ``3n``,
    a key set current again since admitted or spared (``touched``) is spared once and moves to
    the back; any other key but the current one is a victim, up to ``n``. If fewer were found
    (mostly touched keys), the oldest not chosen fill up to ``n``."""
    victims: list[Any] = []
    for key in list(itertools.islice(res, 3 * n)):
        if len(victims) >= n:
            break
        if key in touched:
            touched.discard(key)
            res[key] = res.pop(key)
        elif key is not cur and not (cur is not missing and key == cur):
            victims.append(key)
    if len(victims) < n:
        chosen = set(victims)
        for key in list(itertools.islice(res, 2 * n + 1)):
            if len(victims) >= n:
                break
            if key not in chosen and key is not cur and not (cur is not missing and key == cur):
                victims.append(key)
                touched.discard(key)
    return victims


# the C accelerator (statelog/_ext/workingset.c) when built, else None
C = _ext.load("workingset")
key_prefix = C.key_prefix if C is not None else key_prefix_py
admit = C.admit if C is not None else admit_py
write_back = C.write_back if C is not None else write_back_py
plan = C.plan if C is not None else plan_py
install_many = C.install_many if C is not None else install_many_py
clock_victims = C.clock_victims if C is not None else clock_victims_py

__all__ = [
    "C", "admit", "admit_py", "clock_victims", "clock_victims_py", "install_many", "install_many_py",
    "install_py", "key_prefix", "key_prefix_py", "plan", "plan_py", "write_back", "write_back_py",
]
