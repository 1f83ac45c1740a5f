"""Bad input gets a clear error that says what was expected and what to do."""

from __future__ import annotations

import pyarrow as pa
import pytest

import statelog
from statelog import ListStateDescriptor, MapStateDescriptor, TtlConfig, ValueStateDescriptor
from statelog.errors import (
    AuthenticationError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptionError,
    JobMismatchError,
    JobNotFoundError,
    KeyGroupError,
    SerializationError,
    StateTypeError,
)
from statelog.layout import checkpoint_key


@pytest.mark.parametrize(
    "url, expect",
    [
        ("relative/dir", "absolute"),
        ("http://example.com/x", "scheme"),
        ("s3://", "bucket"),
        ("file://relative", "file://"),
        ("", "root"),
    ],
)
def test_malformed_root_url(url, expect):
    with pytest.raises(ConfigError) as e:
        statelog.open(url)
    assert expect.lower() in str(e.value).lower()


def test_credentials_in_the_url_are_refused_without_echoing_them():
    with pytest.raises(ConfigError) as e:
        statelog.open("s3://AKIAEXAMPLE:topsecretvalue@bucket/prefix")
    assert "topsecretvalue" not in str(e.value)
    assert "AWS_ACCESS_KEY_ID" in str(e.value)


@pytest.mark.s3
def test_wrong_credentials_are_refused(s3_server):
    spec = s3_server.unique_root()
    opts = dict(spec.options, secret_key="definitely-wrong-secret")
    with pytest.raises(AuthenticationError) as e:
        statelog.open(spec.url, store_options=opts)
    assert "definitely-wrong-secret" not in str(e.value)
    assert "credentials" in str(e.value).lower()


def test_unknown_checkpoint_id_lists_the_retained_ones(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    b.set_current_key(1)
    b.get_state(ValueStateDescriptor("v", pa.int64())).update(1)
    job.checkpoint()
    job.checkpoint()
    with pytest.raises(CheckpointNotFoundError) as e:
        job.backend("op", restore=42)
    assert "42" in str(e.value) and "1, 2" in str(e.value)
    with pytest.raises(ConfigError, match="non-negative integer"):
        job.load_checkpoint("latest-but-typo")
    job.close()


def test_max_parallelism_mismatch(tmp_path):
    statelog.open(tmp_path.as_uri(), max_parallelism=128).close()
    with pytest.raises(JobMismatchError) as e:
        statelog.open(tmp_path.as_uri(), max_parallelism=64)
    assert "128" in str(e.value) and "64" in str(e.value)
    assert statelog.open(tmp_path.as_uri()).max_parallelism == 128  # omitted: the stored one
    with pytest.raises(ConfigError, match="max_parallelism"):
        statelog.open((tmp_path / "other").as_uri(), max_parallelism=0)


def test_not_a_job_root(tmp_path):
    with pytest.raises(JobNotFoundError, match="not a statelog job root"):
        statelog.StateJob(tmp_path.as_uri(), create=False)


def test_unserializable_key(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")

    class Opaque:
        pass

    with pytest.raises(SerializationError, match="register_key_type"):
        b.set_current_key(Opaque())
    with pytest.raises(SerializationError, match="unhashable"):
        b.set_current_key(["a", "list"])
    job.close()


def test_wrong_value_type_names_state_type_and_value(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    b.set_current_key("k")
    v = b.get_state(ValueStateDescriptor("count", pa.int64()))
    with pytest.raises(StateTypeError) as e:
        v.update("12")
    msg = str(e.value)
    assert "'count'" in msg and "int64" in msg and "'12'" in msg and "PICKLE" in msg
    with pytest.raises(StateTypeError):
        v.update(2**63)  # out of int64 range
    with pytest.raises(StateTypeError):
        v.update(True)  # bool is not an int64 here
    lst = b.get_state(ListStateDescriptor("names", pa.string()))
    with pytest.raises(StateTypeError, match="names"):
        lst.add(3)
    m = b.get_state(MapStateDescriptor("m", pa.float64(), key_type=pa.int32()))
    with pytest.raises(StateTypeError, match="map key"):
        m.put("not-an-int", 1.0)
    s = b.get_state(ValueStateDescriptor("s", pa.struct([("a", pa.int64())])))
    s.update({"a": 1})
    with pytest.raises(StateTypeError):
        s.update({"a": "x"})
    # nothing invalid reached the changelog: a checkpoint and restore work
    meta = job.checkpoint()
    r = statelog.open(tmp_path.as_uri(), writer_lease=False).backend("op", restore=meta)
    r.set_current_key("k")
    assert r.get_state(ValueStateDescriptor("s", pa.struct([("a", pa.int64())]))).value() == {"a": 1}
    job.close()


def test_restoring_with_an_incompatible_descriptor(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    b.set_current_key("k")
    b.get_state(ValueStateDescriptor("count", pa.int64())).update(1)
    meta = job.checkpoint()
    job.close()
    job = statelog.open(tmp_path.as_uri())
    r = job.backend("op", restore=meta)
    with pytest.raises(ConfigError, match="value type was int64"):
        r.get_state(ValueStateDescriptor("count", pa.string()))
    with pytest.raises(ConfigError, match="stored as value state"):
        r.get_state(ListStateDescriptor("count", pa.int64()))
    job.close()


def test_key_outside_the_subtask_key_groups(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op", subtask=0, parallelism=2)
    foreign = next(k for k in range(100) if statelog.key_group_of(k, 128) >= 64)
    with pytest.raises(KeyGroupError, match="does not own"):
        b.set_current_key(foreign)
    job.close()


def test_bad_options_and_descriptors(tmp_path):
    with pytest.raises(ConfigError, match="unknown changelog writer option"):
        statelog.open(tmp_path.as_uri(), writer_options={"persist_dealy": 1})
    with pytest.raises(ConfigError, match="retain_checkpoints"):
        statelog.open(tmp_path.as_uri(), retain_checkpoints=0)
    with pytest.raises(ConfigError, match="invalid state name"):
        ValueStateDescriptor("bad name!", pa.int64())
    with pytest.raises(ConfigError, match="reserved"):
        ValueStateDescriptor("__timers_event", pa.int64())
    with pytest.raises(ConfigError, match="positive"):
        TtlConfig(0)
    with pytest.raises(StateTypeError, match="pyarrow.DataType"):
        ValueStateDescriptor("v", int)
    with pytest.raises(ConfigError, match="ttl must be"):
        MapStateDescriptor("m", pa.string(), statelog.PICKLE)
    job = statelog.open(tmp_path.as_uri())
    with pytest.raises(ConfigError, match="parallelism"):
        job.backend("op", parallelism=200)
    with pytest.raises(ConfigError, match="operator uid"):
        job.backend("")
    job.close()


def test_corrupt_checkpoint_metadata_names_the_object(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    b.set_current_key(1)
    b.get_state(ValueStateDescriptor("v", pa.int64())).update(1)
    meta = job.checkpoint()
    job.close()
    key = checkpoint_key(meta.checkpoint_id)
    path = tmp_path / key
    data = bytearray(path.read_bytes())
    data[data.index(b'"offset"') if b'"offset"' in data else 40] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    job = statelog.open(tmp_path.as_uri())
    with pytest.raises(CorruptionError) as e:
        job.backend("op", restore=meta.checkpoint_id)
    assert key in str(e.value)
    job.close()


def test_state_access_before_set_current_key(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    v = b.get_state(ValueStateDescriptor("v", pa.int64()))
    lst = b.get_state(ListStateDescriptor("l", pa.int64()))
    for call in (lambda: v.update(1), v.value, lambda: lst.add(1), lambda: b.timers.register_event_time_timer(5)):
        with pytest.raises(statelog.StatelogError, match="set_current_key"):
            call()
    assert b.current_key is None
    b.set_current_key(None)  # None is a valid key
    v.update(2)
    assert v.value() == 2 and job.checkpoint().changelog_bytes > 0
    job.close()
