"""The charts of ``statelog ui``: plotly figures drawn from the data of :mod:`tools.dashboard.data`.

Each builder returns a figure or ``None`` (no data; the page says why with :data:`NO_DATA`).
Byte axes use IEC units (KiB, MiB, ...: :func:`bytes_axis`) and hover texts show whole bytes.
The timeline charts draw the checkpoint history (:mod:`tools.dashboard.live`: every checkpoint,
beyond retention), else the retained checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

# the charts, in page order: name -> title (the tests and docs/cli.md list the same names)
CHARTS = {
    "checkpoint-duration": "Checkpoint duration: end to end and its parts, failed checkpoints",
    "checkpoint-throughput": "Throughput at each checkpoint",
    "checkpoint-size": "Checkpoint size: incremental and full",
    "changelog-vs-materialized": "Changelog vs materialized bytes over time",
    "base-age": "Base age: how far each checkpoint's materialization is behind it",
    "state-per-operator": "State per operator: materialized base and changelog tail (latest checkpoint)",
    "key-group-skew": "Key-group skew: rows per key group of the latest checkpoint's materialized base",
    "savepoints": "Savepoints",
}
CONFIG = {"displaylogo": False, "responsive": True}
IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
BYTES_HOVER = "%{y:,d} bytes"


def bytes_axis(values: list[Any], title: str = "bytes (IEC units)") -> dict[str, Any]:
    """A y axis for byte counts: ticks at round multiples of a power of 1024, labelled ``512 KiB``."""
    top = max([v for v in values if isinstance(v, int | float)] or [0])
    power = 0
    while power + 1 < len(IEC_UNITS) and top >= 1024 ** (power + 1):
        power += 1
    unit = 1024**power
    step = unit
    for mult in (1, 2, 5, 10, 20, 50, 100, 200, 500):
        step = mult * unit
        if top / step <= 6:
            break
    ticks = [i * step for i in range(int(top // step) + 2)]
    text = [f"{t // unit:,} {IEC_UNITS[power]}" if t % unit == 0 else f"{t / unit:.1f} {IEC_UNITS[power]}" for t in ticks]
    return {"title": {"text": title}, "tickmode": "array", "tickvals": ticks, "ticktext": text,
            "range": [0, ticks[-1]], "automargin": True}  # fmt: skip


def _layout(fig: go.Figure, **kw: Any) -> go.Figure:
    layout = {"template": "plotly_white", "height": 360, "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
              "legend": {"orientation": "h", "y": -0.25}, "autosize": True}  # fmt: skip
    fig.update_layout(**{**layout, **kw})
    return fig


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r["checkpoint_id"]) for r in rows]


def _completed(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The timeline rows: the history's completed checkpoints, else the retained ones."""
    return data["timeline"]["completed"] or data["checkpoints"]


def duration_figure(data: dict[str, Any]) -> go.Figure | None:
    rows, failed = _completed(data), data["timeline"]["failed"]
    times = [r["time"] for r in rows]
    fig = go.Figure()
    total = [r.get("duration_ms") for r in rows]
    if any(y is not None for y in total):
        fig.add_scatter(x=times, y=total, name="end to end", mode="lines+markers", line={"width": 3},
                        text=_ids(rows), hovertemplate="checkpoint %{text}: %{y:,.1f} ms")  # fmt: skip
    for key, name in (("sync_ms", "sync (max over tasks)"), ("async_ms", "async (max over tasks)"),
                      ("alignment_ms", "alignment (max over tasks)")):  # fmt: skip
        ys = [r.get(key) for r in rows]
        if any(y is not None for y in ys):
            fig.add_scatter(x=times, y=ys, name=name, mode="lines+markers", line={"width": 2})
    if failed:
        fig.add_scatter(x=[f["time"] for f in failed], y=[f.get("duration_ms", 0) for f in failed], name="failed",
                        mode="markers", marker={"symbol": "x", "size": 12, "color": "#d62728"},
                        text=[f"checkpoint {f.get('checkpoint_id')}: {f.get('reason', '')}" for f in failed])  # fmt: skip
    if not fig.data:
        return None
    return _layout(fig, xaxis={"title": {"text": "time (UTC)"}}, yaxis={"title": {"text": "ms"}, "rangemode": "tozero"})


def throughput_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["timeline"]["completed"]
    fig = go.Figure()
    times = [r["time"] for r in rows]
    if any("records_per_s" in r for r in rows):
        fig.add_scatter(x=times, y=[r.get("records_per_s") for r in rows], name="source records per second",
                        mode="lines+markers")  # fmt: skip
    if any("delta_changes" in r for r in rows):
        fig.add_bar(x=times, y=[r.get("delta_changes") for r in rows], name="state changes in the checkpoint",
                    yaxis="y2", opacity=0.8)  # fmt: skip
    if not fig.data:
        return None
    for r in data["timeline"]["restarts"]:
        fig.add_vline(x=r["time"], line={"color": "#d62728", "dash": "dash"})
    return _layout(fig, xaxis={"title": {"text": "time (UTC)"}}, yaxis={"title": {"text": "records/s"}, "rangemode": "tozero"},
                   yaxis2={"title": {"text": "changes"}, "overlaying": "y", "side": "right", "rangemode": "tozero"})  # fmt: skip


def size_figure(data: dict[str, Any]) -> go.Figure | None:
    rows, kept = _completed(data), data["checkpoints"]
    if not rows and not kept:
        return None
    fig = go.Figure()
    inc = [r.get("incremental_bytes") for r in rows]
    if any(v is not None for v in inc):
        fig.add_bar(x=[r["time"] for r in rows], y=inc, name="incremental (new changelog)", hovertemplate=BYTES_HOVER)
    fig.add_scatter(x=[r["time"] for r in kept], y=[r["full_bytes"] for r in kept], mode="lines+markers",
                    name="full (changelog + materialized referenced; retained checkpoints)", hovertemplate=BYTES_HOVER)
    return _layout(fig, xaxis={"title": {"text": "time (UTC)"}}, yaxis=bytes_axis([*inc, *(r["full_bytes"] for r in kept)]))


def sawtooth_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["checkpoints"]
    if not rows:
        return None
    times = [r["time"] for r in rows]
    fig = go.Figure()
    fig.add_scatter(x=times, y=[r["materialized_bytes"] for r in rows], name="materialized (referenced)",
                    mode="lines+markers", stackgroup="size", hovertemplate=BYTES_HOVER)
    fig.add_scatter(x=times, y=[r["changelog_bytes"] for r in rows], name="changelog tail (referenced)",
                    mode="lines+markers", stackgroup="size", hovertemplate=BYTES_HOVER)
    ms = data["materializations"]
    if ms:
        fig.add_scatter(x=[m["time"] for m in ms], y=[m["bytes"] for m in ms], name="materialization published",
                        mode="markers", marker={"symbol": "diamond", "size": 11}, hovertemplate=BYTES_HOVER,
                        text=[f"{m['id']} (checkpoint {m['checkpoint_id']})" for m in ms])
    top = [r["full_bytes"] for r in rows] + [m["bytes"] for m in ms]
    return _layout(fig, xaxis={"title": {"text": "time (UTC)"}}, yaxis=bytes_axis(top))


def base_age_figure(data: dict[str, Any]) -> go.Figure | None:
    rows = data["checkpoints"]
    if not any(r["materialized_checkpoint"] is not None for r in rows):
        return None
    fig = go.Figure()
    fig.add_bar(x=_ids(rows), y=[r["base_age_checkpoints"] for r in rows], name="base age, checkpoints")
    if any(r["base_age_ms"] is not None for r in rows):
        fig.add_scatter(x=_ids(rows), y=[None if r["base_age_ms"] is None else r["base_age_ms"] / 1000 for r in rows],
                        name="base age, seconds", mode="lines+markers", yaxis="y2")
    return _layout(
        fig, xaxis={"title": {"text": "checkpoint"}, "type": "category"},
        yaxis={"title": {"text": "checkpoints"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "seconds"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )  # fmt: skip


def operator_figure(data: dict[str, Any]) -> go.Figure | None:
    ops = data["operators"]
    if not ops:
        return None
    fig = go.Figure()
    names = [o["operator"] for o in ops]
    base = ops[0].get("base_checkpoint")
    tops = [o["changelog_bytes"] + o["materialized_bytes"] for o in ops]
    for state in sorted({s["state"] for o in ops for s in o["states"]}):
        ys = [next((s["bytes"] for s in o["states"] if s["state"] == state), 0) for o in ops]
        rows = [next((s["rows"] for s in o["states"] if s["state"] == state), 0) for o in ops]
        if any(ys):
            fig.add_bar(x=names, y=ys, name=f"{state} (base of checkpoint {base})", text=[f"{r:,} rows" for r in rows],
                        hovertemplate=BYTES_HOVER + " (%{text} at checkpoint " + str(base) + ")")  # fmt: skip
    fig.add_bar(x=names, y=[o["changelog_bytes"] for o in ops], name="changelog tail (changes since the base)",
                hovertemplate=BYTES_HOVER)  # fmt: skip
    return _layout(fig, barmode="stack", xaxis={"title": {"text": "operator"}}, yaxis=bytes_axis(tops))


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
    fig.add_bar(x=[s["name"] for s in sps], y=[s["bytes"] for s in sps], name="bytes", hovertemplate=BYTES_HOVER,
                text=[f"checkpoint {s['checkpoint_id']}, {s['rows']:,} rows" for s in sps])
    return _layout(fig, xaxis={"title": {"text": "savepoint"}}, yaxis=bytes_axis([s["bytes"] for s in sps]))


FIGURES: dict[str, Callable[[dict[str, Any]], go.Figure | None]] = {
    "checkpoint-duration": duration_figure,
    "checkpoint-throughput": throughput_figure,
    "checkpoint-size": size_figure,
    "changelog-vs-materialized": sawtooth_figure,
    "base-age": base_age_figure,
    "state-per-operator": operator_figure,
    "key-group-skew": skew_figure,
    "savepoints": savepoint_figure,
}
NO_DATA = {
    "checkpoint-duration": "no checkpoint records a duration",
    "checkpoint-throughput": "the checkpoint history records no throughput (records per second or state changes)",
    "checkpoint-size": "no retained checkpoint",
    "changelog-vs-materialized": "no retained checkpoint",
    "base-age": "no retained checkpoint builds on a materialization yet",
    "state-per-operator": "no retained checkpoint",
    "key-group-skew": "the latest checkpoint builds on no materialization (the changelog records no per-key-group counts)",
    "savepoints": "no savepoint (create one with `statelog savepoint create ROOT --checkpoint ID --name NAME`)",
}
