"""The ``statelog ui`` page: the data of :mod:`tools.dashboard.data` drawn with plotly.

:func:`render_html` turns the gathered data into one self-contained HTML page (plotly.js
inlined, no network access needed, so ``--out report.html`` can be opened anywhere);
:func:`make_server` serves it over HTTP, gathering the data afresh for every request (a
reload shows the checkpoints published since). Each chart is a ``<section class="chart"
id="chart-NAME">`` holding the plotly ``<div id="plot-NAME">``; a chart without data is
replaced by a ``<p class="no-data">`` that says why (``docs/cli.md``, *ui*).
"""

from __future__ import annotations

import html
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import plotly.graph_objects as go
import plotly.offline

from statelog.errors import StatelogError
from statelog.store import redact_url

log = logging.getLogger(__name__)

# the charts, in page order: name -> title (the tests and docs/cli.md list the same names)
CHARTS = {
    "checkpoint-duration": "Checkpoint duration: sync, async and alignment parts",
    "checkpoint-size": "Checkpoint size: incremental and full",
    "changelog-vs-materialized": "Changelog vs materialized bytes over time",
    "materialization-lag": "Materialization lag",
    "state-per-operator": "State size per operator (latest checkpoint)",
    "key-group-skew": "Key-group skew: rows per key group (latest checkpoint)",
    "savepoints": "Savepoints",
}
BYTES_AXIS = {"title": {"text": "bytes"}, "tickformat": "~s", "rangemode": "tozero"}
CONFIG = {"displaylogo": False, "responsive": True}


def _layout(fig: go.Figure, **kw: Any) -> go.Figure:
    layout = {"template": "plotly_white", "height": 360, "margin": {"l": 60, "r": 30, "t": 30, "b": 50},
              "legend": {"orientation": "h", "y": -0.2}}
    fig.update_layout(**{**layout, **kw})
    return fig


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r["checkpoint_id"]) for r in rows]


def duration_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["checkpoints"]
    fig = go.Figure()
    for key, name in (("sync_ms", "sync"), ("async_ms", "async"), ("alignment_ms", "alignment")):
        ys = [r[key] for r in rows]
        if any(y is not None for y in ys):
            fig.add_bar(x=_ids(rows), y=ys, name=name)
    total = [r["duration_ms"] for r in rows]
    if any(y is not None for y in total):
        fig.add_scatter(x=_ids(rows), y=total, name="end to end", mode="lines+markers")
    if not fig.data:
        return None
    return _layout(fig, barmode="stack", xaxis={"title": {"text": "checkpoint"}, "type": "category"},
                   yaxis={"title": {"text": "ms"}, "rangemode": "tozero"})


def size_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["checkpoints"]
    if not rows:
        return None
    fig = go.Figure()
    if any(r["incremental_bytes"] is not None for r in rows):
        fig.add_bar(x=_ids(rows), y=[r["incremental_bytes"] for r in rows], name="incremental (new changelog)")
    fig.add_scatter(x=_ids(rows), y=[r["full_bytes"] for r in rows], name="full (changelog + materialized referenced)",
                    mode="lines+markers")
    return _layout(fig, xaxis={"title": {"text": "checkpoint"}, "type": "category"}, yaxis=BYTES_AXIS)


def sawtooth_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["checkpoints"]
    if not rows:
        return None
    times = [r["time"] for r in rows]
    fig = go.Figure()
    fig.add_scatter(x=times, y=[r["materialized_bytes"] for r in rows], name="materialized (referenced)",
                    mode="lines+markers", stackgroup="size")
    fig.add_scatter(x=times, y=[r["changelog_bytes"] for r in rows], name="changelog tail (referenced)",
                    mode="lines+markers", stackgroup="size")
    ms = data["materializations"]
    if ms:
        fig.add_scatter(x=[m["time"] for m in ms], y=[m["bytes"] for m in ms], name="materialization published",
                        mode="markers", marker={"symbol": "diamond", "size": 11},
                        text=[f"{m['id']} (checkpoint {m['checkpoint_id']})" for m in ms])
    return _layout(fig, xaxis={"title": {"text": "time (UTC)"}}, yaxis=BYTES_AXIS)


def lag_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["checkpoints"]
    if not any(r["materialized_checkpoint"] is not None for r in rows):
        return None
    fig = go.Figure()
    fig.add_bar(x=_ids(rows), y=[r["lag_checkpoints"] for r in rows], name="checkpoints behind")
    if any(r["lag_ms"] is not None for r in rows):
        fig.add_scatter(x=_ids(rows), y=[None if r["lag_ms"] is None else r["lag_ms"] / 1000 for r in rows],
                        name="seconds behind", mode="lines+markers", yaxis="y2")
    return _layout(
        fig, xaxis={"title": {"text": "checkpoint"}, "type": "category"},
        yaxis={"title": {"text": "checkpoints behind its base"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "seconds"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )  # fmt: skip


def operator_figure(data: dict[str, Any]) -> go.Figure | None:
    ops = data["operators"]
    if not ops:
        return None
    fig = go.Figure()
    names = [o["operator"] for o in ops]
    for state in sorted({s["state"] for o in ops for s in o["states"]}):
        ys = [next((s["bytes"] for s in o["states"] if s["state"] == state), 0) for o in ops]
        rows = [next((s["rows"] for s in o["states"] if s["state"] == state), 0) for o in ops]
        if any(ys):
            fig.add_bar(x=names, y=ys, name=f"{state} (materialized)", text=[f"{r} rows" for r in rows])
    fig.add_bar(x=names, y=[o["changelog_bytes"] for o in ops], name="changelog tail")
    return _layout(fig, barmode="stack", xaxis={"title": {"text": "operator"}}, yaxis=BYTES_AXIS)


def skew_figure(data: dict[str, Any]) -> go.Figure | None:
    skew = data["skew"]
    if not skew or not skew["series"]:
        return None
    series = skew["series"]
    fig = go.Figure(go.Heatmap(
        z=[s["rows"] for s in series], x=list(range(skew["max_parallelism"])),
        y=[f"{s['operator']} / {s['state']}" for s in series], colorscale="Viridis",
        colorbar={"title": {"text": "rows"}}, hovertemplate="%{y}<br>key group %{x}: %{z} rows<extra></extra>",
    ))  # fmt: skip
    return _layout(fig, height=max(260, 80 + 36 * len(series)), xaxis={"title": {"text": "key group"}},
                   yaxis={"automargin": True})


def savepoint_figure(data: dict[str, Any]) -> go.Figure | None:
    sps = [s for s in data["savepoints"] if "error" not in s]
    if not sps:
        return None
    fig = go.Figure()
    fig.add_bar(x=[s["name"] for s in sps], y=[s["bytes"] for s in sps], name="bytes",
                text=[f"checkpoint {s['checkpoint_id']}, {s['rows']} rows" for s in sps])
    return _layout(fig, xaxis={"title": {"text": "savepoint"}}, yaxis=BYTES_AXIS)


FIGURES: dict[str, Callable[[dict[str, Any]], go.Figure | None]] = {
    "checkpoint-duration": duration_figure,
    "checkpoint-size": size_figure,
    "changelog-vs-materialized": sawtooth_figure,
    "materialization-lag": lag_figure,
    "state-per-operator": operator_figure,
    "key-group-skew": skew_figure,
    "savepoints": savepoint_figure,
}
NO_DATA = {
    "checkpoint-duration": "no retained checkpoint records a duration",
    "checkpoint-size": "no retained checkpoint",
    "changelog-vs-materialized": "no retained checkpoint",
    "materialization-lag": "no retained checkpoint builds on a materialization yet",
    "state-per-operator": "no retained checkpoint",
    "key-group-skew": "the latest checkpoint builds on no materialization (the changelog records no per-key-group counts)",
    "savepoints": "no savepoint (create one with `statelog savepoint create ROOT --checkpoint ID --name NAME`)",
}

# -- tables --------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _table(headers: list[str] | None, rows: list[list[Any]], cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers or ())
    thead = f"<thead><tr>{head}</tr></thead>" if headers else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def _overview(data: dict[str, Any]) -> str:
    c, job, s = data["counts"], data["job"], data["summary"]
    rows = [
        ["root", redact_url(data["root"])], ["job id", job["job_id"]],
        ["max parallelism", job["max_parallelism"]], ["created", job["created"]],
        ["retained checkpoints", c["checkpoints"]], ["latest checkpoint", c["latest_checkpoint"]],
        ["materializations", c["materializations"]], ["savepoints", c["savepoints"]],
        ["page generated", data["generated"]],
    ]  # fmt: skip
    summary = [
        [name, *(None if s[key] is None else s[key][k] for k in ("min", "avg", "max"))]
        for key, name in (
            ("duration_ms", "duration ms (end to end, else sync + async + alignment)"),
            ("full_bytes", "full size, bytes"), ("incremental_bytes", "incremental size, bytes"),
            ("lag_checkpoints", "materialization lag, checkpoints"),
        )
    ]  # fmt: skip
    return _table(None, rows, "overview") + _table(["summary", "min", "avg", "max"], summary, "summary")


def _history(data: dict[str, Any]) -> str:
    cols = ["checkpoint_id", "time", "duration_ms", "sync_ms", "async_ms", "alignment_ms", "incremental_bytes",
            "changelog_bytes", "materialized_bytes", "materialized_checkpoint", "lag_checkpoints"]
    headers = ["id", "time (UTC)", "duration ms", "sync ms", "async ms", "alignment ms", "incremental B",
               "changelog B", "materialized B", "base checkpoint", "lag"]
    rows = [[r[c] for c in cols] for r in reversed(data["checkpoints"])]
    return _table(headers, rows, "history")


def _materializations(data: dict[str, Any]) -> str:
    rows = [[m["id"], m["checkpoint_id"], m["time"], m["rows"], m["bytes"], m["files"], m["bytes_written"],
             m["bytes_reused"], m["duration_ms"]] for m in reversed(data["materializations"])]
    return _table(["id", "checkpoint", "published (UTC)", "rows", "bytes", "files", "written B", "reused B",
                   "build ms"], rows, "materializations")


def _savepoints(data: dict[str, Any]) -> str:
    rows = [[s["name"], s.get("checkpoint_id"), s.get("created"), s.get("rows"), s.get("bytes"), s.get("files"),
             s.get("error")] for s in data["savepoints"]]
    return _table(["name", "checkpoint", "created (UTC)", "rows", "bytes", "files", "error"], rows, "savepoints")


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 1.5em .5em 0; font-size: .85em; display: inline-table;
        vertical-align: top; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
section.chart { margin: 1em 0; } .no-data { color: #777; font-style: italic; }
.caption { font-size: .85em; color: #555; margin: .2em 0 .6em; }
ul.notes { font-size: .85em; color: #444; }
"""


CAPTIONS = {
    "checkpoint-duration": "Bars: the parts each checkpoint's publisher measured (maxima over tasks); line: the "
    "end-to-end duration where recorded.",
    "checkpoint-size": "Incremental: the new changelog a checkpoint references; full: every changelog block and "
    "state-table file it references (what a restore of it reads).",
    "changelog-vs-materialized": "What each checkpoint references, stacked: the changelog tail grows until the "
    "backends adopt a new materialization, then drops (the saw-tooth); diamonds: materializations published.",
    "materialization-lag": "How far the materialization a checkpoint builds on is behind it.",
}


def _caption(name: str, data: dict[str, Any]) -> str:
    latest = data["counts"]["latest_checkpoint"]
    if name == "state-per-operator" and latest is not None:
        return (f"Checkpoint {latest}: the state-table bytes it reaches per state (with rows), and its changelog "
                "tail per operator.")
    if name == "key-group-skew" and data["skew"] and data["skew"]["series"]:
        skew = data["skew"]
        how = ("counted from the key_group column of the state tables" if skew["granularity"] == "key group"
               else "each table file's rows spread over its key groups")
        return f"Checkpoint {skew['checkpoint_id']}: rows of its materialized state tables per key group ({how})."
    return CAPTIONS.get(name, "")


def render_html(data: dict[str, Any]) -> str:
    """The whole page, self-contained: plotly.js is inlined once in the head."""
    parts = []
    for name, title in CHARTS.items():
        fig = FIGURES[name](data)
        if fig is None:
            body = f'<p class="no-data">No data: {html.escape(NO_DATA[name])}.</p>'
        else:
            body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{name}", config=CONFIG)
        caption = _caption(name, data) if fig is not None else ""
        if caption:
            body += f'<p class="caption">{html.escape(caption)}</p>'
        if name == "savepoints" and data["savepoints"]:
            body += _savepoints(data)
        parts.append(f'<section class="chart" id="chart-{name}"><h2>{html.escape(title)}</h2>{body}</section>')
        if name == "checkpoint-duration":
            parts.append(f"<h2>Checkpoint history (newest first)</h2>{_history(data)}")
        elif name == "materialization-lag":
            parts.append(f"<h2>Materializations (newest first)</h2>{_materializations(data)}")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in data["notes"])
    title = f"statelog: {redact_url(data['root'])}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head><body>'
        f"<h1>{html.escape(title)}</h1>{_overview(data)}"
        f'<h2>Not recorded / notes</h2><ul class="notes">{notes}</ul>'
        + "".join(parts)
        + "</body></html>\n"
    )


# -- serving -------------------------------------------------------------------------------------


def make_server(gather: Callable[[], dict[str, Any]], host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server (not started) answering ``/`` with the page and ``/data.json`` with the data.

    ``gather`` runs once per request, one request at a time (the page is rebuilt from the
    root on every reload). A failure to read the root answers 500 with its one-line message.
    """
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "statelog-ui"

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
            path = self.path.split("?", 1)[0]
            if path not in ("/", "/index.html", "/data.json"):
                self._send(404, "text/plain; charset=utf-8", b"not found: the page is at / and its data at /data.json\n")
                return
            try:
                with lock:
                    data = gather()
                    if path == "/data.json":
                        body, ctype = json.dumps(data, indent=1).encode(), "application/json"
                    else:
                        body, ctype = render_html(data).encode(), "text/html; charset=utf-8"
            except StatelogError as e:
                log.warning("statelog ui: %s", e)
                self._send(500, "text/plain; charset=utf-8", f"{e}\n".encode())
                return
            self._send(200, ctype, body)

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.info("%s %s", self.address_string(), format % args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
