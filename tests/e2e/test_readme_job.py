"""The README's "Run a parallel stream job" block, saved as a script and run with ``python x.py``.

The block and the output the README documents are read from README.md when the test runs,
so the test follows the README; only its paths are moved into a temporary directory. The
script has no ``if __name__ == "__main__":`` guard: the workers must never run it again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
SECTION = "## Run a parallel stream job"


def readme_job() -> tuple[str, str]:
    """The section's Python block and the output the README says it prints."""
    text = (PROJECT / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[: section.index("\n## ", len(SECTION))]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    printed = re.search(r"it prints\s*```text\n(.*?)```", section, re.S)
    assert code is not None and printed is not None, "the README's runtime section lost its block or its output"
    return code.group(1), printed.group(1)


def test_readme_job_runs_as_a_plain_script(tmp_path: Path) -> None:
    code, printed = readme_job()
    assert "__main__" not in code  # a plain script, as a user pastes it
    clicks, out, root = tmp_path / "clicks", tmp_path / "out", tmp_path / "root"
    for path in ("/data/clicks", "/data/out", "/var/lib/clicks"):
        assert path in code, f"the README's block no longer uses {path}"
    script = code.replace("/data/clicks", str(clicks)).replace("/data/out", str(out))
    script = script.replace("/var/lib/clicks", str(root))
    clicks.mkdir()
    expected: Counter[tuple[str, int]] = Counter()
    with open(clicks / "part-0.jsonl", "w") as f:
        for i in range(300):
            user, ts = f"u{i % 4}", i * 100
            f.write(json.dumps({"user": user, "ts": ts}) + "\n")
            expected[(user, ts // 10_000 * 10_000)] += 1
    (tmp_path / "x.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    proc = subprocess.run([sys.executable, "x.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == printed, proc.stderr[-4000:]  # one attempt: no worker ran the script again
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    rows = [json.loads(line) for p in sorted(out.glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert sorted(rows) == sorted([user, start, n] for (user, start), n in expected.items())
