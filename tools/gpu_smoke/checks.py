"""The GPU smoke test's checks, in the order they run, each with its own deadline inside the whole run's
(:class:`Budget`); each returns a :class:`Result` (PASS, FAIL or SKIP and one line of detail).

1. ``flags``: every flag ddslurm renders (:mod:`tools.gpu_smoke.rendered`) is one ``vllm serve`` lists
   (:mod:`tools.gpu_smoke.helptext`).
2. ``server``: ``vllm serve`` started exactly as the runtime starts it (``server_command`` with the boot program
   that gives vLLM its key in its arguments, ``script_python``; ``token_environment``; its output through the
   runtime's redaction, ``RedactedPopen``) on ``--uds`` with a fresh token: while it loads every probe is
   refused or answered 503 (or waits), then ``/health`` and ``/metrics`` answer, ``/v1/models`` refuses a
   request without the token and answers one with it.
3. ``proxy``: ``ddslurm-runtime proxy`` started as the runtime starts it (``proxy_argv``) in front of the server;
   under more concurrent requests than the server runs at once (``--max-num-seqs 2``) the proxy's view
   (``GET /ddslurm/upstreams``) shows requests waiting, read from the server's ``/metrics``.
4. ``engine-death``: the engine-core process (``VLLM::EngineCore``) killed, ``/health`` fails and the server exits.
5. ``token``: the token is in no byte of the server's and the proxy's logs, ``~/.cache/vllm`` or
   ``$VLLM_CACHE_ROOT`` (files written since the server started).
6. ``e2e``: a run of a few records through the real path (``ddslurm-runtime generate --launcher local``: the
   controller starts vLLM and the proxy, the Data Designer client generates through them) on the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from ddslurm.config import ServingPlan
from ddslurm.runtime._fleet_start import proxy_argv
from ddslurm.runtime._listeners import unix_url
from ddslurm.runtime._redact import RedactedPopen
from ddslurm.runtime._server_command import TOKEN_ENV, server_command, token_environment
from ddslurm.runtime._vllm_boot import script_python
from tools.gpu_smoke.helptext import collect_help, flags_of, missing
from tools.gpu_smoke.rendered import deployment, rendered
from tools.gpu_smoke.scan import scan

Status = Literal["PASS", "FAIL", "SKIP"]
SERVED = "smoke"
MAX_NUM_SEQS = 2
"""The server runs this many sequences at once, so that the proxy check's load queues."""
LOAD = 16
"""Concurrent requests of the proxy check."""
LIMITS_S: dict[str, float] = {
    "flags": 90,
    "server": 240,
    "proxy": 60,
    "engine-death": 60,
    "token": 60,
    "e2e": 240,
}
"""Each check's own deadline (seconds); none runs past the whole run's (:class:`Budget`)."""
ENGINE_TITLE = "EngineCore"
"""In the command line of vLLM's engine-core process (``VLLM::EngineCore``, set with ``setproctitle``)."""


@dataclass(frozen=True, slots=True)
class Result:
    """One check's outcome: its number and name, PASS/FAIL/SKIP, a line of detail and its seconds."""

    number: int
    name: str
    status: Status
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.status} {self.number} {self.name} ({self.seconds:.1f} s): {self.detail}"


class Deadline:
    """A deadline ``seconds`` from now on ``clock`` (the monotonic clock)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def left(self) -> float:
        return max(0.0, self._end - self._clock())

    def passed(self) -> bool:
        return self._clock() >= self._end


class Budget(Deadline):
    """The whole run's deadline, and each check's share of what is left of it."""

    def for_check(self, name: str) -> float:
        """Seconds ``name`` may take: its own limit, or what is left of the run's if that is less."""
        return min(LIMITS_S[name], self.left())


@dataclass(slots=True)
class Smoke:
    """What the checks share: the vLLM executable, the model, the scratch directory, the token, the running
    server and proxy (started by checks 2 and 3, stopped by :meth:`close`)."""

    vllm: str
    model: str
    work: Path
    runtime_exe: Path
    env: Mapping[str, str]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    started_at: float = 0.0
    server: subprocess.Popen[bytes] | None = None
    proxy: subprocess.Popen[bytes] | None = None
    proxy_port: int = 0
    socket: Path = Path()
    server_log: Path = Path()
    proxy_logs: tuple[Path, ...] = ()

    @property
    def serving(self) -> ServingPlan:
        dep = deployment(self.model, served_model_name=SERVED, extra_args=_extra_args())
        return ServingPlan(deployments=(dep,), gpus=1, vllm_executable=self.vllm)

    def plain_env(self) -> dict[str, str]:
        """The environment of the processes the checks start, without any token of its own."""
        return {k: v for k, v in self.env.items() if k != TOKEN_ENV}

    def uds_client(self, timeout: float = 10.0) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://localhost", timeout=timeout
        )

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def close(self) -> None:
        for proc in (self.proxy, self.server):
            if proc is not None:
                _stop(proc)


def _extra_args() -> tuple[str, ...]:
    """The user's ``server.extra_args`` of the smoke deployment: few sequences at once (the proxy check's queue)
    and a short context (any model's KV cache fits)."""
    return ("--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", "1024")


def _stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """TERM the process's group (it was started in a session of its own), then KILL it after ``grace``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


def tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log, on one line (`` | `` between them)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip()) or "(empty log)"


# -- 1. flags ------------------------------------------------------------------------------------------------------


def check_flags(smoke: Smoke, deadline: Deadline) -> tuple[Status, str]:
    known, answers = collect_help(smoke.vllm, smoke.plain_env(), max(deadline.left() / 2, 1.0))
    if not known:
        said = "; ".join(f"`vllm serve {a.argument}` exit {a.returncode}: {a.text.strip()[-200:]!r}" for a in answers)
        return "FAIL", f"no option found in vLLM's help ({said})"
    absent: dict[str, list[str]] = {}
    rendered_flags: set[str] = set()
    for shape, argv in rendered():
        flags = flags_of(argv[2:])  # after ``serve MODEL``
        rendered_flags.update(flags)
        for flag in missing(flags, known):
            absent.setdefault(flag, []).append(shape.name)
    if absent:
        what = "; ".join(f"{flag} (rendered for: {', '.join(shapes)})" for flag, shapes in sorted(absent.items()))
        return "FAIL", f"vLLM does not know {len(absent)} flag(s) ddslurm renders: {what}"
    return (
        "PASS",
        f"all {len(rendered_flags)} flags ddslurm renders over {sum(1 for _ in rendered())} forms are in "
        f"vLLM's help ({len(known)} options)",
    )


# -- 2. server -----------------------------------------------------------------------------------------------------


def check_server(smoke: Smoke, deadline: Deadline) -> tuple[Status, str]:
    sockets = smoke.work / "sockets"
    sockets.mkdir(mode=0o700, exist_ok=True)
    smoke.socket = sockets / "generator-0.sock"
    smoke.server_log = smoke.work / "server-generator-0.log"
    # as the runtime starts it: vLLM's key through its boot program, its output through the runtime's redaction
    vllm_python = script_python(smoke.serving.vllm_executable, smoke.plain_env())
    command = server_command(
        smoke.serving, smoke.serving.deployments[0], unix_url(smoke.socket), vllm_python=vllm_python
    )
    env = {**smoke.plain_env(), **token_environment(smoke.serving, smoke.token)}
    smoke.started_at = time.time()
    smoke.server = RedactedPopen(
        list(command.argv), log=smoke.server_log, secrets=(smoke.token,), env=env, start_new_session=True
    )
    refused = loading = 0
    odd: list[str] = []
    began = time.monotonic()
    with smoke.uds_client(timeout=5.0) as client:
        while True:
            code = smoke.server.poll()
            if code is not None:
                return "FAIL", f"vllm serve exited {code} before it was ready: {tail(smoke.server_log)}"
            if deadline.passed():
                return "FAIL", f"not ready within {deadline.seconds:.0f} s ({refused} probes refused, {loading} 503)"
            # /v1/models first: a server is loading, then ready, never back, so when /health is not 200 after it,
            # the server was loading when /v1/models answered too (asked second, a load ending between the two
            # probes read as an answer given while loading)
            models = _status(client, "GET", "/v1/models", smoke.auth)
            status = _status(client, "GET", "/health")
            if status == 200:
                break
            if status is None:
                refused += 1
            elif status == 503:
                loading += 1
            else:
                odd.append(f"/health {status}")
            if models not in (None, 503):
                odd.append(f"/v1/models {models} while loading")
            time.sleep(0.5)
        load_s = time.monotonic() - began
        if odd:
            return "FAIL", f"while loading it answered otherwise than refused or 503: {', '.join(sorted(set(odd)))}"
        metrics = _get(client, "/metrics")
        if metrics is None or metrics.status_code != 200 or "vllm:num_requests_waiting" not in metrics.text:
            got = "no answer" if metrics is None else f"{metrics.status_code}"
            return "FAIL", f"/metrics: {got}, without vllm:num_requests_waiting (the proxy's backpressure reads it)"
        bare = _status(client, "GET", "/v1/models")
        keyed = _get(client, "/v1/models", smoke.auth)
    if bare != 401:
        return "FAIL", f"/v1/models without the token answered {bare}, not 401: the key is not required"
    if keyed is None or keyed.status_code != 200:
        return "FAIL", f"/v1/models with the token: {'no answer' if keyed is None else keyed.status_code}"
    names = [m.get("id") for m in keyed.json().get("data", [])]
    if SERVED not in names:
        return "FAIL", f"/v1/models with the token lists {names}, not the served name {SERVED!r}"
    return "PASS", (
        f"loading {load_s:.0f} s ({refused} probes refused, {loading} answered 503); /health 200, /metrics 200 "
        f"with vllm:num_requests_waiting, /v1/models 401 without the token, 200 with it ({SERVED})"
    )


def _get(client: httpx.Client, path: str, headers: Mapping[str, str] | None = None) -> httpx.Response | None:
    try:
        return client.get(path, headers=dict(headers or {}))
    except httpx.HTTPError:
        return None


def _status(client: httpx.Client, method: str, path: str, headers: Mapping[str, str] | None = None) -> int | None:
    """The answer's status code; None when the connection was refused or failed (nothing listens yet)."""
    try:
        return client.request(method, path, headers=dict(headers or {})).status_code
    except httpx.HTTPError:
        return None


# -- 3. proxy ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def check_proxy(smoke: Smoke, deadline: Deadline) -> tuple[Status, str]:
    smoke.proxy_port = free_port()
    log = smoke.work / "proxy-generator.log"
    out = smoke.work / "proxy-generator.out"
    smoke.proxy_logs = (log, out)
    argv = proxy_argv(smoke.runtime_exe, smoke.proxy_port, [(unix_url(smoke.socket), smoke.work / "busy-0.jsonl")], log)
    with out.open("ab") as sink:
        smoke.proxy = subprocess.Popen(
            argv,
            env={**smoke.plain_env(), TOKEN_ENV: smoke.token},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{smoke.proxy_port}"
    with httpx.Client(base_url=base, timeout=30.0) as client:
        while _status(client, "GET", "/health") != 200:
            if smoke.proxy.poll() is not None:
                return "FAIL", f"the proxy exited {smoke.proxy.returncode}: {tail(out)}"
            if deadline.passed():
                return "FAIL", f"the proxy did not answer /health within {deadline.seconds:.0f} s: {tail(out)}"
            time.sleep(0.2)
        stop = threading.Event()
        answered: dict[int, int] = {}
        lock = threading.Lock()
        workers = [
            threading.Thread(target=_keep_asking, args=(base, smoke.auth, stop, answered, lock), daemon=True)
            for _ in range(LOAD)
        ]
        for worker in workers:
            worker.start()
        most = 0
        try:
            while not deadline.passed():
                view = _get(client, "/ddslurm/upstreams", smoke.auth)
                if view is not None and view.status_code == 200:
                    most = max(most, *(int(u.get("waiting", 0)) for u in view.json()["upstreams"]))
                if most > 0:
                    break
                time.sleep(0.2)
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=max(deadline.left(), 30.0))
    codes = ", ".join(f"{n} x {code}" for code, n in sorted(answered.items())) or "none answered"
    if most == 0:
        return "FAIL", f"under {LOAD} concurrent requests the proxy never saw a request waiting (answers: {codes})"
    bad = {code: n for code, n in answered.items() if code != 200}
    if bad:
        return "FAIL", f"the proxy saw {most} waiting, but not every request was answered 200: {codes}"
    return (
        "PASS",
        f"under {LOAD} concurrent requests (max-num-seqs {MAX_NUM_SEQS}) the proxy saw {most} waiting; "
        f"answers: {codes}",
    )


def _keep_asking(
    base: str, auth: Mapping[str, str], stop: threading.Event, answered: dict[int, int], lock: threading.Lock
) -> None:
    """Send chat requests through the proxy one after another until ``stop``; count the answers' status codes
    (-1: no answer)."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Count slowly from one to one hundred."}],
        "max_tokens": 64,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=base, timeout=120.0) as client:
        while not stop.is_set():
            try:
                code = client.post("/v1/chat/completions", json=body, headers=dict(auth)).status_code
            except httpx.HTTPError:
                code = -1
            with lock:
                answered[code] = answered.get(code, 0) + 1


# -- 4. engine death -----------------------------------------------------------------------------------------------


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), read from ``/proc/PID/stat``."""
    parents: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out += children
        todo += children
    return out


def command_line(pid: int, proc: Path = Path("/proc")) -> str:
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def engine_processes(server_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The server's engine-core processes: its descendants whose command line holds :data:`ENGINE_TITLE`."""
    return [pid for pid in descendants(server_pid, proc) if ENGINE_TITLE in command_line(pid, proc)]


def check_engine_death(smoke: Smoke, deadline: Deadline) -> tuple[Status, str]:
    assert smoke.server is not None
    if smoke.proxy is not None:  # the proxy goes first: its probes would only add lines to the server's log
        _stop(smoke.proxy)
    engines = engine_processes(smoke.server.pid)
    if not engines:
        return "FAIL", f"no process with {ENGINE_TITLE!r} in its command line under the server (pid {smoke.server.pid})"
    for pid in engines:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    unhealthy_s: float | None = None
    with smoke.uds_client(timeout=5.0) as client:
        while smoke.server.poll() is None and not deadline.passed():
            if unhealthy_s is None and _status(client, "GET", "/health") != 200:
                unhealthy_s = time.monotonic() - killed
            time.sleep(0.1)
    code = smoke.server.poll()
    if code is None:
        health = "never failed" if unhealthy_s is None else f"failed after {unhealthy_s:.1f} s"
        return (
            "FAIL",
            f"killed the engine (pid {engines}): /health {health}, but the server still runs after "
            f"{deadline.seconds:.0f} s",
        )
    exited_s = time.monotonic() - killed
    if unhealthy_s is None:
        unhealthy_s = exited_s  # it exited before a probe saw it unhealthy: /health failed with it
    return (
        "PASS",
        f"killed the engine (pid {', '.join(map(str, engines))}): /health failed after {unhealthy_s:.1f} s, "
        f"the server exited {code} after {exited_s:.1f} s",
    )


# -- 5. token ------------------------------------------------------------------------------------------------------


def cache_roots(env: Mapping[str, str]) -> list[Path]:
    """``~/.cache/vllm`` (``$XDG_CACHE_HOME/vllm`` where that is set, as vLLM's ``VLLM_CACHE_ROOT`` default is)
    and ``$VLLM_CACHE_ROOT``."""
    roots = []
    xdg = env.get("XDG_CACHE_HOME") or (f"{env['HOME']}/.cache" if env.get("HOME") else None)
    if xdg:
        roots.append(Path(xdg) / "vllm")
    if env.get("VLLM_CACHE_ROOT"):
        roots.append(Path(env["VLLM_CACHE_ROOT"]))
    return roots


def check_token(smoke: Smoke, deadline: Deadline) -> tuple[Status, str]:
    del deadline  # one pass over the files written since the server started
    roots = [smoke.server_log, *smoke.proxy_logs, *cache_roots(smoke.env)]
    read, found = scan(roots, smoke.token, since=smoke.started_at - 1)
    where = ", ".join(str(r) for r in roots)
    if found:
        return "FAIL", "the token is in " + ", ".join(f"{f.path} (byte {f.offset})" for f in found)
    return "PASS", f"the token is in none of {read} file(s) written since the server started under {where}"


# -- 6. end to end -------------------------------------------------------------------------------------------------

RECIPE = """\
data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {values: [rain, snow, wind]}}
  - name: line
    column_type: llm-text
    model_alias: generator
    prompt: 'Write one sentence about {{ topic }}.'
  model_configs:
  - alias: generator
    model: smoke
    provider: local
    inference_parameters: {max_tokens: 32, temperature: 0.5, extra_body: {min_tokens: 4}}
"""
"""Four rows of one sentence each. ``min_tokens`` (vLLM's sampling parameter): a random model's first token may be
its end of sequence, and an empty answer is no row."""


def check_e2e(smoke: Smoke, deadline: Deadline) -> tuple[Status, str]:
    from datetime import UTC, datetime

    from ddslurm.config import AttemptRecord, read_json
    from ddslurm.launcher import prepare, write_run_dir

    root = smoke.work / "e2e"
    (root / "dd-home").mkdir(parents=True)
    (root / "dd-home" / "model_providers.yaml").write_text("providers: []\n")
    (root / "recipe.yaml").write_text(RECIPE)
    startup = max(int(deadline.left()) - 30, 30)
    (root / "run.yaml").write_text(
        "name: gpu-smoke\nrecipe: recipe.yaml\nnum_records: 4\nshards: 1\nbuffer_size: 4\n"
        "deployments:\n"
        f"  - model_alias: generator\n    model: {json.dumps(smoke.model)}\n    served_model_name: {SERVED}\n"
        f"    replicas: 1\n    tensor_parallel: 1\n    server:\n      startup_timeout: {startup}\n      cpus: 1\n"
        f"      extra_args: {json.dumps(list(_extra_args()))}\n"
        "submission:\n  time_limit: '00:10:00'\n  cpus: 2\n"
    )
    (root / "profile.yaml").write_text(
        f"name: gpu-smoke\nworkspace: {root / 'work'}\npython_env: {sys.prefix}\npartition: gpu\ncpu_partition: cpu\n"
        f"gpus_per_node: 1\nvllm_executable: {json.dumps(smoke.vllm)}\n"
    )
    env = {**smoke.plain_env(), "DATA_DESIGNER_HOME": str(root / "dd-home")}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM")}
    prepared = prepare(root / "run.yaml", root / "profile.yaml", env, datetime.now(UTC))
    write_run_dir(prepared)
    env["CUDA_VISIBLE_DEVICES"] = first_gpu(smoke.env)
    argv = [str(smoke.runtime_exe), "generate", "--run-dir", str(prepared.layout.root), "--shard", "0"]
    argv += ["--job-id", "smoke", "--launcher", "local", "--grace", "5"]
    log = root / "generate.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=max(deadline.left(), 1.0))
    except subprocess.TimeoutExpired:
        _stop(proc)
        return "FAIL", f"the run did not end within {deadline.seconds:.0f} s: {tail(log)}"
    record_path = prepared.layout.shard(0).attempt("attempt-smoke").record
    if not record_path.is_file():
        return "FAIL", f"ddslurm-runtime generate exited {code} without an attempt record: {tail(log)}"
    record = read_json(record_path, AttemptRecord)
    if code != 0 or record.state != "succeeded":
        why = f"{record.reason}: {(record.message or '')[:400]}" if record.reason else tail(log)
        return "FAIL", f"ddslurm-runtime generate exited {code}, the attempt {record.state}: {why}"
    return "PASS", f"4 records generated through vLLM, the proxy and the Data Designer client ({prepared.layout.root})"


def first_gpu(env: Mapping[str, str]) -> str:
    """The one GPU the end-to-end run uses: the first of ``CUDA_VISIBLE_DEVICES``, else 0."""
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[0] if visible else "0"


# -- the run -------------------------------------------------------------------------------------------------------

Check = Callable[[Smoke, Deadline], tuple[Status, str]]
CHECKS: tuple[tuple[str, Check], ...] = (
    ("flags", check_flags),
    ("server", check_server),
    ("proxy", check_proxy),
    ("engine-death", check_engine_death),
    ("token", check_token),
    ("e2e", check_e2e),
)
NEEDS = {"proxy": "server", "engine-death": "server", "token": "server"}
"""A check that cannot run when the named one did not pass (what it needs is not there)."""


def run_checks(
    smoke: Smoke | None,
    budget: Budget,
    skip: Mapping[str, str],
    report: Callable[[Result], None],
) -> list[Result]:
    """Run every check in order, each within its deadline; ``skip``: the checks not to run, with why (a model
    that cannot be had skips 2 to 6; ``smoke`` None skips all). Each result is ``report``\\ ed as it comes."""
    results: list[Result] = []
    passed: set[str] = set()
    try:
        for number, (name, check) in enumerate(CHECKS, start=1):
            began = time.monotonic()
            if smoke is None or name in skip:
                result = Result(number, name, "SKIP", skip.get(name, "not run"))
            elif (needed := NEEDS.get(name)) is not None and needed not in passed:
                result = Result(number, name, "SKIP", f"check {needed!r} did not pass")
            elif (seconds := budget.for_check(name)) < 5:
                result = Result(number, name, "FAIL", f"the run's {budget.seconds:.0f} s were spent before it")
            else:
                try:
                    status, detail = check(smoke, Deadline(seconds))
                except Exception as exc:  # a check's own failure is reported, the run goes on
                    status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
                result = Result(number, name, status, detail, time.monotonic() - began)
            if result.status == "PASS":
                passed.add(name)
            results.append(result)
            report(result)
    finally:
        if smoke is not None:
            smoke.close()
    return results


@contextlib.contextmanager
def scratch(keep: Path | None) -> Iterator[Path]:
    """The checks' working directory: ``keep`` (left in place), else a fresh one in ``/tmp`` (short enough for a
    socket path), removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ddslurm-smoke-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def describe(results: list[Result]) -> dict[str, Any]:
    """The ``--json`` document: every check's outcome and the summary."""
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    return {"checks": [_asdict(r) for r in results], "counts": counts}


def _asdict(result: Result) -> dict[str, Any]:
    return {
        "number": result.number,
        "name": result.name,
        "status": result.status,
        "detail": result.detail,
        "seconds": round(result.seconds, 2),
    }
