"""The guide's consumer example (docs/guide.md, section 2, runtime.Application) run as written
against the test broker: stopped by SIGINT or SIGTERM it ends with a final checkpoint that
covers every record it processed, and a restart continues from there without loss or
duplicates in the state."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.support.kafka.app_records import counts_at, end_offsets, latest_checkpoint, produce_keys
from tests.support.wait import wait_until

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
UID = "click-counter"  # the guide's
PARTITIONS = 3
# the example's own words, logged by runtime.app at DEBUG and INFO
PROCESSED = re.compile(r"(\d+) records processed")
FINAL = re.compile(r"final checkpoint (\d+) after (\d+) records")
LOGGING = (
    "import logging, sys\n"
    "logging.basicConfig(stream=sys.stderr, level=logging.WARNING)\n"
    "logging.getLogger('runtime.app').setLevel(logging.DEBUG)\n"
)


def guide_example() -> str:
    text = (REPO / "docs/guide.md").read_text()
    section = text[text.index("## 2. From a Kafka consumer loop"):text.index("### Writing the loop yourself")]
    blocks = [c for c in re.findall(r"```python\n(.*?)```", section, re.S) if "Application(" in c]
    assert len(blocks) == 1, "the guide's section 2 has no single example of runtime.Application"
    return blocks[0]


def example_for(root: str, bootstrap: str, topic: str) -> str:
    code = guide_example()
    for old, new in (('"s3://bucket/apps/clicks"', repr(root)), ('"broker:9092"', repr(bootstrap)),
                     ('topics="clicks"', f"topics={topic!r}"), ('uid="click-counter"', f"uid={UID!r}")):
        assert old in code, f"the guide's example no longer has {old}"
        code = code.replace(old, new)
    return LOGGING + code


class Run:
    """The example in a process of its own; its stderr lines collected as they come."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def processed(self) -> int:
        found = [int(m.group(1)) for line in list(self.lines) if (m := PROCESSED.search(line))]
        return max(found, default=0)

    def stop(self, signum: int) -> tuple[int, int]:
        """Send ``signum``, wait for the exit (code 0); the final checkpoint's id and record count."""
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=60)
        self._reader.join(10)
        assert code == 0, "\n".join(self.lines[-30:])
        finals = [(int(m.group(1)), int(m.group(2))) for line in self.lines if (m := FINAL.search(line))]
        assert len(finals) == 1, "\n".join(self.lines[-30:])
        return finals[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.parametrize(("first", "second"), [(signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)],
                         ids=["sigint-then-sigterm", "sigterm-then-sigint"])
def test_guide_example_ends_with_a_final_checkpoint_and_continues(kafka_broker, file_root, first, second) -> None:
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    code = example_for(file_root.url, kafka_broker.bootstrap_servers, topic)
    records: list = []
    for signum, n in ((first, 1500), (second, 1000)):
        records += produce_keys(kafka_broker, topic, n, first=len(records))
        run = Run(code)
        try:
            # every new record is processed (this run started at the last final checkpoint)
            wait_until(lambda run=run, n=n: run.processed() >= n, 120, f"the example processing {n} records")
            final_id, processed = run.stop(signum)
        finally:
            run.kill()
        assert processed == n  # nothing read twice
        meta = latest_checkpoint(file_root.url)
        assert meta is not None and meta.checkpoint_id == final_id
        assert meta.sources[topic] == end_offsets(records, PARTITIONS)  # it covers every record
        assert counts_at(file_root.url, UID) == dict(Counter(key for _, _, key in records))
