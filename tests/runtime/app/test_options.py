"""runtime.ApplicationOptions: every bad option is a ConfigError that names it and says what is expected."""

from __future__ import annotations

import pytest

from runtime import Application, ApplicationOptions
from statelog.errors import ConfigError

KAFKA = {"bootstrap.servers": "127.0.0.1:1"}  # never contacted: the options fail first


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"kafka": KAFKA}, "application option topics is required: the topic or topics to read"),
        ({"topics": "t"}, "application option kafka is required: the consumer's settings"),
        ({"topics": [], "kafka": KAFKA}, "application option topics must be a topic name or a non-empty list"),
        ({"topics": ["a", "a"], "kafka": KAFKA}, "application option topics names a topic twice"),
        ({"topics": "t", "kafka": "broker:9092"}, "application option kafka must be the Kafka consumer's settings"),
        ({"topics": "t", "kafka": {"group.id": "g"}}, "'bootstrap.servers' is missing or empty"),
        ({"topics": "t", "kafka": {**KAFKA, "enable.auto.commit": True}}, "enable.auto.commit must stay false"),
        ({"topics": "t", "kafka": KAFKA, "uid": " "}, "application option uid must not be empty or blank"),
        ({"topics": "t", "kafka": KAFKA, "key": "int"}, "application option key must be 'str'"),
        ({"topics": "t", "kafka": KAFKA, "batch_size": 0},
         "application option batch_size: invalid count 0; use a whole number in [1, 1000000]"),
        ({"topics": "t", "kafka": KAFKA, "poll_timeout_s": "forever"}, "application option poll_timeout_s: invalid duration"),
        ({"topics": "t", "kafka": KAFKA, "checkpoint_every": -5}, "application option checkpoint_every"),
        ({"topics": "t", "kafka": KAFKA, "checkpoint_every": None, "checkpoint_interval_s": None},
         "checkpoint_every and checkpoint_interval_s are both None"),
        ({"topics": "t", "kafka": KAFKA, "restore": "yesterday"},
         'application option restore must be "latest", a checkpoint id or "savepoint:NAME" or "none"'),
        ({"topics": "t", "kafka": KAFKA, "start": "beginning"}, "application option start must be 'earliest'"),
        ({"topics": "t", "kafka": KAFKA, "partitions": {"other": [0]}},
         "application option partitions names topic 'other', which is not in topics ['t']"),
        ({"topics": "t", "kafka": KAFKA, "partitions": {"t": "0"}}, "must be a dict {topic: [partition, ...]}"),
        ({"topics": "t", "kafka": KAFKA, "materializer": "yes"}, "application option materializer must be True"),
        ({"topics": "t", "kafka": KAFKA, "materializer": {"intervall_s": 5}}, "unknown materializer option(s)"),
        ({"topics": "t", "kafka": KAFKA, "handle_signals": 1}, "application option handle_signals must be True or False"),
        ({"topics": "t", "kafka": KAFKA, "open_options": ["x"]}, "must be a dict of statelog.open keyword arguments"),
        ({"topics": "t", "kafka": KAFKA, "checkpoint_evry": 5}, "unknown application option(s) ['checkpoint_evry']"),
    ],
)
def test_bad_options_say_what_is_expected(tmp_path, options, expected) -> None:
    with pytest.raises(ConfigError) as err:
        Application((tmp_path / "root").as_uri(), **options)
    assert expected in str(err.value)
    assert not (tmp_path / "root").exists()  # refused before the root is opened


def test_options_and_keyword_arguments_are_not_mixed(tmp_path) -> None:
    options = ApplicationOptions(topics="t", kafka=KAFKA)
    with pytest.raises(ConfigError, match="as keyword arguments or as options=, not both"):
        Application((tmp_path / "root").as_uri(), options, uid="x")


def test_the_root_must_be_a_url_or_a_job() -> None:
    with pytest.raises(ConfigError, match="needs a job root URL or a StateJob, got int"):
        Application(42, topics="t", kafka=KAFKA)  # type: ignore[arg-type]


def test_text_values_are_converted_and_defaults_kept() -> None:
    options = ApplicationOptions(topics="clicks", kafka=KAFKA, checkpoint_interval_s="2m", batch_size="100")
    assert options.topics == ("clicks",)
    assert options.checkpoint_interval_s == 120.0 and options.batch_size == 100
    assert options.checkpoint_every == 10_000 and options.restore == "latest" and options.materializer is True


def test_secrets_of_the_consumer_settings_are_not_shown() -> None:
    options = ApplicationOptions(topics="t", kafka={**KAFKA, "sasl.password": "hunter2", "ssl.key.password": "k2"})
    assert "hunter2" not in repr(options) and "k2'" not in repr(options)
    assert "'sasl.password': '***'" in repr(options)
