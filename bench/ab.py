"""A/B of two trees: ``python -m bench.ab A_DIR B_DIR [--rounds N] NAME [ARGS...]``.

Runs ``python -m bench NAME --json ARGS`` in two checkouts (each with its own ``.venv``, as
``make venv`` makes it), alternating which goes first in each round, so that both see the
same drift of a noisy machine. Prints, per numeric figure, the median and spread of each
side and the ratio B ÷ A of the medians; with ``--json`` one JSON object.

``NAME`` may also be ``py:MODULE:FUNCTION`` with one argument, a JSON object of keyword
arguments, to call a part of a benchmark present in both trees; the text ``$ROOT`` in it is
replaced by the ``file://`` URL of a fresh temporary directory. For example the restore part
of the materializer benchmark::

    python -m bench.ab OLD NEW py:bench.materializer:_throughput_and_restore \
        '{"root": "$ROOT", "keys": 1000000, "rounds": 3, "progress": false}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _command(tree: Path, name: str, args: list[str]) -> list[str]:
    python = str(tree / ".venv" / "bin" / "python")
    if name.startswith("py:"):
        _, module, function = name.split(":", 2)
        kwargs = args[0] if args else "{}"
        code = (
            "import json, importlib, pathlib, shutil, tempfile\n"
            "d = tempfile.mkdtemp(prefix='statelog-ab-')\n"
            f"kw = json.loads({kwargs!r}.replace('$ROOT', pathlib.Path(d).as_uri()))\n"
            f"try:\n    print(json.dumps(importlib.import_module({module!r}).{function}(**kw)))\n"
            "finally:\n    shutil.rmtree(d, ignore_errors=True)\n"
        )
        return [python, "-c", code]
    return [python, "-m", "bench", name, "--json", *args]


def _numbers(result: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[prefix + key] = float(value)
        elif isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key}."))
    return out


def _run(tree: Path, command: list[str]) -> tuple[dict[str, float], float]:
    started = time.monotonic()
    proc = subprocess.run(command, cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(command[1:3])} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return _numbers(json.loads(last)), time.monotonic() - started


def compare(a: Path, b: Path, name: str, args: list[str], rounds: int, progress: bool) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for r in range(rounds):
        order = (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a))
        for side, tree in order:
            figures, took = _run(tree, _command(tree, name, args))
            runs[side].append(figures)
            if progress:
                print(f"round {r + 1}/{rounds} {side} ({tree.name}): {took:.0f} s", file=sys.stderr, flush=True)
    fields = sorted(set(runs["a"][0]) & set(runs["b"][0]))
    table = {}
    for f in fields:
        va = [run[f] for run in runs["a"] if f in run]
        vb = [run[f] for run in runs["b"] if f in run]
        ma, mb = statistics.median(va), statistics.median(vb)
        table[f] = {
            "a_median": ma, "a_min": min(va), "a_max": max(va),
            "b_median": mb, "b_min": min(vb), "b_max": max(vb),
            "ratio_b_over_a": (mb / ma) if ma else None,
        }
    return {"a": str(a), "b": str(b), "benchmark": name, "args": args, "rounds": rounds, "figures": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="checkout A (the baseline), with its .venv")
    parser.add_argument("b", type=Path, help="checkout B, with its .venv")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("name", help="benchmark name (as for python -m bench) or py:MODULE:FUNCTION")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed on")
    ns = parser.parse_args(argv)
    for tree in (ns.a, ns.b):
        if not (tree / ".venv" / "bin" / "python").exists():
            parser.error(f"{tree} has no .venv: run `make venv` in it first")
    if ns.rounds < 1:
        parser.error("--rounds must be at least 1")
    out = compare(ns.a.resolve(), ns.b.resolve(), ns.name, ns.args, ns.rounds, progress=not ns.json)
    if ns.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"A = {out['a']}\nB = {out['b']}\n{ns.rounds} interleaved rounds of {ns.name}")
        for f, row in out["figures"].items():
            ratio = row["ratio_b_over_a"]
            print(f"{f:<48} A {row['a_median']:>14.4g} [{row['a_min']:.4g}–{row['a_max']:.4g}]"
                  f"  B {row['b_median']:>14.4g} [{row['b_min']:.4g}–{row['b_max']:.4g}]"
                  f"  B/A {ratio:.3f}" if ratio is not None else f"{f}: A median 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
