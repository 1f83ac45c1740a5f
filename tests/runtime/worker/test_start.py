"""Workers start from the runtime's own entry point: a job written as a plain script (no
``if __name__ == "__main__":`` guard) runs as written, and what its ``__main__`` defines
(a plain function, a lambda, a nested function, classes) reaches the workers by value.

The script appends its process id to a file at its top level: it must run exactly once
(in the process that ran ``python job.py``), never again in a worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[3]

SCRIPT = '''
import os
from runtime import FileSink, GeneratorSource, KeyedProcessFunction, StreamExecutionEnvironment
from statelog import PICKLE, ValueStateDescriptor

with open({marks!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")

TOTAL = ValueStateDescriptor("total", PICKLE, default=0)


def make(split, i):
    return (f"k{{i % 3}}", split * 1000 + i)


def scaled(factor):
    def scale(e):
        return (e[0], e[1] * factor)
    return scale


class Total(KeyedProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(TOTAL)

    def process_element(self, e, ctx):
        self.total.update(self.total.value() + e[1])
        yield [e[0], self.total.value()]


env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=0.2, state_root={root!r},
                                 start_method={method!r})
(env.from_source(GeneratorSource(make, count=50, splits=2), uid="src")
    .map(scaled(2))
    .filter(lambda e: e[1] % 4 == 0)
    .key_by(lambda e: e[0])
    .process(Total(), uid="total")
    .sink_to(FileSink({out!r}), uid="out"))
result = env.execute("script")
print("attempts", result.attempts)
'''


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_plain_script_with_main_functions(tmp_path: Path, method: str) -> None:
    marks, out, root = tmp_path / "marks", tmp_path / "out", (tmp_path / "root").as_uri()
    (tmp_path / "job.py").write_text(SCRIPT.format(marks=str(marks), root=root, method=method, out=str(out)))
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    proc = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == "attempts 1\n", proc.stderr[-4000:]
    assert len(marks.read_text().split()) == 1  # the script's top level ran once: in `python job.py` only
    totals: dict[str, int] = {}
    for p in out.glob("*.jsonl"):
        for line in p.read_text().splitlines():
            key, total = json.loads(line)
            totals[key] = max(totals.get(key, 0), total)
    expected: dict[str, int] = {}
    for split in range(2):
        for i in range(50):
            v = (split * 1000 + i) * 2
            if v % 4 == 0:
                expected[f"k{i % 3}"] = expected.get(f"k{i % 3}", 0) + v
    assert totals == expected


STRATEGY_SCRIPT = '''
import os
from runtime import FileSink, GeneratorSource, KeyedProcessFunction, StreamExecutionEnvironment
from statelog import PICKLE, ValueStateDescriptor

TOTAL = ValueStateDescriptor("total", PICKLE, default=0)


class Written:
    nbytes = 1

    def __init__(self, path):
        self.path = path

    def result(self, timeout=None):
        with open(self.path, "w") as f:
            f.write("x")

    def cancel(self):
        pass


class MarkerStrategy:  # a SnapshotStrategy of this script: JobConfig.snapshot_strategy
    name = "marker"

    def __init__(self, directory):
        self.directory = directory

    def snapshot(self, backend, checkpoint_id, store):
        return Written(os.path.join(self.directory, f"{{backend.operator_uid}}-{{backend.subtask}}-{{checkpoint_id}}"))

    def checkpoint_completed(self, backend, checkpoint_id, store):
        pass


class Total(KeyedProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(TOTAL)

    def process_element(self, e, ctx):
        self.total.update(self.total.value() + e[1])
        yield [e[0], self.total.value()]


env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=0.2, state_root={root!r},
                                 start_method={method!r}, state_backend=MarkerStrategy({marks!r}))
(env.from_source(GeneratorSource(lambda split, i: (f"k{{i % 3}}", i), count=50, splits=2), uid="src")
    .key_by(lambda e: e[0])
    .process(Total(), uid="total")
    .sink_to(FileSink({out!r}), uid="out"))
result = env.execute("strategy")
print("attempts", result.attempts, "failures", len(result.failures))
'''


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_config_with_a_main_class_reaches_the_workers(tmp_path: Path, method: str) -> None:
    """The job's configuration travels by value like its graph: a snapshot strategy whose class
    the script's ``__main__`` defines is used by the workers."""
    marks, out, root = tmp_path / "marks", tmp_path / "out", (tmp_path / "root").as_uri()
    marks.mkdir()
    script = STRATEGY_SCRIPT.format(marks=str(marks), root=root, method=method, out=str(out))
    (tmp_path / "job.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    proc = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == "attempts 1 failures 0\n", proc.stderr[-4000:]
    written = {p.name.rsplit("-", 1)[0] for p in marks.iterdir()}
    assert written == {"total-0", "total-1"}  # every keyed subtask snapshotted through the strategy
