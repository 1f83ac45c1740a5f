"""A savepoint bootstrapped from pyarrow: the runtime restores it at parallelism 3 and continues;
the final counts equal the seed plus the stream."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from runtime.connectors.sinks import read_committed
from statelog.state_processor import SavepointWriter
from tests.support import bootstrap_job
from tests.support.s3server import RootSpec


def test_runtime_restores_a_bootstrapped_savepoint_at_parallelism_3(file_root: RootSpec, tmp_path: Path) -> None:
    seed = {f"u{i}": 1000 * i for i in range(0, bootstrap_job.USERS, 2)}
    with SavepointWriter(file_root.url, "seeded", max_parallelism=128) as w:
        w.add("counter", bootstrap_job.COUNT, pa.table({"key": list(seed), "value": list(seed.values())}))
        w.publish()
    bootstrap_job.run(file_root, tmp_path / "out", 3, "savepoint:seeded")
    final: dict[str, int] = {}
    for user, n in read_committed(tmp_path / "out"):
        final[user] = max(final.get(user, 0), n)
    assert final == bootstrap_job.model(seed)
