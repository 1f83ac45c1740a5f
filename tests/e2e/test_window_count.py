"""The window-count demo end to end: a SIGKILLed first attempt, a verified restore, a verified end.

The demo runs as ``make demo`` does, in a subprocess, on a small input and a temporary root.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import statelog

PROJECT = Path(__file__).resolve().parents[2]


def run_demo(root: Path, workdir: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [
            sys.executable, "-m", "examples.window_count", "--json", "--events", "20000",
            "--root", root.as_uri(), "--workdir", str(workdir), *extra,
        ],  # fmt: skip
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}); stderr:\n{proc.stderr}"
    return proc.returncode, json.loads(lines[-1]), proc.stderr


def test_demo_crashes_restores_and_verifies(tmp_path: Path) -> None:
    code, report, stderr = run_demo(tmp_path / "root", tmp_path / "run", "--seed", "7")
    assert code == 0, f"{json.dumps(report, indent=2)}\n{stderr}"
    assert report["passed"] is True
    assert report["crash"]["happened"] is True
    assert report["crash"]["checkpoints_before"] >= 2

    restore = report["restore"]
    assert restore["passed"] is True, restore["mismatches"]
    assert restore["keys_compared"] > 0
    assert restore["windows_compared"] > 0
    assert restore["timers_compared"] == restore["windows_compared"]
    assert 0 < restore["offset"] <= report["crash"]["progress_offset"]

    final = report["final"]
    assert final["passed"] is True, final["mismatches"]
    assert final["keys_compared"] > 0 and final["windows_compared"] > 0
    assert final["emitted_before_crash"] + final["emitted_after_restore"] == (
        final["windows_compared"] + final["re_emitted"]
    )
    assert report["checkpoints"]["total"] >= 5
    assert report["changelog_bytes"]["final_checkpoint"] > 0
    assert (tmp_path / "run" / "output-attempt-1.jsonl").exists()
    assert (tmp_path / "run" / "output-attempt-2.jsonl").exists()


def test_demo_refuses_a_root_with_checkpoints(tmp_path: Path) -> None:
    code, _, _ = run_demo(tmp_path / "root", tmp_path / "run1", "--crash-at", "0.3")
    assert code == 0
    code, report, _ = run_demo(tmp_path / "root", tmp_path / "run2")
    assert code == 1
    assert report["passed"] is False
    assert "already has checkpoints" in report["error"]


def test_the_checks_catch_wrong_state_and_wrong_output(tmp_path: Path) -> None:
    from examples import window_count as wc

    events = wc.generate_events(30_000, 50, seed=1)
    results: list[wc.Result] = []
    with statelog.open((tmp_path / "root").as_uri()) as job:
        backend = job.backend(wc.OPERATOR_UID)
        counter = wc.WindowCounter(backend, results.append)
        counter.process(events, 0, 20_000)
        want = wc.reference(events, 20_000)
        assert wc.compare_restored(counter.snapshot(), want)["passed"]
        assert {(r.user, r.window_start): r.count for r in results} == want.emitted

        got = counter.snapshot()
        got.totals[events.users[0]] += 1
        got.timers.pop()
        check = wc.compare_restored(got, want)
        assert not check["passed"]
        assert [m.split(":")[0] for m in check["mismatches"]] == ["totals", "timers"]

        counter.process(events, 20_000, len(events))
        counter.advance_watermark(wc.END_OF_INPUT, len(events))
        end, full = counter.snapshot(), wc.reference(events, len(events), end_of_input=True)

    # a crash at offset 25,000 after a checkpoint at 20,000: results in (20,000, 25,000] twice
    before = [r for r in results if r.offset <= 25_000]
    after = [r for r in results if r.offset > 20_000]
    ok = wc.compare_final(end, full, before, after, 20_000)
    assert ok["passed"], ok["mismatches"]
    assert ok["re_emitted"] == sum(1 for r in before if r.offset > 20_000) > 0

    changed = [wc.Result(r.user, r.window_start, r.count + 1, r.offset) for r in after[:1]]
    assert not wc.compare_final(end, full, before, changed + after[1:], 20_000)["passed"]
    assert not wc.compare_final(end, full, before, after[1:], 20_000)["passed"]  # one lost
