"""A state description read from checkpoint metadata decodes its value types on first use.

``StateInfo.from_json`` keeps the JSON of the value types (so listing checkpoints needs no
pyarrow); reading ``value_type`` or ``user_key_type`` decodes them, and the description then
behaves as one built from the types: equal, hashable, picklable, written back unchanged.
"""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from statelog.errors import CorruptionError
from statelog.state_info import StateInfo, StateKind, TtlConfig
from statelog.types import PICKLE

REPO = Path(__file__).resolve().parents[2]

MAP = StateInfo("m", StateKind.MAP, pa.list_(pa.int64()), pa.string(), TtlConfig(1000))
VALUE = StateInfo("v", StateKind.VALUE, PICKLE, None, None)


@pytest.mark.parametrize("info", [MAP, VALUE], ids=["map", "pickle"])
def test_a_description_read_back_equals_the_written_one(info: StateInfo) -> None:
    read = StateInfo.from_json(info.to_json())
    assert read.to_json() == info.to_json()  # written back as read, before decoding
    assert read == info and hash(read) == hash(info)
    assert read.value_type == info.value_type and read.user_key_type == info.user_key_type
    assert read.to_json() == info.to_json()


def test_a_read_description_pickles_before_and_after_decoding() -> None:
    read = StateInfo.from_json(MAP.to_json())
    assert pickle.loads(pickle.dumps(read)) == MAP
    assert read.value_type == pa.list_(pa.int64())
    assert pickle.loads(pickle.dumps(read)) == MAP


def test_reading_the_description_does_not_decode_the_types() -> None:
    code = (
        "import sys\n"
        "from statelog.state_info import StateInfo\n"
        f"info = StateInfo.from_json({MAP.to_json()!r})\n"
        "assert info.name == 'm' and info.ttl.ttl_ms == 1000\n"
        "assert 'pyarrow' not in sys.modules\n"
        "print(info.value_type)\n"
        "assert 'pyarrow' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "list<item: int64>"


def test_a_bad_type_kind_is_refused_when_read() -> None:
    obj = {**VALUE.to_json(), "value_type": {"kind": "numpy"}}
    with pytest.raises(CorruptionError, match="invalid value type description"):
        StateInfo.from_json(obj)


def test_a_schema_that_does_not_decode_is_corruption_on_first_use() -> None:
    bad = {"kind": "arrow", "type": "int64", "schema": base64.b64encode(b"not arrow").decode()}
    read = StateInfo.from_json({**VALUE.to_json(), "value_type": bad})
    assert read.name == "v"
    with pytest.raises(CorruptionError, match="invalid value type description .* of state 'v'"):
        _ = read.value_type


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    read = StateInfo.from_json(MAP.to_json())
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = read.nope  # type: ignore[attr-defined]
    assert not hasattr(MAP, "nope")
