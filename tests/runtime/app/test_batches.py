"""runtime.Application.run_batches against the test broker: Arrow batches of key and value
columns, the batch state calls on them, exactly once across a restart; the column builders
of runtime.app.batches on bad payloads."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from runtime import Application
from runtime.app.batches import _binary, value_decoder
from statelog.errors import ConfigError
from tests.support.kafka.app_records import COUNT, counts_at, end_offsets, produce_keys

UID = "click-counter"


def make_app(broker, root: str, topic: str, **options) -> Application:
    options = {"uid": UID, "topics": topic, "kafka": broker.config(), "checkpoint_interval_s": None,
               "open_options": {"retain_checkpoints": 1000}, **options}
    return Application(root, **options)


def count_batches(app: Application, until: int, seen: list[pa.RecordBatch]):
    """Per batch: +1 per record of its key on COUNT with get_many/put_many; stop at ``until`` records."""
    counts = app.state(COUNT)

    def per_batch(batch: pa.RecordBatch) -> None:
        seen.append(batch)
        grouped = pa.table({"key": batch["key"]}).group_by("key").aggregate([([], "count_all")])
        keys = grouped["key"].combine_chunks()
        counts.put_many(keys, pc.add(counts.get_many(keys), grouped["count_all"].combine_chunks()))
        if sum(b.num_rows for b in seen) >= until:
            app.stop()

    return per_batch


@pytest.mark.kafka
def test_batches_of_columns_count_exactly_once_across_a_restart(kafka_broker, file_root) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    first = produce_keys(kafka_broker, topic, 700)
    app, seen = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100), []
    final = app.run_batches(count_batches(app, 700, seen), value="str")

    assert final is not None and final.sources[topic] == end_offsets(first, 2)
    assert all(b.schema.names == ["key", "value"] and b["key"].type == pa.string() for b in seen)
    assert sorted(int(v) for b in seen for v in b["value"].to_pylist()) == list(range(700))
    assert counts_at(file_root.url, UID) == dict(Counter(k for _, _, k in first))

    second = produce_keys(kafka_broker, topic, 300, first=700)
    app2, seen2 = make_app(kafka_broker, file_root.url, topic, checkpoint_every=100), []
    assert app2.restored_from.checkpoint_id == final.checkpoint_id
    app2.run_batches(count_batches(app2, 300, seen2))
    assert all(b["value"].type == pa.binary() for b in seen2)
    assert sorted(int(v) for b in seen2 for v in b["value"].to_pylist()) == list(range(700, 1000))
    assert counts_at(file_root.url, UID) == dict(Counter(k for _, _, k in first + second))


def test_binary_columns_from_one_buffer_equal_pa_array() -> None:
    payloads = [b"a", b"", b"\x00\xffxyz", b"u1" * 100]
    assert _binary(payloads).equals(pa.array(payloads, pa.binary()))
    assert _binary([b"a", None]).to_pylist() == [b"a", None]


def test_json_and_fixed_width_values() -> None:
    rows = [{"user": "u1", "n": 3}, {"user": "u2", "n": 5}]
    col = value_decoder("json")([json.dumps(r).encode() for r in rows])
    assert col.to_pylist() == rows
    col = value_decoder(">i8")([int(v).to_bytes(8, "big", signed=True) for v in (1, -2, 1 << 40)])
    assert col.type == pa.int64() and col.to_pylist() == [1, -2, 1 << 40]
    assert value_decoder(np.float32)([np.float32(1.5).tobytes()]).to_pylist() == [1.5]


@pytest.mark.parametrize(("value", "payloads", "expected"), [
    ("json", [b'{"a": 1}', b"not json"], "not one JSON object each"),
    ("json", [b'{"a": 1}', None], "needs a JSON object per record"),
    ("<i8", [b"\x00" * 8, b"\x00" * 4], "not 8 bytes wide"),
    ("str", [b"\xff\xfe"], "not UTF-8 text"),
])
def test_payloads_that_do_not_fit_say_what_to_do(value, payloads, expected) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        value_decoder(value)(payloads)
    assert "value='bytes'" in str(info.value)


def test_an_unknown_value_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="fixed-width numpy dtype"):
        value_decoder("avro")
