"""Helpers for tests of the launcher and of tools built on it (like ``ddslurm.config.testing``).

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ddslurm.config import (
    AttemptRecord,
    AttemptState,
    BuildRequest,
    CheckAnswer,
    ErrorAnswer,
    InspectAnswer,
    InspectRequest,
    Progress,
    RunLayout,
    ToolsRequest,
    VersionsAnswer,
    atomic_write,
    encode,
    encode_message,
)
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._process import Finished
from ddslurm.launcher.cluster._slurm import Completed
from ddslurm.launcher.submission._validate import RecipeCheck
from ddslurm.runtime import answer_inspect, installed_versions, pid_alive, read_request, recipe_columns
from ddslurm.runtime.errors import RecipeError

UNIT_RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  model_configs:
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 8}}
"""
HOSTED_PROVIDER = "- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY}\n"


def write_unit_run(
    root: Path,
    key: str,
    *,
    recipe: str = UNIT_RECIPE,
    providers: str = HOSTED_PROVIDER,
    name: str = "unit",
    num_records: int = 10,
    shards: int = 3,
    run_extra: str = "",
) -> tuple[Path, Path, dict[str, str]]:
    """A run file, recipe, Data Designer home (``providers``: the ``providers:`` list) and cluster profile under
    ``root``, with a stand-in ``python_env``; returns (run file, profile, environment holding ``key`` as
    ``HOSTED_KEY``). Submits nothing: pass a fake Slurm to ``submit``."""
    home = root / "dd"
    home.mkdir()
    (home / "model_providers.yaml").write_text("providers:\n" + providers)
    (root / "recipe.yaml").write_text(recipe)
    run = root / "run.yaml"
    run.write_text(f"name: {name}\nrecipe: recipe.yaml\nnum_records: {num_records}\nshards: {shards}\n{run_extra}")
    write_runtime_shim(root / "venv")
    profile = root / "profile.yaml"
    profile.write_text("workspace: work\npython_env: venv\npartition: gpu\ncpu_partition: cpu\n")
    return run, profile, {"DATA_DESIGNER_HOME": str(home), "HOSTED_KEY": key, "PATH": "/usr/bin:/bin"}


def write_runtime_shim(python_env: Path) -> Path:
    """A stand-in ``python_env``: its ``bin/ddslurm-runtime`` runs this environment's runtime (what the launcher
    asks about a recipe is answered by the Data Designer installed here). Returns the command."""
    command = python_env / "bin" / "ddslurm-runtime"
    command.parent.mkdir(parents=True, exist_ok=True)
    call = "import sys; from ddslurm.runtime.cli import main; sys.exit(main())"
    command.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(call)} "$@"\n')
    command.chmod(0o755)
    return command


class InProcessHost(EngineHost):
    """An :class:`~ddslurm.launcher.cluster._engine_host.EngineHost` for tests of the launcher's own logic: it answers
    ``versions`` and ``check`` in this process with the runtime's own code (:func:`ddslurm.runtime.read_request`,
    :func:`ddslurm.runtime.answer_inspect`, the Data Designer installed here, imported once per test process), where
    the real host starts a process and imports Data Designer for every question; the request and answer still cross
    as the JSON text the process would read and write. A builder script (``build``) is the user's code and an MCP
    tool listing (``tools``) starts the user's servers: both still run in their own process (``fallback``).
    ``asked`` counts the questions by action. Answers as a stand-in ``python_env`` (:func:`write_runtime_shim`)
    would; a test of what a different ``python_env`` answers uses :class:`OtherPythonEnv`, or the real host."""

    def __init__(self, fallback: EngineHost = RUNTIME_PROCESS) -> None:
        self.fallback = fallback
        self.asked: Counter[str] = Counter()

    def exchange(
        self, runtime: Path, request: str, *, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
    ) -> Finished:
        read = read_request(request)
        self.asked[str(read.__struct_config__.tag)] += 1
        if isinstance(read, BuildRequest | ToolsRequest):
            return self.fallback.exchange(runtime, request, timeout_s=timeout_s, env=env, cwd=cwd)
        printed = io.StringIO()  # what Data Designer prints goes to the answer's stderr, as in the process
        with contextlib.chdir(cwd or Path.cwd()), contextlib.redirect_stdout(printed):
            answer = self.answer(read)
        return Finished(0, encode_message(answer), printed.getvalue())

    def answer(self, request: InspectRequest | ErrorAnswer) -> InspectAnswer:
        """The answer to ``request``, as ``ddslurm-runtime inspect`` in this environment gives it."""
        return answer_inspect(request)


class OtherPythonEnv(InProcessHost):
    """An :class:`InProcessHost` answering as a ``python_env`` that holds other versions of the node's distributions:
    ``versions`` (``{"data-designer": "1.0.0rc1"}``; None: not installed) replace this environment's in the
    ``versions`` answer and, for Data Designer, in the ``check`` answer (the version the plan records)."""

    def __init__(self, versions: Mapping[str, str | None], fallback: EngineHost = RUNTIME_PROCESS) -> None:
        super().__init__(fallback)
        self.versions = dict(versions)

    def answer(self, request: InspectRequest | ErrorAnswer) -> InspectAnswer:
        answer = super().answer(request)
        if isinstance(answer, VersionsAnswer):
            return msgspec.structs.replace(answer, versions={**answer.versions, **self.versions})
        if isinstance(answer, CheckAnswer) and "data-designer" in self.versions:
            return msgspec.structs.replace(answer, data_designer=self.versions["data-designer"])
        return answer


def accept_recipe(recipe: Mapping[str, Any], *_: object) -> RecipeCheck:
    """A ``check_recipe`` for ``prepare`` that skips Data Designer's validation (a subprocess of seconds) but reads
    the columns as it does (in this process; None when it refuses them), with no plugins, and says this
    environment's Data Designer version (as the check of a ``python_env`` that is this environment would)."""
    dd = installed_versions(("data-designer",))["data-designer"] or ""
    try:
        columns = recipe_columns(recipe)
    except RecipeError:
        return RecipeCheck(data_designer_version=dd)
    return RecipeCheck(columns=columns, data_designer_version=dd)


class Patcher(Protocol):
    """What :func:`accept_every_recipe` patches with (pytest's ``monkeypatch``)."""

    def setattr(self, target: object, name: str, value: object) -> None: ...


def accept_every_recipe(monkeypatch: Patcher) -> None:
    """Every ``submit`` and dry run (the commands and the API alike) checks recipes with :func:`accept_recipe`:
    the seam for tests whose subject is not Data Designer's validation (a subprocess of seconds)."""
    from ddslurm.launcher.submission import _dry_run, _prepare, _submit

    original = _prepare.prepare_on_cluster

    def prepare(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "check_recipe": accept_recipe})

    monkeypatch.setattr(_submit, "prepare_on_cluster", prepare)
    monkeypatch.setattr(_dry_run, "prepare_on_cluster", prepare)


class FakeSlurm:
    """A command runner for :class:`ddslurm.launcher.Slurm` (``Slurm(FakeSlurm())``) that answers like Slurm
    would: ``sbatch`` with job ids from 4242, ``squeue`` and ``sacct`` with the given output, anything else with
    nothing; it records every call."""

    def __init__(self, *, squeue: str = "", sacct: str = "") -> None:
        self.calls: list[list[str]] = []
        self.squeue_out, self.sacct_out = squeue, sacct
        self.next_id = 4242

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append(list(argv))
        if argv[0] == "sbatch":
            self.next_id += 1
            return Completed(0, f"{self.next_id - 1}\n", "")
        if argv[0] == "squeue":
            return Completed(0, self.squeue_out, "")
        if argv[0] == "sacct":
            return Completed(0, self.sacct_out, "")
        return Completed(0, "", "")

    def commands(self, name: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == name]


def write_attempt(
    layout: RunLayout,
    shard: int,
    job: str,
    state: AttemptState,
    *,
    task: str | None = None,
    reason: str | None = None,
    started: str | None = None,
    progress: int | None = None,
    stage: int | None = None,
    ended: str | None = None,
) -> AttemptRecord:
    """The record of attempt ``attempt-<job>`` of ``shard`` as array task ``task`` (``<array>_<i>``; None: not a
    Slurm array) wrote it, begun at ``started`` (default: now) and ended at ``ended`` (default: not recorded); with
    ``progress``, its progress file too; ``stage``: of that stage of a two-stage run (0: the GPU stage's, under the
    shard's ``stage-0/``)."""
    began = started or datetime.now(UTC).isoformat()
    record = AttemptRecord(
        shard=shard,
        attempt=f"attempt-{job}",
        job_id=job,
        node="n1",
        state=state,
        started_at=began,
        ended_at=ended,
        reason=reason,
        slurm_log=str(layout.logs / f"slurm-{task}.out") if task else None,
    )
    attempt = layout.stage_shard(shard, stage).attempt(record.attempt)
    attempt.dir.mkdir(parents=True, exist_ok=True)
    atomic_write(attempt.record, encode(record))
    if progress is not None:
        atomic_write(attempt.progress, encode(Progress(rows=progress, batches=1, updated_at=began)))
    return record


# --- processes ---


def wait_ended(pid: int, bound_s: float = 30.0) -> bool:
    """Whether process ``pid`` has ended (a zombie has: :func:`ddslurm.runtime.pid_alive`) within ``bound_s``: a
    signal lands at once, so the bound only keeps a process that was never stopped from hanging the test."""
    deadline = time.monotonic() + bound_s
    while pid_alive(pid, None):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# --- a headless browser, for pages a user opens (the report, the docs site) ---


def find_chromium() -> str | None:
    """The Chromium (or Chrome) on PATH, None when there is none (``apt-get install -y chromium``)."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def require_fonts() -> None:
    """Refuse to measure a page's text where fontconfig knows no font: Chromium then gives text no width, so a
    label cut off would pass unseen (a Chromium installed with ``--no-install-recommends`` brings none)."""
    listed = subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True, check=False, timeout=60)
    if not listed.stdout.strip():
        raise RuntimeError("no font is installed, so Chromium lays text out with no width: run tools/install-browser")


def run_chromium(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with ``args`` (such as ``--dump-dom URL``), its profile under ``cwd``, its log on stderr;
    ``timeout``: seconds of wall time (a loaded machine renders slowly). Refused without a font (``require_fonts``)."""
    require_fonts()
    return subprocess.run(
        [find_chromium() or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={cwd / 'profile'}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False,
    )  # fmt: skip


def console_lines(stderr: str) -> list[str]:
    """What the page logged to its console (errors, uncaught exceptions), as chromium's log shows it."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def pixel_variance(png: Path) -> float:
    """The variance of the grey levels of a PNG (decoded with zlib: no imaging library needed)."""
    import struct
    import zlib

    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, depth, colour = 8, b"", 0, 0, 0, 0
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        chunk, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + length]
        if chunk == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif chunk == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    data = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    values: list[int] = []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = data[start], bytearray(data[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa_, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa_ <= pb and pa_ <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 0xFF
        if row % 8 == 0:
            values.extend(sum(line[i : i + 3]) // 3 for i in range(0, stride, channels * 8))
        prev = line
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


_LAYOUT_CHECK = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const problems = [];
  const inside = (r, box) => r.left >= box.left - 1 && r.right <= box.right + 1 && r.top >= box.top - 1
    && r.bottom <= box.bottom + 1;
  const width = document.documentElement.clientWidth;
  const legends = {};
  for (const plot of document.querySelectorAll(".js-plotly-plot")) {
    const box = plot.getBoundingClientRect();
    if (box.right > width + 1) problems.push(`${plot.id}: wider than the page`);
    legends[plot.id] = [...plot.querySelectorAll(".legendtext")].map(t => t.textContent);
    const legend = plot.querySelector("g.legend");
    const key = legend ? legend.getBoundingClientRect() : null;
    const meets = (a, b) => a.left < b.right - 1 && b.left < a.right - 1
      && a.top < b.bottom - 1 && b.top < a.bottom - 1;
    for (const text of plot.querySelectorAll("text")) {
      const r = text.getBoundingClientRect();
      if (!text.textContent.trim() || r.width === 0) continue;
      if (!inside(r, box)) problems.push(`${plot.id}: "${text.textContent}" is cut off by its chart`);
      else if (key && !text.closest("g.legend") && meets(r, key))
        problems.push(`${plot.id}: "${text.textContent}" is covered by the legend`);
    }
  }
  for (const card of document.querySelectorAll(".card")) {
    if (card.scrollWidth > card.clientWidth + 1) problems.push(`card "${card.textContent}" overflows`);
  }
  if (document.documentElement.scrollWidth > width + 1) {
    const wider = [...document.body.querySelectorAll("*")]
      .filter(e => e.getBoundingClientRect().right > width + 1 && !e.closest(".wide") && e.closest("svg") === null)
      .map(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : ""));
    const wide = document.documentElement.scrollWidth;
    problems.push(`the page is ${wide} px wide in a ${width} px window: ${wider.slice(0, 5)}`);
  }
  const out = document.createElement("pre");
  out.id = "layout-check";
  out.textContent = JSON.stringify({problems, legends});
  document.body.appendChild(out);
}, 1000));
</script>"""


_LAYOUT_FRAME = """<!doctype html><html><body style="margin:0"><iframe id="page" src="%(src)s"
style="width:%(width)dpx;height:2000px;border:0"></iframe><script>
const frame = document.getElementById("page");
const copy = setInterval(() => {
  const out = frame.contentDocument && frame.contentDocument.getElementById("layout-check");
  if (!out) return;
  clearInterval(copy);
  const mine = document.createElement("pre");
  mine.id = "layout-check";
  mine.textContent = out.textContent;
  document.body.appendChild(mine);
}, 100);
</script></body></html>"""
"""The page in a frame ``width`` pixels wide (a headless window is never narrower than 500 px), and the frame's
layout check copied out, where ``--dump-dom`` shows it."""


def page_layout(page: Path, cwd: Path, width: int = 1400) -> dict[str, Any]:
    """How a report page lays out in headless chromium ``width`` CSS pixels wide (1400: a desktop; 390: a phone):
    ``problems`` (text of a chart drawn outside it or under its legend, a chart wider than the page, a card whose
    text overflows it, a page wider than the window, naming what sticks out beyond a box that scrolls) and
    ``legends`` (each chart's legend entries), measured by a script added to a copy of the page in ``cwd``."""
    import html
    import json
    import re

    checked = cwd / f"checked-{page.name}"
    checked.write_text(page.read_text().replace("</body>", _LAYOUT_CHECK + "</body>"))
    framed = cwd / f"framed-{width}-{page.name}"
    framed.write_text(_LAYOUT_FRAME % {"src": html.escape(checked.name), "width": width})
    done = run_chromium(
        "--virtual-time-budget=15000", f"--window-size={max(width, 500) + 40},2100", "--allow-file-access-from-files",
        "--dump-dom", framed.as_uri(), cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="layout-check">(.*?)</pre>', done.stdout, re.S)
    assert found is not None, "the layout check did not run"
    measured: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return measured
