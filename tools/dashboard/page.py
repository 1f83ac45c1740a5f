"""The ``statelog ui`` page: the data of :mod:`tools.dashboard.data` with the charts of
:mod:`tools.dashboard.figures`.

:func:`render_html` turns the gathered data into one self-contained HTML page (plotly.js
inlined, no network access needed, so ``--out report.html`` can be opened anywhere);
:func:`make_server` serves it over HTTP as a live page: every :data:`LIVE_INTERVAL_S` seconds
it fetches ``/live.json`` (:func:`live_parts`: the HTML of its tables and each chart's plotly
figure, read afresh from the root) and redraws in place, without a reload. Each chart is a
``<section class="chart" id="chart-NAME">`` holding the plotly ``<div id="plot-NAME">``; a
chart without data shows a ``<p class="no-data">`` that says why (``docs/cli.md``, *ui*). The
page fits any width from 400 px (wide tables scroll inside their box, charts resize).
"""

from __future__ import annotations

import html
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import plotly.offline

from statelog.errors import StatelogError
from statelog.store import redact_url
from tools.dashboard.figures import CHARTS, CONFIG, FIGURES, NO_DATA
from tools.dashboard.live import LIVE_INTERVAL_S

log = logging.getLogger(__name__)

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
    return f'<div class="scroll"><table class="{cls}">{thead}<tbody>{body}</tbody></table></div>'


def _age(ms: int | None) -> str | None:
    if ms is None:
        return None
    s = ms / 1000
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _overview(data: dict[str, Any]) -> str:
    c, job, s = data["counts"], data["job"], data["summary"]
    rows = [
        ["root", redact_url(data["root"])], ["job id", job["job_id"]],
        ["max parallelism", job["max_parallelism"]], ["created", job["created"]],
        ["retained checkpoints", c["checkpoints"]], ["latest checkpoint", c["latest_checkpoint"]],
        ["latest checkpoint age", _age(c["latest_checkpoint_age_ms"])],
        ["materializations", c["materializations"]], ["savepoints", c["savepoints"]],
        ["page data read", data["generated"]],
    ]  # fmt: skip
    summary = [
        [name, *(None if s[key] is None else s[key][k] for k in ("min", "avg", "max"))]
        for key, name in (
            ("duration_ms", "duration ms (end to end, else sync + async + alignment)"),
            ("full_bytes", "full size, bytes"), ("incremental_bytes", "incremental size, bytes"),
            ("base_age_checkpoints", "base age, checkpoints"),
        )
    ]  # fmt: skip
    return _table(None, rows, "overview") + _table(["summary (retained)", "min", "avg", "max"], summary, "summary")


def _live(data: dict[str, Any]) -> str:
    live, mat = data["live"], data["materializer"]
    restart, failure = live["last_restart"], live["last_failure"]
    job = [
        ["latest checkpoint", live["latest_checkpoint"]],
        ["checkpoint age", _age(live["latest_checkpoint_age_ms"])],
        [f"throughput ({live['throughput_of']}/s)", live["throughput_per_s"]],
        ["source records (this attempt)", live["records"]], ["records out", live["records_out"]],
        ["attempt", live["attempt"]],
        ["restarts", live["restarts"]],
        ["last restart cause", None if restart is None else f"{restart['time']}: {restart.get('cause')}"],
        ["failed checkpoints", live["failed_checkpoints"]],
        ["last failure", None if failure is None else f"{failure['time']}: checkpoint {failure.get('checkpoint_id')}: "
                                                      f"{failure.get('reason')}"],
        ["watermark (ms)", live["watermark_ms"]], ["Kafka lag (records)", live["kafka_lag"]],
        ["checkpoints in the history", live["history_checkpoints"]],
    ]  # fmt: skip
    lease = mat["lease"]
    daemon = [
        ["leader lease", "never taken (no daemon has run on this root)" if lease is None else
         f"{lease['state']}: {lease['owner']} (host {lease['host']}, pid {lease['pid']}, generation {lease['generation']})"],
        ["last lease activity", None if lease is None else f"{_age(int(lease['last_activity_age_s'] * 1000))} ago"],
        ["materialization lag", None if mat["materialization_lag_checkpoints"] is None else
         f"{mat['materialization_lag_checkpoints']} checkpoints, {_age(mat['materialization_lag_ms'])}"],
    ]  # fmt: skip
    for d in mat["daemons"]:
        cycle = d.get("last_cycle") or {}
        daemon.append([f"daemon {d.get('owner')}", f"last cycle {_age(int(d['age_s'] * 1000))} ago: {cycle.get('action')}"
                       f"{' (failed)' if cycle.get('failed') else ''}, {d.get('cycles')} cycles"])  # fmt: skip
        daemon.append([f"daemon {d.get('owner')} last error", d.get("last_error") or "none"])
    return (
        '<div class="panel"><h2>Running job</h2>' + _table(None, job, "live") + "</div>"
        '<div class="panel"><h2>Materializer daemon</h2>' + _table(None, daemon, "daemon") + "</div>"
    )


def _history(data: dict[str, Any]) -> str:
    cols = ["checkpoint_id", "time", "duration_ms", "sync_ms", "async_ms", "alignment_ms", "incremental_bytes",
            "changelog_bytes", "materialized_bytes", "materialized_checkpoint", "base_age_checkpoints"]
    headers = ["id", "time (UTC)", "duration ms", "sync ms", "async ms", "alignment ms", "incremental B",
               "changelog B", "materialized B", "base checkpoint", "base age"]
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
html { -webkit-text-size-adjust: 100%; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: .8em; color: #222; background: #fff;
       max-width: 1600px; box-sizing: border-box; overflow-wrap: break-word; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.4em; }
.scroll { display: inline-block; max-width: 100%; overflow-x: auto; vertical-align: top; margin: .4em 0;
          padding-right: 1.2em; box-sizing: border-box; }
table { border-collapse: collapse; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.overview td, table.live td, table.daemon td { overflow-wrap: anywhere; }
table.summary, table.history, table.materializations, table.savepoints { white-space: nowrap; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.panel { display: inline-block; vertical-align: top; max-width: 100%; padding-right: 1.5em; box-sizing: border-box; }
.panel td:last-child { text-align: left; max-width: 40em; }
section.chart { margin: 1em 0; max-width: 100%; } .plotly-graph-div { max-width: 100%; }
.no-data { color: #777; font-style: italic; }
.caption { font-size: .85em; color: #555; margin: .2em 0 .6em; }
ul.notes { font-size: .85em; color: #444; padding-left: 1.2em; }
#live-status { font-size: .85em; color: #555; }
"""


CAPTIONS = {
    "checkpoint-duration": "Lines: the end-to-end duration of each checkpoint (every checkpoint of the history) and its "
    "sync, async and alignment parts, each the maximum over tasks, so none exceeds the end-to-end line; they are "
    "not stacked, as the parts of different tasks overlap in time. Crosses: failed checkpoints.",
    "checkpoint-throughput": "Source records per second between checkpoints (the runtime's sources, a consumer "
    "loop's job.metrics.records_in) and the state changes each checkpoint wrote (bars); dashed lines: restarts.",
    "checkpoint-size": "Incremental: the new changelog a checkpoint references (history); full: every changelog block "
    "and state-table file a retained checkpoint references (what a restore of it reads).",
    "changelog-vs-materialized": "What each retained checkpoint references, stacked: the changelog tail grows until "
    "the backends adopt a new materialization, then drops (the saw-tooth); diamonds: materializations published.",
    "base-age": "Base age: how far the materialization a checkpoint builds on is behind it. The daemon's "
    "materialization lag (newest checkpoint against newest materialization) is in the materializer table.",
}


def _caption(name: str, data: dict[str, Any]) -> str:
    latest = data["counts"]["latest_checkpoint"]
    if name == "state-per-operator" and latest is not None:
        base = data["operators"][0].get("base_checkpoint") if data["operators"] else None
        where = "no materialized base" if base is None else f"the rows and bytes of its base, checkpoint {base}'s materialization"
        return (f"Checkpoint {latest}: {where}, and its changelog tail per operator (the changes since the base, "
                "not counted in the rows).")  # fmt: skip
    if name == "key-group-skew" and data["skew"] and data["skew"]["series"]:
        skew = data["skew"]
        how = ("counted from the key_group column of the state tables" if skew["granularity"] == "key group"
               else "each table file's rows spread over its key groups")
        return (f"The materialization of checkpoint {skew['base_checkpoint']} that checkpoint {skew['checkpoint_id']} "
                f"builds on: rows per key group ({how}); changes since are not counted.")  # fmt: skip
    return CAPTIONS.get(name, "")


def _figure_json(data: dict[str, Any]) -> dict[str, Any]:
    """Per chart its plotly figure as JSON-ready data (``None``: no data)."""
    out = {}
    for name in CHARTS:
        fig = FIGURES[name](data)
        out[name] = None if fig is None else json.loads(fig.to_json())
    return out


def _extra(name: str, data: dict[str, Any], drawn: bool) -> str:
    caption = _caption(name, data) if drawn else ""
    body = f'<p class="caption">{html.escape(caption)}</p>' if caption else ""
    if name == "savepoints" and data["savepoints"]:
        body += _savepoints(data)
    return body


def live_parts(data: dict[str, Any]) -> dict[str, Any]:
    """What the live page replaces on each refresh: the HTML of its parts and the figures."""
    figures = _figure_json(data)
    parts = {"part-head": _head(data), "part-history": _history(data), "part-materializations": _materializations(data)}
    parts.update({f"extra-{name}": _extra(name, data, figures[name] is not None) for name in CHARTS})
    no_data = {name: _no_data(name) for name in CHARTS}
    return {"generated": data["generated"], "parts": parts, "figures": figures, "no_data": no_data}


def _no_data(name: str) -> str:
    return f'<p class="no-data">No data: {html.escape(NO_DATA[name])}.</p>'


def _head(data: dict[str, Any]) -> str:
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in data["notes"])
    return f'{_overview(data)}{_live(data)}<h2>Not recorded / notes</h2><ul class="notes">{notes}</ul>'


LIVE_SCRIPT = """
const LIVE_MS = %(ms)d, CONFIG = %(config)s;
async function refreshLive() {
  const status = document.getElementById('live-status');
  try {
    const r = await fetch('live.json', {cache: 'no-store'});
    if (!r.ok) throw new Error(r.status + ' ' + (await r.text()));
    const d = await r.json();
    for (const [id, h] of Object.entries(d.parts)) { const el = document.getElementById(id); if (el) el.innerHTML = h; }
    for (const [name, fig] of Object.entries(d.figures)) {
      const slot = document.getElementById('slot-' + name);
      if (!fig) { slot.innerHTML = d.no_data[name]; continue; }
      let div = document.getElementById('plot-' + name);
      if (!div) { slot.innerHTML = ''; div = document.createElement('div'); div.id = 'plot-' + name; slot.appendChild(div); }
      await Plotly.react(div, fig.data, fig.layout, CONFIG);
    }
    status.textContent = 'live: refreshed every ' + LIVE_MS / 1000 + ' s, data read ' + d.generated;
    document.body.dataset.refreshed = d.generated;
  } catch (e) {
    status.textContent = 'live: the last refresh failed (' + e + '); retrying every ' + LIVE_MS / 1000 + ' s';
  }
  setTimeout(refreshLive, LIVE_MS);
}
setTimeout(refreshLive, LIVE_MS);
"""


def render_html(data: dict[str, Any], live_interval_s: float | None = None) -> str:
    """The whole page, self-contained: plotly.js is inlined once in the head. With
    ``live_interval_s`` the page refreshes its parts and charts from ``live.json`` that often."""
    parts = []
    for name, title in CHARTS.items():
        fig = FIGURES[name](data)
        if fig is None:
            body = _no_data(name)
        else:
            body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{name}", config=CONFIG)
        parts.append(
            f'<section class="chart" id="chart-{name}"><h2>{html.escape(title)}</h2><div class="slot" id="slot-{name}">'
            f'{body}</div><div id="extra-{name}">{_extra(name, data, fig is not None)}</div></section>'
        )
        if name == "checkpoint-duration":
            parts.append(f'<h2>Retained checkpoints (newest first)</h2><div id="part-history">{_history(data)}</div>')
        elif name == "base-age":
            parts.append(f'<h2>Materializations (newest first)</h2><div id="part-materializations">'
                         f"{_materializations(data)}</div>")  # fmt: skip
    title = f"statelog: {redact_url(data['root'])}"
    if live_interval_s is None:
        status, script = f"static report of {data['generated']} (serve it live: statelog ui ROOT)", ""
    else:
        status = f"live: refreshed every {live_interval_s:g} s"
        script = "<script>" + LIVE_SCRIPT % {"ms": int(live_interval_s * 1000), "config": json.dumps(CONFIG)} + "</script>"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head><body>'
        f'<h1>{html.escape(title)}</h1><p id="live-status">{html.escape(status)}</p>'
        f'<div id="part-head">{_head(data)}</div>'
        + "".join(parts)
        + script
        + "</body></html>\n"
    )


# -- serving -------------------------------------------------------------------------------------


def make_server(
    gather: Callable[[], dict[str, Any]], host: str, port: int, live_interval_s: float = LIVE_INTERVAL_S
) -> ThreadingHTTPServer:
    """An HTTP server (not started) answering ``/`` with the live page, ``/live.json`` with what
    the page refreshes every ``live_interval_s`` seconds and ``/data.json`` with the data.

    ``gather`` runs once per request, one request at a time (every answer is read afresh from
    the root). A failure to read the root answers 500 with its one-line message.
    """
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "statelog-ui"

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
            path = self.path.split("?", 1)[0]
            if path not in ("/", "/index.html", "/data.json", "/live.json"):
                self._send(404, "text/plain; charset=utf-8",
                           b"not found: the page is at /, its data at /data.json and /live.json\n")  # fmt: skip
                return
            try:
                with lock:
                    data = gather()
                    if path == "/data.json":
                        body, ctype = json.dumps(data, indent=1).encode(), "application/json"
                    elif path == "/live.json":
                        body, ctype = json.dumps(live_parts(data)).encode(), "application/json"
                    else:
                        body, ctype = render_html(data, live_interval_s).encode(), "text/html; charset=utf-8"
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
