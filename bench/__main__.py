"""Benchmarks: ``python -m bench NAME [--json] [options]``.

Each benchmark measures the compared variants side by side in one run and prints ratios
plus absolute figures. Results and commands are recorded in ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

BENCHMARKS = {
    "backend": "bench.backend",
    "bootstrap": "bench.bootstrap",
    "backpressure": "bench.backpressure",
    "columnar": "bench.columnar",
    "follow": "bench.follow",
    "follow_lookups": "bench.follow_lookups",
    "kafka": "bench.kafka",
    "kvstores": "bench.kvstores",
    "large": "bench.large",
    "local_copies": "bench.local_copies",
    "materializer": "bench.materializer",
    "recovery": "bench.recovery",
    "runtime": "bench.runtime",
    "scale": "bench.scale",
    "scale_materialization": "bench.scale_materialization",
    "spark": "bench.spark",
    "startup": "bench.startup",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test, not for results)")
    parser.add_argument("--root", default=None, help="job root URL to use (default: a temp directory)")
    parser.add_argument("--bootstrap", default=None,
                        help="kafka and startup: HOST:PORT of a broker to use (default: start the test broker)")
    parser.add_argument("--rounds", type=int, default=None, help="startup only: fresh processes per figure")
    parser.add_argument("--breakdown", action="store_true",
                        help="startup only: the steps of restart_first_record_s (medians)")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="startup only: measure without a bytecode cache of its own (as the environment has it)")
    parser.add_argument("--keys", default=None,
                        help="follow only: the key counts of the takeover figures, comma-separated (default 10^6,10^7)")
    parser.add_argument("--takeover-only", action="store_true", help="follow only: the takeover figures only")
    parser.add_argument("--persist-delay", type=float, default=None,
                        help="follow only: the writer's persist_delay in seconds (default: the writer option's, 0.25)")
    parser.add_argument("--large", action="store_true", help="columnar only: also 10^7 keys (several GB)")
    args = parser.parse_args(argv)
    module = importlib.import_module(BENCHMARKS[args.name])
    extra = {}
    if args.bootstrap is not None:
        if args.name not in ("kafka", "startup"):
            parser.error("--bootstrap applies to the kafka and startup benchmarks only")
        extra["bootstrap"] = args.bootstrap
    if args.rounds is not None:
        if args.name != "startup":
            parser.error("--rounds applies to the startup benchmark only")
        extra["rounds"] = args.rounds
    if args.breakdown:
        if args.name != "startup":
            parser.error("--breakdown applies to the startup benchmark only")
        extra["breakdown"] = True
    if args.large:
        if args.name != "columnar":
            parser.error("--large applies to the columnar benchmark only")
        extra["large"] = True
    if args.no_bytecode_cache:
        if args.name != "startup":
            parser.error("--no-bytecode-cache applies to the startup benchmark only")
        extra["bytecode_cache"] = False
    if args.keys is not None or args.takeover_only:
        if args.name != "follow":
            parser.error("--keys and --takeover-only apply to the follow benchmark only")
        try:
            extra["keys"] = [int(k) for k in args.keys.split(",")] if args.keys else None
        except ValueError:
            parser.error(f"--keys takes key counts separated by commas, e.g. 1000000,10000000; got {args.keys!r}")
        extra["takeover_only"] = args.takeover_only
    if args.persist_delay is not None:
        if args.name != "follow":
            parser.error("--persist-delay applies to the follow benchmark only")
        if not 0 <= args.persist_delay <= 60:
            parser.error(f"--persist-delay takes seconds from 0 to 60, got {args.persist_delay}")
        extra["persist_delay"] = args.persist_delay
    result = module.run(quick=args.quick, root=args.root, progress=not args.json, **extra)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        width = max(len(k) for k in result)
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
