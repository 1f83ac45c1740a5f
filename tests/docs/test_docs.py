"""The README and docs/*.md match the repository: code examples compile (the runtime example
runs on a tiny input), every link and file reference resolves, and documented JSON types are
what the CLI prints."""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from tests.support.s3server import RootSpec

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"```python\n(.*?)```", re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`([\w./-]+\.(?:md|py|c|toml))(?:::[\w\[\]-]+)?`")
# `statelog.restore.plan`, `materializer.gc.collect_garbage`, `runtime.api.functions.TimerContext()`
CODE_NAME = re.compile(r"`((?:statelog|materializer|runtime|tools)(?:\.[A-Za-z_]\w*)+)(?:\(\)|\[\w+\])?`")
# dotted names in the docs that are not Python names: Kafka header names of the dead-letter
# topic, Parquet key-value metadata keys, and benchmark JSON fields
NOT_CODE = re.compile(r"^statelog\.(dlq\.\w+|kind|table|user_key_encoding|value_encoding|source\w*)$|^runtime\.\w+_p\d+$|\.py$")


def python_blocks(doc: Path) -> list[tuple[int, str]]:
    text = doc.read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", doc.read_text(), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_python_examples_compile(doc: Path) -> None:
    for line, code in python_blocks(doc):
        compile(code, f"{doc.name}:{line}", "exec")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_file_references_resolve(doc: Path) -> None:
    text = doc.read_text()
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists() or REPO not in file.parents:
            broken.append(f"link {target}: no such file in the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"link {target}: no heading with that anchor in {file.name}")
    for m in CODE_PATH.finditer(text):  # `docs/x.md`, `../y.md`, `examples/z.py`, `changelog/writer.py`
        path = m.group(1)
        if "/" not in path:
            continue
        bases = (REPO, doc.parent, REPO / "statelog")
        if not any((base / path).resolve().exists() and REPO in (base / path).resolve().parents for base in bases):
            broken.append(f"file reference `{path}`: no such file in the repository")
    assert broken == [], f"{doc.name}: " + "; ".join(broken)


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_module_and_object_names_resolve(doc: Path) -> None:
    """Every `package.module.name` the docs mention is a module or an object of it."""
    names = {m.group(1) for m in CODE_NAME.finditer(doc.read_text())}
    broken = sorted(n for n in names if not NOT_CODE.search(n) and not _resolves(n))
    assert broken == [], f"{doc.name} names modules or objects that do not exist: {broken}"


def test_readme_runtime_example_runs_and_writes_key_window_and_count(tmp_path: Path) -> None:
    (code,) = [c for _, c in python_blocks(REPO / "README.md") if "StreamExecutionEnvironment(" in c]
    clicks_dir, out_dir = tmp_path / "clicks", tmp_path / "out"
    clicks_dir.mkdir()
    events = [{"user": f"u{i % 3}", "ts": ts} for i, ts in enumerate([1_000, 2_000, 3_000, 12_000, 14_000, 25_000,
                                                                        26_000, 31_000, 45_000])]
    for part in range(2):
        (clicks_dir / f"clicks-{part}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[part::2]))
    root = (tmp_path / "state").as_uri()
    for placeholder, value in (("file:///var/lib/clicks", root), ("/data/clicks", str(clicks_dir)),
                               ("/data/out", str(out_dir))):
        assert placeholder in code
        code = code.replace(placeholder, value)
    scope: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example

    from runtime.connectors.sinks import read_committed

    got = Counter(tuple(r) for r in read_committed(out_dir))
    want = Counter((e["user"], e["ts"] - e["ts"] % 10_000) for e in events)
    assert got == Counter({(u, w, n): 1 for (u, w), n in want.items()})


def test_cli_doc_states_the_json_type_of_materialization(file_root: RootSpec,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from materializer.build import materialize
    from tools.cli import main

    with statelog.open(file_root.url) as job:
        b = job.backend("op")
        count = b.get_state(statelog.ValueStateDescriptor("count", pa.int64(), default=0))
        b.set_current_key("k")
        count.update(1)
        first = job.checkpoint()
        m = materialize(job.store, first)
        job.materialization_poll_s = 0
        count.update(2)
        job.checkpoint()
    assert main(["checkpoints", "list", file_root.url, "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records[0]["materialization"] == []
    assert records[1]["materialization"] == [{"manifest": m.key, "id": m.mid, "checkpoint_id": first.checkpoint_id}]
    row = next(line for line in (REPO / "docs/cli.md").read_text().splitlines()
               if line.startswith("| `materialization` |"))
    assert "| array |" in row and "{manifest, id, checkpoint_id}" in row and "`[]`" in row


def test_readme_consumer_loop_continues_from_its_final_checkpoint(tmp_path: Path) -> None:
    """The README's loop, run twice on one root with a ``read_clicks`` of 25,000 then 40,000
    clicks: the second run starts at the first one's final checkpoint, counts only the new
    clicks, and ends with the counts of all 40,000 (nothing lost or counted twice)."""
    import subprocess
    import sys

    text = (REPO / "README.md").read_text()
    code = re.search(r"## Use it from your own consumer loop\n\n```python\n(.*?)```", text, re.S)
    assert code, "the README's consumer-loop example is gone"
    root = (tmp_path / "root").as_uri()
    loop = code.group(1).replace("file:///var/lib/clicks", root)
    for total in (25_000, 40_000):
        source = (
            "from types import SimpleNamespace\n"
            f"def read_clicks(start):\n    for i in range(start, {total}):\n"
            "        yield SimpleNamespace(user=f'u{i % 7}')\n"
        )
        run = subprocess.run([sys.executable, "-c", source + loop], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        with statelog.open(root, create=False) as job:
            meta = job.latest_checkpoint()
            assert meta is not None and meta.sources == {"clicks": total}
            b = job.backend("click-counter", restore="latest")
            counts = b.get_state(statelog.ValueStateDescriptor("count", pa.int64(), default=0))
            got = {key: value for key, _, value in counts.entries()}
        assert got == dict(Counter(f"u{i % 7}" for i in range(total)))
