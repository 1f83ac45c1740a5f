"""``statelog serve ROOT``: a follower of ROOT, its state served over HTTP/JSON and, with
``--flight-port``, Arrow Flight (:mod:`tools.serve.flight`), both from the one follower (read-only).

The server (:mod:`tools.serve.server`) answers only requests that bring the token
(``Authorization: Bearer TOKEN``), read from ``--token-file`` or else the environment variable
``STATELOG_SERVE_TOKEN``; without a token the command refuses to start (exit 2, one line).
It prints ``statelog serve: serving ROOT at http://HOST:PORT/ ...`` (with ``--json``, one JSON
object with ``root`` and ``url``, and ``flight_url`` with ``--flight-port``) once the follower has its first state, and serves until
interrupted. Exit codes: 0 ok, 2 usage or library error (one line).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from statelog.errors import ConfigError
from statelog.following.follower import Follower
from statelog.following.position import Consistency
from statelog.metrics import MetricsServer
from tools.serve.flight import start_flight
from tools.serve.server import make_server

log = logging.getLogger("tools.cli")

DEFAULT_PORT = 8087
DEFAULT_HOST = "127.0.0.1"
TOKEN_ENV = "STATELOG_SERVE_TOKEN"


def declare_serve(p: argparse.ArgumentParser) -> None:
    """The arguments of ``serve`` (the command is in :mod:`tools.cli.commands`)."""
    p.add_argument("--port", metavar="N", default=str(DEFAULT_PORT),
                   help=f"TCP port to serve on (default {DEFAULT_PORT}; 0: any free port, printed)")
    p.add_argument("--host", metavar="ADDR", default=DEFAULT_HOST, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--operators", metavar="UID", nargs="+", default=None,
                   help="the operator uids to follow and serve (default: all)")
    p.add_argument("--consistency", choices=[c.value for c in Consistency], default=Consistency.CHECKPOINT.value,
                   help="checkpoint (default): the newest completed checkpoint's state; flushed: also the "
                        "changelog flushed after it")
    p.add_argument("--poll", metavar="S", default="1",
                   help="seconds between the follower's polls of the root (default 1)")
    p.add_argument("--restore", choices=["on-demand", "eager"], default="on-demand",
                   help="on-demand (default): serve at once, key groups load in the background and on first use; "
                        "eager: load the whole state before serving (no request waits for a load)")
    p.add_argument("--flight-port", metavar="N", default=None,
                   help="also serve Arrow Flight (grpc://HOST:N) from the same follower (0: any free port, printed; "
                        "default: none)")
    p.add_argument("--token-file", metavar="PATH",
                   help=f"file holding the token requests must bring (default: the environment variable {TOKEN_ENV})")
    p.add_argument("--metrics-port", metavar="N", default=None,
                   help="serve Prometheus metrics at http://HOST:N/metrics (0: any free port; default: none)")
    p.add_argument("--metrics-host", metavar="ADDR", default=DEFAULT_HOST,
                   help="address of the metrics endpoint (default 127.0.0.1)")


def read_token(token_file: str | None) -> str:
    """The token from ``token_file`` or else ``$STATELOG_SERVE_TOKEN``; ``ConfigError`` when there is none."""
    how = f"give one with --token-file PATH or the environment variable {TOKEN_ENV}"
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--token-file: cannot read {token_file}: {getattr(e, 'strerror', None) or e}; {how}") from None
        if not token:
            raise ConfigError(f"--token-file: {token_file} is empty; statelog serve refuses to serve without a token: {how}")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(f"statelog serve refuses to serve without a token: {how}")
    return token


def parse_port(text: str, option: str = "--port") -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError(f"{option}: expected a TCP port 0..65535 (0: any free port), got {text!r}")
    return port


def parse_poll(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise ConfigError(f"--poll: expected seconds between polls, more than 0 and at most 3600, got {text!r}")
    return seconds


def cmd_serve(args: argparse.Namespace, options: dict[str, Any]) -> int:
    token = read_token(args.token_file)  # first: nothing is opened without a token
    port = parse_port(args.port)
    poll_s = parse_poll(args.poll)
    flight_port = None if args.flight_port is None else parse_port(args.flight_port, "--flight-port")
    follower = Follower(args.root, operators=args.operators, consistency=args.consistency,
                        store_options=options, poll_s=poll_s, on_demand=args.restore == "on-demand")  # fmt: skip
    try:
        try:
            server = make_server(follower, args.host, port, token)
        except OSError as e:
            raise ConfigError(
                f"cannot serve on {args.host}:{port}: {e.strerror or e}; pick another --port (0: any free port) or --host"
            ) from None
        metrics = None
        if args.metrics_port is not None:
            try:
                metrics = MetricsServer(server.metrics.registry, server.metrics.health, args.metrics_host,
                                        parse_port(args.metrics_port, "--metrics-port"))  # fmt: skip
            except ConfigError:
                server.server_close()
                raise
        flight = None
        if flight_port is not None:
            try:
                flight = start_flight(follower, args.host, flight_port, token, server.sql, server.scans, server.metrics)
            except (OSError, pa.ArrowException) as e:
                server.server_close()
                if metrics is not None:
                    metrics.close()
                reason = getattr(e, "strerror", None) or str(e).split(". Detail:")[0].splitlines()[0]
                raise ConfigError(f"cannot serve Arrow Flight on {args.host}:{flight_port}: {reason}; pick another "
                                  "--flight-port (0: any free port) or --host") from None
        host, bound = server.server_address[:2]
        url = f"http://{host}:{bound}/"
        flight_url = None if flight is None else f"grpc://{host}:{flight.port}"
        if args.json:
            out = {"root": follower.root, "url": url}
            if flight_url is not None:
                out["flight_url"] = flight_url
            if metrics is not None:
                out["metrics_url"] = metrics.url + "/metrics"
            print(json.dumps(out), flush=True)
        else:
            also = f" and {flight_url} (Arrow Flight)" if flight_url is not None else ""
            also += f", metrics at {metrics.url}/metrics" if metrics is not None else ""
            print(f"statelog serve: serving {follower.root} at {url}{also} (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            log.info("statelog serve: stopped")
        finally:
            server.server_close()
            if flight is not None:
                flight.shutdown()
            if metrics is not None:
                metrics.close()
    finally:
        follower.close()
    return 0
