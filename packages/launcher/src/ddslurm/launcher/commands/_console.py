"""What ``ddslurm`` shows people, rendered with Rich: the status table, live progress, the dry run, the run list
and log lines.

On a terminal the output is coloured and may be boxed and wrapped to its width. Anywhere else (a pipe, a file, a
test) it is plain text: no colour codes, no box drawing, no wrapping, no trailing blanks; :func:`show` decides.

What only the dry run's text needs (the planner, ``_submit``) is imported by the functions that render it, so the
status and the logs load neither.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

import msgspec
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column, Table
from rich.text import Text

from ddslurm.config import Plan, RunLayout, compact_ranges
from ddslurm.launcher.cluster._slurm import NODE_ENV_ALLOWED
from ddslurm.launcher.runs._find import ListedRun
from ddslurm.launcher.runs._money import money
from ddslurm.launcher.runs._status_model import KeyStatus, RunStatus, ShardStatus

if TYPE_CHECKING:
    from ddslurm.launcher.cluster._doctor_checks import Check
    from ddslurm.launcher.report._model import HostedReport
    from ddslurm.planner import SubmissionPlan

PLAIN_WIDTH = 100_000
"""Plain output is never wrapped: a line as long as its content (a reason, a path) stays one line."""

CHECK_STYLES = {"ok": "green", "problem": "bold red", "skipped": "dim"}
STATE_STYLES = {
    "succeeded": "green",
    "running": "cyan",
    "waiting": "blue",
    "draining": "italic cyan",
    "pending": "yellow",
    "unknown": "yellow",
    "unsubmitted": "yellow",
    "incomplete": "yellow",
    "partial": "magenta",
    "failed": "bold red",
    "corrupt": "bold red",
    "cancelled": "dim",
}
LEVEL_STYLES = {"debug": "dim", "info": "cyan", "warning": "yellow", "error": "bold red", "critical": "bold red"}
_RECORD_KEYS = ("timestamp", "level", "event")


def terminal_console(out: TextIO) -> Console:
    return Console(file=out, highlight=False, emoji=False, markup=False)


def plain(*renderables: RenderableType) -> str:
    """``renderables`` as plain text: no colour, no wrapping, trailing blanks stripped."""
    console = Console(
        file=io.StringIO(),
        width=PLAIN_WIDTH,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
        markup=False,
    )
    with console.capture() as captured:
        console.print(*renderables)
    return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())


def show(out: TextIO, *renderables: RenderableType) -> None:
    """Print to a terminal with Rich, anywhere else as :func:`plain` text."""
    if out.isatty():
        terminal_console(out).print(*renderables)
    else:
        out.write(plain(*renderables))
    out.flush()


def styled(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


# --- status ---


def counts_text(st: RunStatus) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(st.counts.items()))


def stages_text(st: RunStatus) -> str:
    """A two-stage run's rows done in each stage and the fraction of both done (``gpu 30/30 + cpu 3/30 rows
    (55 %)``); empty for a single-stage run."""
    if not st.stages:
        return ""
    rows = " + ".join(f"{s.stage} {s.rows_done}/{s.records}" for s in st.stages)
    return f"{rows} rows ({st.progress * 100:.0f} %)"


def _totals(st: RunStatus) -> str:
    """The records done of those requested, each stage's rows (a two-stage run), and the shards by state."""
    return ", ".join(part for part in (f"{st.records_done}/{st.records_requested} records", stages_text(st)) if part)


def hosted_lines(hosted: HostedReport) -> list[str]:
    """The report's hosted keys as text: per model, spent and kept; then the money per 1,000 kept rows."""
    cur = hosted.currency

    def cost(value: float | None) -> str:
        return "" if value is None or cur is None else ", " + money(value, cur, 4)

    lines = ["  hosted (spent: every attempt / kept: the winners' attempts):"]
    for m in hosted.models:
        lines.append(
            f"    {m.model} ({m.provider}, {m.key_env or 'no key'}): {m.requests:,} requests, {m.limited:,} answered "
            f"429, {m.input_tokens + m.output_tokens:,} tokens{cost(m.cost)} / {m.kept_requests:,} requests, "
            f"{m.kept_input_tokens + m.kept_output_tokens:,} tokens{cost(m.kept_cost)}"
        )
    if hosted.cost_per_1000_kept_rows is not None:
        lines.append(f"    {money(hosted.cost_per_1000_kept_rows, str(cur), 4)} spent per 1,000 kept rows")
    if hosted.unpriced:
        lines.append(f"    no price for: {', '.join(hosted.unpriced)}")
    return lines


def key_line(k: KeyStatus) -> str:
    """One hosted key so far: ``key OPENAI_API_KEY (openai): 812 requests, 3 answered 429 (0.4 %), 1,234,567
    tokens, 4.21 USD; 120 a minute, 16 at once``."""
    share = f" ({k.limited / k.requests:.1%})" if k.requests else ""
    parts = [f"{k.requests:,} requests", f"{k.limited:,} answered 429{share}"]
    if k.failed:
        parts.append(f"{k.failed:,} failed")
    if k.unanswered:
        parts.append(f"{k.unanswered:,} unanswered (in flight when a client was killed)")
    if k.unreached:
        parts.append(f"{k.unreached:,} not delivered (connection refused or closed)")
    parts.append(f"{k.input_tokens + k.output_tokens:,} tokens")
    if k.cost is not None:
        parts.append(money(k.cost, str(k.currency), 2))
    limits = [f"{k.requests_per_minute:,} a minute" if k.requests_per_minute else "",
              f"{k.in_flight:g} at once" if k.in_flight else ""]  # fmt: skip
    learned = ", ".join(x for x in limits if x)
    name = k.key_env or "no key"
    return f"key {name} ({k.provider}): " + ", ".join(parts) + (f"; {learned}" if learned else "")


def status_header(st: RunStatus) -> Text:
    """The lines above the shard table: the run, its directory, and what a cancel or a stopped submission means."""
    head = Text.assemble(
        f"run {st.run_id}: ",
        styled(st.state),
        f"  ({_totals(st)}, {counts_text(st)})",
    )
    lines = [head, Text(f"  dir: {st.run_dir}")]
    unsubmitted = st.counts.get("unsubmitted", 0)
    if st.submission_incomplete:
        lines.append(
            Text(
                f"  submission incomplete: {st.unsubmitted_arrays} array(s) of its plan were not submitted"
                + (f" ({unsubmitted} shard(s) have no task: unsubmitted)" if unsubmitted else "")
                + f"\n    submit the rest: ddslurm submit --continue {st.run_dir}"
                + f"\n    or cancel what was submitted: ddslurm cancel {st.run_dir}",
                style="yellow",
            )
        )
    if st.cancelled_at:
        never = f"; {unsubmitted} shard(s) were never submitted" if unsubmitted else ""
        lines.append(
            Text(f"  cancelled at {st.cancelled_at} (ddslurm cancel){never}; retry --resume-cancelled continues it")
        )
    return Text("\n").join(lines)


def _table(*, boxed: bool) -> Table:
    """A table for a terminal (a rule under the header) or for plain text (no box drawing); two blanks between
    columns either way."""
    if boxed:
        return Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False, header_style="bold")
    return Table(box=None, pad_edge=False, show_edge=False, header_style="bold")


def _attempt_cell(s: ShardStatus) -> str:
    """Which attempt the row shows, counted from 1 (``2 of 3`` when the shard had more than one); never its id."""
    if s.attempt_number is None:
        return "-"
    return f"{s.attempt_number} of {s.attempts}" if s.attempts > 1 else str(s.attempt_number)


def _rows_cell(rows: int | None, records: int) -> str:
    return f"{rows if rows is not None else '-'}/{records}"


def _reason_cell(s: ShardStatus) -> Text:
    """Why the shard failed (or was requeued), and why Slurm keeps its task pending."""
    why = f"{s.reason}: {s.message}" if s.reason and s.message else (s.reason or "")
    text = Text(why, style="red" if s.state in {"failed", "corrupt"} else "")
    if s.pending_reason:
        text.append(("; " if why else "") + f"pending: {s.pending_reason}", style="yellow")
    return text


def shard_table(shards: list[ShardStatus], *, boxed: bool, staged: bool | None = None) -> Table:
    """One row a shard: state, rows done of its records, rows per second, the attempt's number (and how many it
    had), the array task, Slurm's state (and why a pending task waits), and why it failed. ``staged`` (default:
    whether the shards are a two-stage run's): the stage each shard is in, and its rows done in each stage."""
    staged = any(s.stage_rows is not None for s in shards) if staged is None else staged
    table = _table(boxed=boxed)
    table.add_column("SHARD", justify="right", no_wrap=True)
    if staged:
        table.add_column("STAGE", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    for name in ("GPU ROWS", "CPU ROWS") if staged else ("ROWS",):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("ROWS/S", justify="right", no_wrap=True)
    table.add_column("ATTEMPT", no_wrap=True)
    table.add_column("JOB", no_wrap=True)
    table.add_column("SLURM", no_wrap=True)
    table.add_column("REASON", overflow="fold", ratio=1)
    for s in shards:
        stage = [s.stage or "-"] if staged else []
        if staged:
            rows = [_rows_cell(n, s.records) for n in s.stage_rows or (None, None)]
        else:
            rows = [_rows_cell(s.rows, s.records)]
        table.add_row(
            str(s.shard),
            *stage,
            styled(s.state),
            *rows,
            f"{s.rate:.1f}" if s.rate else "",
            _attempt_cell(s),
            s.job_id or "-",
            s.slurm_state or "-",
            _reason_cell(s),
        )
    return table


def status_view(st: RunStatus, *, boxed: bool) -> Group:
    """The header, the shard table, and under it one line per hosted key the run has sent to, and one per failure a
    retry would repeat (``_retry_why.frozen_hints``: what to do instead)."""
    from ddslurm.launcher.runs._retry_why import frozen_hints

    keys = [Text(key_line(k)) for k in st.hosted if k.requests]
    hints = [Text(hint, style="yellow") for hint in frozen_hints(st)]
    return Group(status_header(st), shard_table(st.shards, boxed=boxed), *keys, *hints)


def show_status(out: TextIO, st: RunStatus) -> None:
    show(out, status_view(st, boxed=out.isatty()))


def status_text(st: RunStatus) -> str:
    """The status as plain text (what ``ddslurm status`` prints into a pipe)."""
    return plain(status_view(st, boxed=False))


def summary_line(st: RunStatus) -> str:
    """One line for a run that changed: its state, records and shard counts."""
    return f"{st.run_id}: {st.state}: {_totals(st)}, {counts_text(st)}"


# --- live progress: wait, status --watch, collect ---


def run_rate(st: RunStatus) -> float | None:
    """Rows per second of the run now: the sum of its running attempts' rates."""
    rates = [s.rate for s in st.shards if s.state in ("running", "draining") and s.rate]
    return sum(rates) if rates else None


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class RateColumn(ProgressColumn):
    """Units per second and the time left at that rate (the task's ``rate`` field, else Rich's own speed)."""

    def __init__(self, unit: str) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self.unit = unit

    def render(self, task: Task) -> Text:
        rate: float | None = task.fields.get("rate") or task.speed
        if not rate or task.total is None:
            return Text(f"-- {self.unit}/s  eta -:--:--", style="dim")
        left = max(0.0, task.total - task.completed) / rate
        return Text(f"{rate:.1f} {self.unit}/s  eta {_clock(left)}")


def new_progress(console: Console, rate_unit: str) -> Progress:
    """A bar with done/total (in the unit of its task's ``unit`` field), the rate (``rate_unit`` per second), the
    time left at that rate, and the time elapsed."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}", table_column=Column(no_wrap=True)),
        RateColumn(rate_unit),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


class RunDisplay:
    """The live view of ``wait`` (a progress bar) and ``status --watch`` (the bar above the shard table), on a
    terminal; :meth:`update` after every refresh."""

    def __init__(self, out: TextIO, *, table: bool) -> None:
        self._console = terminal_console(out)
        self._progress = new_progress(self._console, "rows")
        self._task = self._progress.add_task("", total=None, unit="records")
        self._table = table
        self._live = Live(self._progress, console=self._console, refresh_per_second=4, transient=not table)

    def __enter__(self) -> RunDisplay:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def update(self, st: RunStatus) -> None:
        """The bar: the records done, or in a two-stage run the rows done of both stages (which never go back while
        a shard's CPU stage waits for its turn)."""
        done, total = st.records_done, st.records_requested
        if st.stages:
            done, total = sum(s.rows_done for s in st.stages), sum(s.records for s in st.stages)
        self._progress.update(
            self._task,
            completed=done,
            total=total,
            description=f"{st.state} ({counts_text(st)})",
            rate=run_rate(st),
            unit="rows of both stages" if st.stages else "records",
        )
        if self._table:
            self._live.update(Group(self._progress, status_view(st, boxed=True)))


class FileProgress:
    """A progress bar over batch files (``collect --local`` on a terminal); call it with (done, total)."""

    def __init__(self, out: TextIO) -> None:
        self.progress = new_progress(terminal_console(out), "files")
        self._task = self.progress.add_task("collecting", total=None, unit="batch files")

    def __call__(self, done: int, total: int) -> None:
        self.progress.update(self._task, completed=done, total=total)


def job_spinner(out: TextIO, what: str) -> Progress:
    """A spinner with the elapsed time while a Slurm job works (``collect`` on a terminal)."""
    progress = Progress(
        SpinnerColumn(), TextColumn(what), TimeElapsedColumn(), console=terminal_console(out), transient=True
    )
    progress.add_task(what, total=None)
    return progress


# --- submit --dry-run ---


def placeholder_note(names: tuple[str, ...]) -> str:
    """What submit says about API-key variables whose values are placeholders (names only, never values)."""
    if not names:
        return ""
    if len(names) == 1:
        return f"{names[0]} holds a placeholder value (not a secret): attempts do not scan their files for it"
    return f"{', '.join(names)} hold placeholder values (not secrets): attempts do not scan their files for them"


def plan_notes(plan: Plan) -> list[str]:
    """What submit and the dry run note about a plan: placeholder keys, the builder's columns the nodes take
    from the run's copy of the script (Data Designer's YAML does not carry them as they are), a workflow's stage."""
    from ddslurm.planner import VLLM_DEFAULT_MAX_NUM_SEQS

    notes = [placeholder_note(plan.secret_env_unscanned)]
    source = plan.recipe_source
    if source is not None and source.rebuild:
        names = ", ".join(repr(name) for name in source.rebuild)
        why = "; ".join(source.reasons) or "a function, a field it leaves out, integer keys"
        notes.append(
            f"the nodes take column(s) {names} from the run's copy of {source.builder}: Data Designer's YAML does not "
            f"carry them as the builder made them ({why})"
        )
    if plan.workflow is not None:
        place = plan.workflow
        seeded = "" if place.previous_run is None else f", seeded by the dataset of {place.previous_run}"
        then = (
            "its last stage"
            if place.last
            else "`ddslurm workflow RUN` waits for it, collects it and submits the next stage"
        )
        notes.append(f"this run is {place.label()} ({plan.num_records} records{seeded}): {then}")
    for dep in plan.serving.deployments if plan.serving else ():
        if dep.engine == "sglang" and not any(
            arg.partition("=")[0] == "--max-running-requests" for arg in dep.extra_args
        ):
            notes.append(
                f"{dep.alias}: SGLang sizes the requests it runs at once from the GPUs' memory; ddslurm assumes "
                f"{dep.capacity} a replica for the clients ({dep.data_parallel} rank(s) x "
                f"{VLLM_DEFAULT_MAX_NUM_SEQS}): set --max-running-requests in server.extra_args to size both"
            )
    return [note for note in notes if note]


def plan_lines(planned: SubmissionPlan) -> list[str]:
    """The arrays and the limits, as the dry run prints them."""
    from ddslurm.planner import HEADROOM, describe_limit, failure_chain

    lines = [
        f"{len(planned.arrays)} sbatch call(s), {planned.tasks:,} array task(s) "
        f"(MaxArraySize {planned.limits.max_array_size:,}):"
    ]
    for a in planned.arrays:
        chain = failure_chain(planned.arrays, a)  # an automatic retry waits for every earlier level to fail
        after = "  --dependency=afternotok:" + ":".join(f"<array {i}>" for i in chain) if chain else ""
        if a.after_any:
            after = "  --dependency=afterany:" + ":".join(f"<array {i}>" for i in a.after_any)
        kind = a.kind if a.stage is None else f"{a.kind}, {'CPU' if a.stage == 1 else 'GPU'} stage"
        lines.append(f"  array {a.index}: --array={a.array:<14} shards {compact_ranges(a.shards)} ({kind}){after}")
    lines.append(f"limits checked (a submission uses at most {round(HEADROOM * 100)} % of what is left under each):")
    lines += [f"  {describe_limit(c)}: this run needs {planned.tasks:,}" for c in planned.checks]
    lines += [f"  {note}" for note in planned.limits.notes]
    return lines


def dry_run_text(
    plan: Plan, layout: RunLayout, planned: SubmissionPlan, script: str, bill: list[str] | None = None
) -> str:
    """What ``submit --dry-run`` prints: where the run would go, the environment the job gets, the bill (how the
    shards map to jobs, the aliases, resources, steps and CPU/GPU-hours), the arrays and the limits they fit in
    (``planned``, as ``submit`` computes it), then the batch script of the first array."""
    from ddslurm.launcher.submission._arrays import job_variables

    names = ", ".join((*NODE_ENV_ALLOWED, *job_variables(plan)))
    lines = [
        "dry run: nothing was written or submitted",
        f"run dir would be {layout.root}",
        f"sbatch --export=ALL from an environment of {names} only (values stay in your shell; "
        "the node reads no login file)",
    ]
    lines += [f"note: {note}" for note in plan_notes(plan)]
    lines += bill or []
    lines += plan_lines(planned)
    lines.append("the batch script of array 0 (the others differ in --array, the shards and --dependency):")
    return "".join(f"# {line}\n" for line in lines) + script


# --- list ---


def age(seconds: float) -> str:
    """``45s``, ``12m``, ``3h``, ``2d``."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def run_table(runs: Sequence[ListedRun], now: datetime, *, boxed: bool) -> Table:
    """``ddslurm list``: one row a run (newest first, as given): state, rows produced of those requested, age."""
    table = _table(boxed=boxed)
    for name, justify in (("RUN", "left"), ("STATE", "left"), ("ROWS", "right"), ("AGE", "right"), ("DIR", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "DIR", overflow="fold")  # type: ignore[arg-type]
    for r in runs:
        submitted = r.submitted_at
        table.add_row(
            r.run_id,
            styled(r.state),
            f"{r.records_done}/{r.records}",
            age((now - datetime.fromisoformat(submitted)).total_seconds()) if submitted else "-",
            r.run_dir,
        )
    return table


def check_table(checks: Sequence[Check], *, boxed: bool) -> Table:
    """``ddslurm doctor``: one row a check: its name, ok / problem / skipped, and what was found (a problem at its
    ``file:line:col``), or why it was skipped."""
    table = _table(boxed=boxed)
    table.add_column("CHECK", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("DETAIL", overflow="fold")
    for c in checks:
        table.add_row(c.name, Text(c.status, style=CHECK_STYLES[c.status]), c.message)
    return table


# --- logs ---


def decode_record(line: str) -> dict[str, Any] | None:
    """A structured log line (one JSON object with an ``event``), or None for any other line."""
    if not line.startswith("{"):
        return None
    try:
        record = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None
    return record if isinstance(record, dict) and "event" in record else None


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return f'"{text}"' if isinstance(value, str) and (" " in text or not text) else text


def record_text(record: Mapping[str, Any]) -> Text:
    """A structured log record for people: time, level, event, then ``key=value`` for the rest."""
    stamp = str(record.get("timestamp", ""))
    when = stamp.replace("T", " ").removesuffix("Z").split("+")[0][:23] if stamp else ""
    level = str(record.get("level", ""))
    rest = " ".join(f"{k}={_value(v)}" for k, v in record.items() if k not in _RECORD_KEYS)
    return Text.assemble(
        (f"{when} ", "dim"),
        (f"{level:<7} ", LEVEL_STYLES.get(level, "")),
        (str(record.get("event", "")), "bold"),
        (f" {rest}" if rest else "", ""),
    )


def log_line(line: str) -> Text:
    record = decode_record(line)
    return record_text(record) if record is not None else Text(line)


class LogWriter:
    """Prints log lines, structured records rendered for people (coloured on a terminal)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._console = terminal_console(out) if out.isatty() else None

    def __call__(self, line: str) -> None:
        text = log_line(line)
        if self._console is not None:
            self._console.print(text, soft_wrap=True)
        else:
            self._out.write(text.plain + "\n")
