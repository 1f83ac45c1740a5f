"""``statelog ui ROOT``: the checkpoint dashboard, served over HTTP or written to one file.

The data comes from :mod:`tools.dashboard.data` (read-only: the root is never written), the
page from :mod:`tools.dashboard.page`. ``--out FILE`` writes the page once (self-contained,
plotly.js inlined, a static report) and exits, ``--json`` prints the data; without either the
live page is served at ``http://HOST:PORT/`` (refreshing itself every ``--refresh`` seconds
from ``/live.json``; data at ``/data.json``) until interrupted. Exit codes: 0 ok, 2 usage
or library error (one line, e.g. a root without a job, a port that is taken, an unwritable
``--out``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from statelog.errors import ConfigError
from tools.dashboard.data import gather
from tools.dashboard.live import LIVE_INTERVAL_S
from tools.roots import open_root

log = logging.getLogger("tools.cli")

DEFAULT_PORT = 8086
DEFAULT_HOST = "127.0.0.1"


def declare_ui(p: argparse.ArgumentParser) -> None:
    """The arguments of ``ui`` (the command is in :mod:`tools.cli.commands`)."""
    p.add_argument("--port", metavar="N", default=None,
                   help=f"TCP port to serve on (default {DEFAULT_PORT}; 0: any free port, printed)")
    p.add_argument("--host", metavar="ADDR", default=None,
                   help="address to listen on (default 127.0.0.1; the page shows the root's layout to anyone "
                        "who reaches it)")
    p.add_argument("--refresh", metavar="S", default=None,
                   help=f"seconds between the served page's refreshes (default {LIVE_INTERVAL_S:g}; 0.5 to 5)")
    p.add_argument("--out", metavar="FILE", help="write the page to FILE (one self-contained HTML file) and exit")


def parse_port(text: str | int) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port: expected a TCP port 0..65535 (0: any free port), got {text!r}")
    return port


def parse_refresh(text: str | None) -> float:
    if text is None:
        return LIVE_INTERVAL_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.5 <= seconds <= 5:
        raise ConfigError(f"--refresh: expected seconds between 0.5 and 5, got {text!r}")
    return seconds


def check_options(args: argparse.Namespace) -> None:
    """``--out`` and ``--json`` are two ways not to serve: one at a time, and without the
    serving options (``--port``, ``--host``, ``--refresh``); ``--out`` names a file."""
    if args.out is not None and not args.out.strip():
        raise ConfigError("--out: expected a file name for the page, got an empty one; give a file, or leave "
                          "--out out to serve the page")
    if args.out is not None and args.json:
        raise ConfigError("--json prints the data and --out writes the page: give one of them")
    for flag, value in (("--port", args.port), ("--host", args.host), ("--refresh", args.refresh)):
        if value is not None and (args.out is not None or args.json):
            raise ConfigError(f"{flag} applies when the page is served; drop {flag}, or drop "
                              f"{'--out' if args.out is not None else '--json'}")


def cmd_ui(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from tools.dashboard.page import make_server, render_html  # plotly: only `ui` pays its import

    check_options(args)
    port = parse_port(DEFAULT_PORT if args.port is None else args.port)
    host = DEFAULT_HOST if args.host is None else args.host
    refresh = parse_refresh(args.refresh)
    with open_root(args.root, options) as root:
        root.require_job()  # a mistyped root fails here, before anything is served or written
        if args.out or args.json:
            data = gather(root)
            if args.out:
                write_page(Path(args.out), render_html(data))
            if args.json:
                print(json.dumps(data, indent=1))
            else:
                print(f"wrote {args.out}")
            return 0
        try:
            server = make_server(lambda: gather(root), host, port, refresh)
        except OSError as e:
            raise ConfigError(
                f"cannot serve on {host}:{port}: {e.strerror or e}; pick another --port (0: any free "
                "port) or --host"
            ) from None
        host, bound = server.server_address[:2]
        print(f"statelog ui: serving {root.url} at http://{host}:{bound}/ (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            log.info("statelog ui: stopped")
        finally:
            server.server_close()
    return 0


def write_page(path: Path, page: str) -> None:
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--out: cannot write {path}: {e.strerror or e}; pick a writable file") from None
