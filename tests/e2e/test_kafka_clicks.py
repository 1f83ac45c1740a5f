"""examples/kafka_clicks.py against the test broker: exactly once through a worker kill."""

from __future__ import annotations

import json

import pytest

from examples import kafka_clicks

pytestmark = pytest.mark.kafka


def test_kafka_clicks_example(kafka_broker, file_root, capsys) -> None:
    code = kafka_clicks.main(["--bootstrap", kafka_broker.bootstrap_servers, "--root", file_root.url,
                              "--events", "24000", "--rate", "2000", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["exactly_once"] and report["duplicates"] == 0
    assert report["killed_worker_pid"] is not None and report["attempts"] == 2
    assert report["output_records"] == report["expected_records"] > 0


def test_kafka_clicks_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        kafka_clicks.parse_args(["--events", "0"])
