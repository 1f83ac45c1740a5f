"""The environment's keyword arguments take their defaults from ``runtime.config.JobConfig``
(the one place a job option's default is declared, listed in docs/options.md)."""

from __future__ import annotations

import inspect
from dataclasses import fields

from runtime import StreamExecutionEnvironment
from runtime.config import JobConfig

# JobConfig fields the environment does not take as keywords: derived from state_backend, or
# set on the config only
NOT_KEYWORDS = {"snapshot_strategy", "worker_log_level"}
# keywords whose None means "JobConfig builds its default" (objects, and the required root)
BUILT = {"state_root", "store_options", "writer_options"}


def test_every_keyword_default_is_job_configs() -> None:
    params = inspect.signature(StreamExecutionEnvironment.__init__).parameters
    differ = []
    for f in fields(JobConfig):
        if f.name in NOT_KEYWORDS:
            continue
        default = params[f.name].default
        expected = None if f.name in BUILT else f.default
        if default != expected:
            differ.append(f"{f.name}: the environment has {default!r}, JobConfig {f.default!r}")
    assert differ == []


def test_an_environment_without_options_has_job_configs_defaults() -> None:
    root = "file:///tmp/statelog-defaults-test"
    assert StreamExecutionEnvironment(state_root=root).config == JobConfig(state_root=root)
