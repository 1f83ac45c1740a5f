"""A small keyed job for the state processor's runtime test: clicks counted per user in a
value state seeded from a bootstrapped savepoint (``tests/e2e/test_bootstrap_restore.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from runtime import FileSink, GeneratorSource, KeyedProcessFunction
from statelog import ValueStateDescriptor
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
USERS = 12
SPLITS = 3
PER_SPLIT = 40


def click(split: int, i: int) -> tuple[str, int]:
    return (f"u{(split * 7 + i) % USERS}", i)


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, e: Any, ctx: Any) -> Any:
        self.count.update(self.count.value() + 1)
        yield [ctx.current_key, self.count.value()]


def run(root: RootSpec, out: Path, parallelism: int, restore: str) -> None:
    env = make_env(root, parallelism=parallelism)
    clicks = env.from_source(GeneratorSource(click, PER_SPLIT, splits=SPLITS), uid="clicks")
    clicks.key_by(lambda e: e[0]).process(Count(), uid="counter").sink_to(FileSink(out), uid="out")
    env.execute("bootstrapped", restore=restore, timeout_s=120)


def model(seed: dict[str, int]) -> dict[str, int]:
    """The final count of every user: the seed plus the clicks."""
    out = dict(seed)
    for k in range(SPLITS):
        for i in range(PER_SPLIT):
            u = click(k, i)[0]
            out[u] = out.get(u, 0) + 1
    return out
