"""The report's page (:func:`render_html`): self-contained, so it opens offline on a login node: plotly's
JavaScript inlined, the numbers as JSON, tables for what is not charted. The only module of the workspace that
imports plotly (``.importlinter`` contract ``plotly-in-report``), and only when a page is drawn."""

from __future__ import annotations

import html
from typing import Any

import msgspec

from ddslurm.launcher.report._model import (
    PHASES,
    SAMPLE_CHARS,
    HostedReport,
    RunConfiguration,
    RunReport,
    SampleRows,
    moment,
    seconds_between,
)
from ddslurm.launcher.runs._money import money

_PHASE_LABELS = {"waiting": "waiting for the GPU stage", "spare": "spare: waiting for a worker"}
"""A phase's name on the page where it is not its name in the numbers."""
_STAGE_LABELS = {"gpu": "GPU stage", "cpu": "CPU stage"}
_STAGE_COLOURS = {None: ("#3d7be8", "#1d2733"), "gpu": ("#3d7be8", "#1d4fa8"), "cpu": ("#3dbf6e", "#1f7a43")}
_ENDINGS = {"failed": ("#d9534f", "x"), "cancelled": ("#5f6b7a", "square"), "partial": ("#b8860b", "diamond")}
"""How an attempt that did not succeed is marked at its end on the timeline: colour and marker symbol."""

_LEGEND = {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"}
"""Every chart's legend: one row above the plot, where it covers no axis label (plotly widens the top margin)."""


def _stage(stage: str | None) -> str:
    return _STAGE_LABELS.get(stage or "", "")


_COLOURS = {
    "waiting": "#d5dbe1",
    "queued": "#9aa5b1",
    "startup": "#e8a33d",
    "spare": "#b9c8e8",
    "generating": "#3d7be8",
    "publishing": "#3dbf6e",
}

# A table wider than the window (a phone's) scrolls in its own box, so the page never does; a narrow window gets
# narrower margins and no plotly toolbar, which would stand over the legend there (touch still zooms and pans).
# The scroll bar is there from the start: a chart is drawn at its container's width when its script runs, and a
# scroll bar that appeared later, once the page had grown, would cut off the right edge of every chart drawn before.
_CSS = """
html{overflow-y:scroll}
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1d2733}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea}
.muted{color:#5f6b7a} .cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:20px}
table{border-collapse:collapse;font-size:13px;margin:6px 0;display:block;max-width:100%;overflow-x:auto}
td,th{border:1px solid #dde3ea;padding:4px 8px}
th{background:#f3f6f9;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.chart{min-height:320px} h3{font-size:15px;margin:18px 0 6px}
.wide{overflow-x:auto} .wide td{max-width:420px;white-space:pre-wrap;overflow-wrap:anywhere;vertical-align:top}
pre{background:#f3f6f9;border:1px solid #dde3ea;border-radius:6px;padding:10px;font-size:12px;
white-space:pre-wrap;overflow-wrap:anywhere}
@media (max-width:600px){body{margin:10px} .cards{gap:8px} .card{min-width:0;padding:8px 10px}
.modebar-container{display:none}}
"""


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{_esc(v)}</td>" for i, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _time_axis(times: list[str]) -> dict[str, Any]:
    """A date axis in UTC with ticks of the time of day only (plotly's own ticks add the date under the first one,
    where the legend or the page cut it off): the date is in the title, the first moment charted."""
    known = sorted(t for t in (moment(x) for x in times) if t is not None)
    title = f"time (UTC)<br>from {known[0]:%Y-%m-%d %H:%M:%S}" if known else "time (UTC)"  # fits a phone's chart
    stops = [
        {"dtickrange": [None, 1000], "value": "%H:%M:%S.%L"},
        {"dtickrange": [1000, 60000], "value": "%H:%M:%S"},
        {"dtickrange": [60000, 86400000], "value": "%H:%M"},
        {"dtickrange": [86400000, None], "value": "%b %d"},
    ]
    return {"type": "date", "title": title, "tickformatstops": stops, "automargin": True}


def _step(top: float) -> int:
    """A round step (1, 2 or 5 x 10^n) that divides 0..``top`` into at most 5 intervals: an axis of counts."""
    scale = 1
    while True:
        for step in (scale, 2 * scale, 5 * scale):
            if top <= 5 * step:
                return step
        scale *= 10


def _count_axis(title: str, top: float) -> dict[str, Any]:
    """An axis of whole counts from 0: ticks a round step apart, never a fraction."""
    return {"title": title, "rangemode": "tozero", "tickmode": "linear", "tick0": 0, "dtick": _step(top),
            "tickformat": ",d", "automargin": True}  # fmt: skip


def _figures(report: RunReport) -> dict[str, Any]:
    import plotly.graph_objects as go

    figures: dict[str, Any] = {}
    if report.timeline:
        fig = go.Figure()
        labels = {
            id(s): " · ".join(
                x for x in (f"shard {s.shard}", _stage(s.stage), s.attempt, s.state if s.state in _ENDINGS else "") if x
            )
            for s in report.timeline
        }
        times: list[str] = []
        for name in PHASES:
            spans = [(s, p) for s in report.timeline for p in s.phases if p.name == name]
            if not spans:
                continue
            times += [p.start for _, p in spans]
            fig.add_trace(
                go.Bar(
                    name=_PHASE_LABELS.get(name, name),
                    orientation="h",
                    y=[labels[id(s)] for s, _ in spans],
                    base=[p.start for _, p in spans],
                    x=[p.seconds * 1000 for _, p in spans],
                    marker_color=_COLOURS[name],
                    customdata=[[s.state, s.reason or "", round(p.seconds, 2), s.job] for s, p in spans],
                    hovertemplate="%{y}<br>"
                    + _PHASE_LABELS.get(name, name)
                    + ": %{customdata[2]} s<br>state %{customdata[0]} %{customdata[1]}<br>job %{customdata[3]}"
                    "<extra></extra>",
                )
            )
        for state, (colour, symbol) in _ENDINGS.items():
            ended = [(s, at) for s in report.timeline if s.state == state if (at := _ended(s)) is not None]
            if not ended:
                continue
            fig.add_trace(
                go.Scatter(
                    name=f"ended {state}",
                    x=[at for _, at in ended],
                    y=[labels[id(s)] for s, _ in ended],
                    mode="markers",
                    marker={"color": colour, "symbol": symbol, "size": 12, "line": {"color": "#ffffff", "width": 1}},
                    customdata=[[s.reason or state, s.job] for s, _ in ended],
                    hovertemplate="%{y}<br>ended "
                    + state
                    + ": %{customdata[0]}<br>job %{customdata[1]}<extra></extra>",
                )
            )
        fig.update_layout(
            barmode="overlay",
            xaxis=_time_axis(times),
            yaxis={"autorange": "reversed", "type": "category", "automargin": True},
            height=max(260, 90 + 26 * len(report.timeline)),
            margin={"l": 10, "r": 10, "t": 30, "b": 40},
            legend=_LEGEND,
        )
        figures["timeline"] = fig
    if report.batches:
        fig = go.Figure()
        stages = list(dict.fromkeys(b.stage for b in report.batches))
        headline = {r.stage: r.records_per_second for r in report.stages}
        for stage in stages:
            bar, line = _STAGE_COLOURS.get(stage, _STAGE_COLOURS[None])
            suffix = f" · {_stage(stage)}" if stage else ""
            bins = [b for b in report.rate if b.stage == stage]
            fig.add_trace(
                go.Bar(
                    name=f"records/s{suffix}",
                    x=[b.start for b in bins],
                    y=[b.rate for b in bins],
                    width=[_ms(b.start, b.end) for b in bins],
                    offset=0,
                    marker_color=bar,
                    opacity=0.6,
                    customdata=[[b.rows, b.generating_s] for b in bins],
                    hovertemplate="%{y} records/s: %{customdata[0]} rows in %{customdata[1]} s generating"
                    "<extra></extra>",
                )
            )
            if (rate := headline.get(stage)) is not None and bins:
                fig.add_trace(
                    go.Scatter(
                        name=f"records/s over the run{suffix}",
                        x=[bins[0].start, bins[-1].end],
                        y=[rate, rate],
                        mode="lines",
                        line={"dash": "dash", "color": line, "width": 1.5},
                    )
                )
            points = [b for b in report.batches if b.stage == stage]
            fig.add_trace(
                go.Scatter(
                    name=f"records generated{suffix}",
                    x=[b.at for b in points],
                    y=[b.total for b in points],
                    mode="lines+markers",
                    line={"shape": "hv", "color": line},
                    yaxis="y2",
                )
            )
        most = max(b.total for b in report.batches)
        fig.update_layout(
            barmode="overlay",
            xaxis=_time_axis([b.start for b in report.rate] + [b.at for b in report.batches]),
            yaxis={"title": "records/s", "rangemode": "tozero", "automargin": True},
            yaxis2={**_count_axis("records", most), "overlaying": "y", "side": "right", "showgrid": False},
            height=360,
            margin={"l": 10, "r": 10, "t": 30, "b": 40},
            legend=_LEGEND,
        )  # fmt: skip
        figures["throughput"] = fig
    if report.models:
        fig = go.Figure()
        names = [f"{m.alias} ({'local' if m.local else 'hosted'})" for m in report.models]
        fig.add_trace(
            go.Bar(name="successful", x=names, y=[m.successful for m in report.models], marker_color="#3dbf6e")
        )
        fig.add_trace(go.Bar(name="failed", x=names, y=[m.failed for m in report.models], marker_color="#d9534f"))
        fig.update_layout(
            barmode="stack",
            yaxis=_count_axis("requests", max(m.successful + m.failed for m in report.models)),
            height=300,
            margin={"t": 30, "b": 40},
        )
        figures["models"] = fig
    gpu = report.gpu
    if gpu is not None and ((gpu.allocated_gpu_hours or 0) > 0 or gpu.generating_gpu_hours > 0):
        shown = [("allocated", gpu.allocated_gpu_hours, "#9aa5b1"), ("generating", gpu.generating_gpu_hours, "#3d7be8")]
        known = [(x, y, c) for x, y, c in shown if y is not None]
        fig = go.Figure(
            go.Bar(x=[x for x, _, _ in known], y=[y for _, y, _ in known], marker_color=[c for _, _, c in known])
        )
        fig.update_layout(yaxis={"title": "GPU-hours"}, height=280, margin={"t": 30, "b": 40})
        figures["gpu"] = fig
    hosted = report.hosted
    if hosted is not None and hosted.minutes:
        fig = go.Figure()
        for key in hosted.keys:
            mine = [m for m in hosted.minutes if m.provider == key.provider]
            if not mine:
                continue
            x = [m.start for m in mine]
            fig.add_trace(go.Bar(name=f"{key.provider}: sent", x=x, y=[m.requests - m.limited for m in mine]))
            fig.add_trace(go.Bar(name=f"{key.provider}: answered 429", x=x, y=[m.limited for m in mine],
                                 marker_color="#d9534f"))  # fmt: skip
            limit = key.requests_per_minute or key.stated_requests_per_minute
            if limit:
                fig.add_trace(go.Scatter(name=f"{key.provider}: limit a minute", x=x, y=[limit] * len(x),
                                         mode="lines", line={"dash": "dash"}))  # fmt: skip
        fig.update_layout(barmode="stack", xaxis=_time_axis([m.start for m in hosted.minutes]),
                          yaxis={"title": "requests a minute"}, height=300, margin={"t": 30, "b": 40},
                          legend=_LEGEND)  # fmt: skip
        figures["hosted"] = fig
    if report.failures:
        fig = go.Figure(
            go.Bar(x=[f.reason for f in report.failures], y=[f.count for f in report.failures], marker_color="#d9534f")
        )
        fig.update_layout(
            yaxis=_count_axis("attempts", max(f.count for f in report.failures)), height=280, margin={"t": 30, "b": 40}
        )
        figures["failures"] = fig
    return figures


def _ended(span: Any) -> str | None:
    """When an attempt ended, as the timeline shows it: its record's end, else the end of its last phase."""
    return span.ended_at or (span.phases[-1].end if span.phases else None)


def _ms(start: str, end: str) -> float:
    seconds = seconds_between(moment(start), moment(end))
    return seconds * 1000 if seconds is not None else 0.0


def _chart(figures: dict[str, Any], name: str) -> str:
    fig = figures.get(name)
    if fig is None:
        return ""
    config = {"displaylogo": False, "responsive": True}
    div: str = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{name}", config=config)
    return f'<div class="chart" data-chart="{name}">{div}</div>'


def _money(value: float | None, currency: str | None) -> str:
    return "-" if value is None or currency is None else money(value, currency, 4)


def _hosted_section(hosted: HostedReport, figures: dict[str, Any]) -> list[str]:
    """Per key: its requests a minute against the limit its clients learned, then per model what every attempt
    spent and what the winners kept, in tokens and money."""
    cur = hosted.currency
    rows = [
        [m.provider, m.key_env or "-", m.model, ", ".join(m.aliases) or "-", _num(m.requests), _num(m.limited),
         _num(m.failed), _num(m.unanswered), _num(m.input_tokens), _num(m.output_tokens), _money(m.cost, cur),
         _num(m.kept_requests), _num(m.kept_input_tokens + m.kept_output_tokens), _money(m.kept_cost, cur)]
        for m in hosted.models
    ]  # fmt: skip
    keys = [
        [k.provider, k.key_env or "-", _num(k.requests_per_minute), _num(k.tokens_per_minute), _num(k.in_flight, 1),
         " / ".join(_num(v) for v in (k.stated_in_flight, k.stated_requests_per_minute, k.stated_tokens_per_minute))]
        for k in hosted.keys
    ]  # fmt: skip
    per_1000 = _money(hosted.cost_per_1000_kept_rows, cur)
    notes = (
        f"<p class=muted>spent: every attempt's requests; kept: the winners' attempts (and those they resumed "
        f"from), {hosted.kept_rows:,} rows. Everything spent per 1,000 kept rows: {_esc(per_1000)}. "
        "unanswered: in flight when a client was killed (the provider may have billed them).</p>"
    )
    if cur is None:
        notes += "<p class=muted>No price file: the run file's <code>prices</code> names one for dollars.</p>"
    elif hosted.unpriced:
        notes += f"<p class=muted>No price for: {_esc(', '.join(hosted.unpriced))}.</p>"
    key_head = ["provider", "key", "learned a minute", "learned tokens a minute", "at once (end)",
                "stated at once / a minute / tokens"]  # fmt: skip
    model_head = ["provider", "key", "model", "aliases", "requests", "429", "failed", "unanswered", "input tokens",
                  "output tokens", "spent", "kept requests", "kept tokens", "kept"]  # fmt: skip
    return [
        "<h2>Hosted keys</h2>",
        _chart(figures, "hosted"),
        _table(key_head, keys, {2, 3, 4}) if keys else "",
        _table(model_head, rows, set(range(4, 14))) if rows else "<p>No hosted request recorded.</p>",
        notes,
    ]


def _cpu_section(report: RunReport) -> list[str]:
    cpu = report.cpu
    if cpu is None:
        return []
    held = (
        f"Allocated {_num(cpu.allocated_cpu_hours, 3)} CPU-hours (sacct: elapsed x CPUs of every allocation)"
        if cpu.allocated_cpu_hours is not None
        else "CPU-hours allocated unknown (sacct could not be read)"
    )
    cost = f" ({_money(cpu.allocated_cost, cpu.currency)})" if cpu.allocated_cost is not None else ""
    return [
        "<h2>CPU time</h2>",
        f"<p>{held}{_esc(cost)}; the client steps (Data Designer's processes) used {_num(cpu.client_cpu_hours, 3)} "
        f"CPU-hours ({cpu.client_steps} of {cpu.attempts} attempt(s) recorded theirs).</p>",
    ]


def _sample_section(sample: SampleRows) -> list[str]:
    cut = f", values cut to {SAMPLE_CHARS} characters" if sample.truncated else ""
    return [
        "<h3>Sample rows</h3>",
        f"<p class=muted>The dataset's first {len(sample.rows)} row(s){cut}.</p>",
        f'<div class="wide" data-section="sample">{_table(sample.columns, sample.rows)}</div>'
        if sample.rows
        else "<p>The dataset has no rows.</p>",
    ]


def _configuration_section(config: RunConfiguration) -> list[str]:
    layout = [
        ["records", _num(config.records)],
        ["shards", _num(config.shards)],
        ["allocations", _num(config.allocations) if config.allocations is not None else "one array task a shard"],
        ["client workers per allocation", _num(config.client_workers)],
        ["records a batch (buffer_size)", _num(config.buffer_size)],
        ["partition", config.partition or "-"],
        ["time limit (min)", _num(config.time_minutes)],
        ["CPUs per allocation", _num(config.cpus_per_task)],
        ["GPUs per allocation", _num(config.gpus)],
    ]
    if config.stages:
        layout.append(["stages", " then ".join(config.stages)])
        layout.append(["CPU-stage client workers", _num(config.cpu_stage_workers)])
    layout += [
        [f"deployment {d.alias}", f"{d.model}: {d.replicas} replica(s) of {d.gpus_per_replica} GPU(s)"]
        for d in config.deployments
    ]
    layout += [
        ["recipe", config.recipe],
        ["ddslurm", config.ddslurm_version or "not recorded"],
        ["Data Designer", config.data_designer_version or "not recorded"],
    ]
    run_file = (
        f"<details open><summary>Run file as submitted</summary><pre>{_esc(config.run_file)}</pre></details>"
        if config.run_file is not None
        else "<p>The run file is not in the run directory.</p>"
    )
    return ["<h2>Configuration</h2>", f'<div data-section="configuration">{_table(["", ""], layout)}</div>', run_file]


def render_html(report: RunReport) -> str:
    """A self-contained page: plotly's JavaScript inlined (no network), the numbers as JSON in
    ``<script type="application/json" id="report-data">``, and tables for what is not charted."""
    from plotly.offline import get_plotlyjs

    figures = _figures(report)
    data = msgspec.json.encode(report).decode().replace("</", "<\\/")
    cards = [
        ("records", f"{report.records_done:,} / {report.records_requested:,}"),
        ("shards done", f"{report.shards_done} / {report.shards}"),
        ("attempts", str(report.attempts)),
        ("wall time", f"{_num(report.wall_s, 1)} s"),
        ("records/s", _num(report.records_per_second)),
    ]
    if report.gpu is not None:
        allocated = report.gpu.allocated_gpu_hours
        cards.append(("GPU-hours allocated", _num(allocated, 3) if allocated is not None else "unknown (no sacct)"))
        cards.append(("GPU-hours generating", _num(report.gpu.generating_gpu_hours, 3)))
        if report.gpu.allocated_cost is not None:
            cards.append(("GPU-hours cost", _money(report.gpu.allocated_cost, report.gpu.currency)))
    elif report.cpu is not None:  # a run without GPUs: its CPU time instead
        cpu = report.cpu
        allocated_cpu = cpu.allocated_cpu_hours
        cards.append(
            ("CPU-hours allocated", _num(allocated_cpu, 3) if allocated_cpu is not None else "unknown (no sacct)")
        )
        cards.append(("CPU-hours client steps", _num(cpu.client_cpu_hours, 3)))
        if cpu.allocated_cost is not None:
            cards.append(("CPU-hours cost", _money(cpu.allocated_cost, cpu.currency)))
    if report.hosted is not None and report.hosted.cost is not None:
        cards.append(("hosted cost", _money(report.hosted.cost, report.hosted.currency)))
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta name=viewport content="width=device-width, initial-scale=1">',  # a phone lays it out at its width
        f"<title>ddslurm report {_esc(report.run_id)}</title><style>{_CSS}</style>",
        f"<script>{get_plotlyjs()}</script></head><body>",
        f"<h1>Run {_esc(report.run_id)}</h1>",
        f'<div class=muted>{_esc(report.run_dir)} · report of {_esc(report.generated_at)}</div><div class="cards">',
        *(f'<div class="card" data-card="{_esc(k)}">{_esc(k)}<b>{_esc(v)}</b></div>' for k, v in cards),
        "</div>",
        "<h2>Timeline of every attempt</h2>",
        "<p class=muted>waiting for the GPU stage (a CPU-stage array's submission to the end of the GPU-stage "
        "attempts before it), queued (to its start), serving start-up (start to serving ready), spare: waiting for a "
        "worker (a spare client's wait for a worker's slot), generating (to the last batch), publishing (to the "
        "winner's publication).</p>",
        _chart(figures, "timeline") or "<p>No attempt has started.</p>",
        "<h2>Records over time</h2>",
        _chart(figures, "throughput") or "<p>No batch has completed.</p>",
        _table(
            ["stage", "rows", "generating (s)", "records/s"],
            [[_stage(r.stage) or "run", _num(r.rows), _num(r.active_s, 1), _num(r.records_per_second)]
             for r in report.stages],
            {1, 2, 3},
        )
        if report.stages
        else "",
        "<p class=muted>records/s: rows over the union of the attempts' generating spans (overlaps counted once), "
        "the dashed line; each bar the same over its bin: the rows its stage generated in the bin (a batch's rows "
        "spread over the time its attempt spent on it) over the seconds of the bin in which the stage was "
        "generating, so the bars, weighted by those seconds, average to the line.</p>",
        "<h2>Models</h2>",
        _chart(figures, "models"),
        _table(
            ["alias", "model", "provider", "where", "requests", "failed", "error rate", "health checks",
             "input tokens", "output tokens", "total tokens", "in use (s)", "tokens/s", "latency (s)"],
            [
                [m.alias, m.model, m.provider or "-", "local" if m.local else "hosted", _num(m.requests),
                 _num(m.failed), f"{m.error_rate:.2%}", _num(m.health_checks), _num(m.input_tokens),
                 _num(m.output_tokens), _num(m.total_tokens), _num(m.active_s, 1), _num(m.tokens_per_second, 1),
                 _num(m.latency_s)]
                for m in report.models
            ],
            {4, 5, 6, 7, 8, 9, 10, 11, 12, 13},
        )
        if report.models
        else "<p>No model usage recorded.</p>",
    ]  # fmt: skip
    if report.gpu is not None:
        gpu = report.gpu
        parts.append("<h2>GPU time</h2>")
        share = f"{gpu.utilisation:.1%}" if gpu.utilisation is not None else "-"
        held = (
            f"Allocated {_num(gpu.allocated_gpu_hours, 3)} GPU-hours (sacct)"
            if gpu.allocated_gpu_hours is not None
            else "GPU-hours allocated unknown (sacct could not be read)"
        )
        parts.append(f"<p>{held}, spent generating {_num(gpu.generating_gpu_hours, 3)} ({share}).</p>")
        parts.append(_chart(figures, "gpu"))
        if gpu.allocations:
            parts.append(
                "<p class=muted>generating: per allocation, the sum over its replicas of the union of the spans in "
                "which the replica had a request in flight (its busy log) x the replica's GPUs, never above what "
                "sacct allocated it.</p>"
            )
            parts.append(
                _table(
                    ["allocation", "GPUs", "allocated (GPU-s)", "servers busy (s)", "from", "replicas busy (s x GPUs)",
                     "generating (GPU-s)"],
                    [
                        [a.job, a.gpus, _num(a.allocated_s, 1), _num(a.busy_s, 1), a.busy_from,
                         ", ".join(f"{r.alias} {r.replica}: {_num(r.busy_s, 1)} x {r.gpus}" for r in a.replicas) or "-",
                         _num(a.generating_gpu_s, 1) + (" (cut to allocated)" if a.clamped else "")]
                        for a in gpu.allocations
                    ],
                    {1, 2, 3, 6},
                )
            )  # fmt: skip
        if gpu.jobs:
            parts.append(
                _table(
                    ["job", "state", "elapsed (s)", "GPUs"],
                    [[j.job, j.state, j.elapsed_s, j.gpus] for j in gpu.jobs],
                    {2, 3},
                )
            )
    if report.cpu is not None:
        parts += _cpu_section(report)
    if report.predicted is not None:
        parts.append("<h2>Predicted and measured</h2>")
        parts.append(
            f"<p class=muted>The planner's prediction for the chosen layout ({report.predicted.allocations} "
            "allocation(s)) beside the run: wall time from the first GPU allocation's start to the last winner's "
            "publication; GPU-hours allocated (sacct); GPU-busy: GPU-hours generating over allocated.</p>"
        )
        parts.append(
            _table(
                ["", "predicted", "measured", "measured / predicted"],
                [[c.what, _num(c.predicted, 3), _num(c.measured, 3), _num(c.ratio, 3)] for c in report.predicted.rows],
                {1, 2, 3},
            )
        )
    if report.facts:
        parts.append("<h2>Facts planned with, and measured</h2>")
        parts.append(
            "<p class=muted>Each number the planner's cost model predicted this run with (the workspace's facts, "
            "the median of the runs it rests on, or a default) beside what this run measured of it; a run whose "
            "attempts did not end cleanly measures no server rate, load or overhead.</p>"
        )
        parts.append(
            _table(
                ["fact", "of", "planned with", "from", "runs", "this run", "this run / planned", "note"],
                [
                    [
                        f.name,
                        f.subject,
                        _num(f.used, 4),
                        f.origin,
                        f.runs,
                        _num(f.measured, 4),
                        _num(f.ratio, 3),
                        f.note,
                    ]
                    for f in report.facts
                ],
                {2, 4, 5, 6},
            )
        )
    if report.hosted is not None:
        parts += _hosted_section(report.hosted, figures)
    parts.append("<h2>Failures</h2>")
    if report.failures:
        parts.append(_chart(figures, "failures"))
        parts.append(
            _table(
                ["reason", "attempts", "shards", "message"],
                [[f.reason, f.count, ", ".join(map(str, f.shards)), f.message or ""] for f in report.failures],
                {1},
            )
        )
    else:
        parts.append("<p>No attempt failed.</p>")
    parts.append("<h2>Dataset</h2>")
    if report.dataset is not None:
        ds = report.dataset
        partial = f"; partial shards: {', '.join(map(str, ds.partial_shards))}" if ds.partial_shards else ""
        parts.append(
            f"<p>{_esc(ds.path)}: {ds.rows:,} rows in {ds.files} file(s), {ds.bytes:,} bytes{_esc(partial)}.</p>"
        )
    else:
        parts.append("<p>Not collected yet (<code>ddslurm collect</code>); columns from the shards' analysis.</p>")
    if report.columns:
        parts.append(
            _table(
                ["column", "type", "rows", "nulls", "min", "max", "kind", "stage", "distinct (max per shard)",
                 "top values", "output tokens (mean)"],
                [
                    [c.name, c.type or "-", _num(c.rows), _num(c.nulls), c.min or "-", c.max or "-",
                     c.column_type or "-", c.stage or "-", _num(c.unique_max),
                     ", ".join(f"{k}: {v}" for k, v in c.top_values) or "-", _num(c.output_tokens_mean)]
                    for c in report.columns
                ],
                {2, 3, 8, 10},
            )
        )  # fmt: skip
    if report.sample is not None:
        parts += _sample_section(report.sample)
    if report.configuration is not None:
        parts += _configuration_section(report.configuration)
    if report.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_esc(n)}</li>" for n in report.notes) + "</ul>")
    parts.append(f'<script type="application/json" id="report-data">{data}</script></body></html>')
    return "\n".join(parts)
