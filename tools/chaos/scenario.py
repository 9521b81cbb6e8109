"""One scenario on the real local cluster: write the run files, submit, inject the drawn faults at their
moments, recover the documented way (``wait``, ``retry`` / ``retry --resume-cancelled`` / ``accept-partial``,
bounded), ``collect --local``, and judge the result (the oracle and the run's leftovers)."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.chaos import cluster
from tools.chaos.draw import Fault, Scenario
from tools.chaos.oracle import judge
from tools.chaos.recipes import HOSTED_MODELS, KEY_ENV, profile_yaml, providers_yaml, run_yaml, write_recipe
from tools.chaos.reference import ReferenceCache

BIN = Path(sys.executable).parent
DDSLURM = str(BIN / "ddslurm")
PYTHON_ENV = BIN.parent
MAX_ROUNDS = 5
TIME_LIMIT_HANG_S = 170.0


ACTIVE: set[ScenarioRun] = set()
"""Scenarios under way, so that an interrupted campaign cancels their runs (``abort_all``)."""
_ACTIVE_LOCK = threading.Lock()


def abort_all() -> None:
    """Cancel every scenario under way: its run's jobs and processes, a node it took down, its provider."""
    with _ACTIVE_LOCK:
        runs = list(ACTIVE)
    for run in runs:
        run.out.verdict, run.out.reason = "FAIL", "interrupted"
        with contextlib.suppress(Exception):
            run.cleanup()


class Stuck(Exception):
    """The scenario ran past its budget."""


@dataclass
class Outcome:
    seed: int
    drawn: str
    verdict: str = "ok"
    reason: str = ""
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)
    run_dir: str = ""
    layout: str = ""
    recipe: str = ""
    faults: list[str] = field(default_factory=list)

    def line(self) -> str:
        faults = ", ".join(self.events) or "none"
        verdict = "ok" if self.verdict == "ok" else f"FAIL {self.reason}"
        return f"seed={self.seed} [{self.drawn}] faults: {faults} -> {verdict} ({self.seconds:.0f}s)"

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


HOSTED_START_TIMEOUT_S = 90.0
"""A (re)start of the hosted stand-in under a loaded machine (six scenarios and their jobs on two cores)."""


def listening_port() -> int:
    """A free port outside the kernel's ephemeral range, which the hosted stand-in keeps across its restarts: one
    inside it could be held, at a restart, by any connection's source port (as the runtime chooses its own)."""
    from ddslurm.runtime import draw_port
    from ddslurm.runtime._ports import port_is_free

    return draw_port(port_is_free)


FIRST_START_PORTS = 5
"""Ports the hosted stand-in tries at its first start (a restart keeps its port: the run's snapshot names it)."""


class Hosted:
    """The scenario's hosted provider: a fake-vllm on a fixed loopback port with the scenario's key, restarted
    with fault flags and without them (the stand-in has no runtime switch)."""

    def __init__(self, key: str, log_dir: Path, latency: float) -> None:
        self.key, self.log_dir, self.latency = key, log_dir, latency
        self.port = listening_port()
        self._cm: Any = None
        self._lock = threading.Lock()
        self._starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, *flags: str) -> None:
        from fake_vllm.testing import ServerStartError, start_server

        with self._lock:
            self._stop()
            self._starts += 1
            args = ["--served-model-name", *HOSTED_MODELS, "--fake-latency", str(self.latency), *flags]
            for attempt in range(FIRST_START_PORTS if self._starts == 1 else 1):
                cm = start_server(
                    "hosted",
                    args=args,
                    api_key=self.key,
                    port=self.port,
                    log_path=self.log_dir / f"hosted-{self._starts}.log",
                    timeout=HOSTED_START_TIMEOUT_S,
                )
                try:
                    cm.__enter__()
                except ServerStartError as exc:  # the port is another process's: before any run, take another
                    if "address already in use" not in str(exc).lower() or attempt == FIRST_START_PORTS - 1:
                        raise
                    self.port = listening_port()
                    continue
                self._cm = cm
                return

    def _stop(self) -> None:
        if self._cm is not None:
            with contextlib.suppress(Exception):
                self._cm.__exit__(None, None, None)
            self._cm = None

    def stop(self) -> None:
        with self._lock:
            self._stop()


class ScenarioRun:
    def __init__(self, scenario: Scenario, root: Path, references: ReferenceCache, budget_s: float) -> None:
        self.s = scenario
        self.root = root
        self.references = references
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.rng = random.Random(scenario.seed * 7919 + 1)  # the harness's own choices (which pid, which task)
        self.key = "sk-chaos-" + "".join(random.Random(scenario.seed).choice("0123456789abcdef") for _ in range(32))
        self.out = Outcome(scenario.seed, scenario.describe(), layout=scenario.layout, recipe=scenario.recipe_key)
        self.out.faults = [f.kind for f in scenario.faults]
        if scenario.recovery_fault is not None:
            self.out.faults.append(f"recovery:{scenario.recovery_fault.kind}")
        self._second: threading.Thread | None = None
        self.run_dir: Path | None = None
        self.env: dict[str, str] = {}
        self.hosted: Hosted | None = None
        self.run_cancelled = False
        self.accepted: dict[int, int] = {}
        self.jobs: set[str] = set()
        self.killed: set[int] = set()
        """Pids this harness SIGKILLed: their scratch directories stay until the next sweep (docs/reliability.md)."""
        self.downed: str | None = None
        self._injector_error: str | None = None

    # --- helpers ---

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def t(self) -> float:
        return time.monotonic() - self.started

    def event(self, text: str) -> None:
        self.out.events.append(f"{text} t={self.t():.0f}s")

    def cli(self, *args: str, timeout: float = 120) -> tuple[int, Any, str]:
        timeout = max(5.0, min(timeout, self.left() + 5))
        try:
            done = subprocess.run(
                [DDSLURM, *args], capture_output=True, text=True, env=self.env, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise Stuck(f"ddslurm {args[0]} did not return within {timeout:.0f}s") from exc
        data: Any = None
        with contextlib.suppress(ValueError):
            data = json.loads(done.stdout) if done.stdout.strip() else None
        return done.returncode, data, done.stderr

    def arrays(self) -> list[str]:
        return cluster.run_arrays(self.run_dir) if self.run_dir else []

    def attempt_records(self) -> list[dict[str, Any]]:
        records = []
        assert self.run_dir is not None
        for path in self.run_dir.glob("shards/*/**/attempt.json"):
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads(path.read_text()))
        return records

    def rows_done(self) -> int:
        """Rows the run's attempts have generated so far (every attempt's ``progress.json``, both stages)."""
        assert self.run_dir is not None
        total = 0
        for path in self.run_dir.glob("shards/*/**/progress.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                total += int(json.loads(path.read_text())["rows"])
        return total

    def all_won(self) -> bool:
        assert self.run_dir is not None
        return all((self.run_dir / "shards" / f"shard-{i:05d}" / "winner.json").exists() for i in range(self.s.shards))

    # --- setup ---

    def prepare(self) -> Path:
        s = self.s
        files = self.root / "files"
        write_recipe(files, s)
        (files / "run.yaml").write_text(run_yaml(s))
        profile = files / "profile.yaml"
        profile.write_text(profile_yaml(self.root / "work", PYTHON_ENV))
        dd_home = files / "dd-home"
        dd_home.mkdir()
        self.env = {
            k: v for k, v in __import__("os").environ.items() if not k.startswith(("FAKE_VLLM", "DATA_DESIGNER"))
        }
        self.env["DATA_DESIGNER_HOME"] = str(dd_home)
        self.env[KEY_ENV] = self.key
        self.hosted = Hosted(self.key, self.root, s.latency)
        (dd_home / "model_providers.yaml").write_text(providers_yaml(self.hosted.base_url))
        if s.has_hosted:
            if any(f.kind == "time_limit" for f in s.faults):
                self.hosted.start("--fake-latency", "600")
                self.event("time_limit: hosted provider hangs")
            else:
                self.hosted.start()
        return files

    # --- faults ---

    def first_running(self) -> bool:
        return any(r.get("state") == "running" for r in self.attempt_records())

    def inject_all(self) -> None:
        try:
            self._inject_all()
        except Exception as exc:  # reported as the harness's own failure
            self._injector_error = f"fault injection raised {type(exc).__name__}: {exc}"

    def _inject_all(self) -> None:
        s = self.s
        while not self.first_running():
            if self.all_won() or self.left() < 30:
                for f in s.faults:
                    if f.kind not in ("slow_load", "crashing_replica", "time_limit"):
                        self.event(f"{f.kind} missed (no attempt ever running)")
                return
            time.sleep(0.5)
        zero = time.monotonic()
        threads = []
        for fault in s.faults:
            thread = threading.Thread(target=self._inject_one, args=(fault, zero), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(max(1.0, self.left()))

    def _inject_one(self, fault: Fault, zero: float) -> None:
        try:
            self._inject(fault, zero)
        except Exception as exc:  # each fault runs in its own thread: its failure is the harness's, reported
            self._injector_error = f"fault injection ({fault.kind}) raised {type(exc).__name__}: {exc}"

    def _inject(self, fault: Fault, zero: float) -> None:
        if fault.kind == "slow_load":
            self.event(f"slow_load {fault.duration:.0f}s")
            return
        if fault.kind == "crashing_replica":  # set in the run file: each replica life ends after N requests
            self.event(f"crashing_replica every {fault.duration:.0f} requests")
            return
        if fault.kind == "time_limit":
            self._time_limit(zero)
            return
        while time.monotonic() < zero + fault.at and not self.all_won():
            if fault.after_rows and self.rows_done() >= fault.after_rows * self.s.records:
                break
            time.sleep(0.2)
        if self.all_won():
            self.event(f"{fault.kind} missed (run done)")
            return
        handler: Callable[[Fault], None] = getattr(self, f"_f_{fault.kind}")
        handler(fault)

    def _kill(self, kind: str) -> None:
        assert self.run_dir is not None
        label = {"generate": "batch"}.get(kind, kind)
        end = time.monotonic() + 20
        while time.monotonic() < end and not self.all_won():
            arrays = self.arrays()
            self.jobs |= set(cluster.queued(arrays))
            procs = [p for p in cluster.run_processes(self.run_dir, arrays, self.jobs) if p.kind == kind]
            if procs:
                victim = self.rng.choice(sorted(procs, key=lambda p: p.pid))
                if cluster.kill(victim.pid):
                    self.killed.add(victim.pid)
                    self.event(f"kill -9 {label} pid {victim.pid} (job {victim.job})")
                    return
            time.sleep(0.5)
        self.event(f"kill_{label} skipped (no {label} process)")

    def _f_kill_client(self, fault: Fault) -> None:
        self._kill("client")

    def _f_kill_server(self, fault: Fault) -> None:
        self._kill("server")

    def _f_kill_proxy(self, fault: Fault) -> None:
        self._kill("proxy")

    def _f_kill_batch(self, fault: Fault) -> None:
        self._kill("generate")

    def _running_task(self) -> tuple[str, str, str, str] | None:
        jobs = cluster.queued(self.arrays())
        self.jobs |= set(jobs)
        running = sorted(v for v in jobs.values() if v[1] == "RUNNING")
        return self.rng.choice(running) if running else None

    def _f_scancel_task(self, fault: Fault) -> None:
        task = self._running_task()
        if task is None:
            self.event("scancel_task skipped (nothing running)")
            return
        cluster.sh("scancel", task[0])
        self.event(f"scancel {task[0]}")

    def _f_cancel_run(self, fault: Fault) -> None:
        assert self.run_dir is not None
        rc, _, _ = self.cli("cancel", str(self.run_dir), "--json")
        self.run_cancelled = True
        self.event(f"ddslurm cancel (rc {rc})")

    def _f_requeue(self, fault: Fault) -> None:
        task = self._running_task()
        if task is None:
            self.event("requeue skipped (nothing running)")
            return
        done = cluster.sh("scontrol", "requeue", task[0])
        self.event(f"scontrol requeue {task[0]} (rc {done.returncode})")
        time.sleep(2)
        cluster.sh("scontrol", "update", f"jobid={task[0]}", "StartTime=now")  # not Slurm's requeue delay

    def _f_node_down(self, fault: Fault) -> None:
        task = self._running_task()
        if task is None or not task[2]:
            self.event("node_down skipped (nothing running)")
            return
        node = cluster.sh("scontrol", "show", "hostnames", task[2]).stdout.split()[0]
        if not cluster.NODE_LOCK.acquire(blocking=False):
            self.event("node_down skipped (another scenario has a node down)")
            return
        try:
            others = cluster.other_jobs_on(node, self.jobs | set(cluster.queued(self.arrays())))
            if others:
                self.event(f"node_down skipped ({len(others)} other job(s) on {node})")
                return
            self.downed = node
            cluster.sh("scontrol", "update", f"nodename={node}", "state=down", "reason=chaos")
            self.event(f"{node} down")
            time.sleep(fault.duration)
        finally:
            if self.downed:
                cluster.sh("scontrol", "update", f"nodename={self.downed}", "state=resume")
                self.event(f"{self.downed} resumed")
                self.downed = None
            cluster.NODE_LOCK.release()

    def _hosted_fault(self, fault: Fault, flags: list[str], what: str) -> None:
        assert self.hosted is not None
        self.hosted.start(*flags)
        self.event(f"hosted {what}")
        end = time.monotonic() + fault.duration
        while time.monotonic() < end and not self.all_won():
            time.sleep(0.5)
        self.hosted.start()
        self.event("hosted healed")

    def _f_hosted_500(self, fault: Fault) -> None:
        self._hosted_fault(fault, ["--fake-error-rate", str(fault.rate)], f"500s rate {fault.rate}")

    def _f_hosted_429(self, fault: Fault) -> None:
        """A rate-limit outage: every chat request answered 429 (``Retry-After``) until healed."""
        outage = self.root / "outage-429"
        outage.write_text("429")
        self._hosted_fault(fault, ["--fake-outage", str(outage)], "429s (rate-limited)")

    def _f_hosted_malformed(self, fault: Fault) -> None:
        self._hosted_fault(fault, ["--fake-no-choices-rate", str(fault.rate)], f"no-choices rate {fault.rate}")

    def _f_hosted_timeout(self, fault: Fault) -> None:
        self._hosted_fault(fault, ["--fake-latency", "600"], "hangs")

    def _time_limit(self, zero: float) -> None:
        """The hosted provider hangs until Slurm's time limit has ended an attempt (or long enough), then heals."""
        assert self.hosted is not None
        end = zero + TIME_LIMIT_HANG_S
        while time.monotonic() < end and self.left() > 60:
            if any(r.get("reason") in ("time_limit", "timeout") for r in self.attempt_records()):
                self.event("time limit hit")
                break
            time.sleep(1)
        self.hosted.start()
        self.event("hosted healed")

    # --- recovery ---

    def second_blow(self) -> None:
        """The scenario's recovery fault, once, after the recovery's first retry."""
        fault = self.s.recovery_fault
        if fault is None or self._second is not None:
            return
        self._second = threading.Thread(target=self._inject_one, args=(fault, time.monotonic()), daemon=True)
        self._second.start()

    def recover(self) -> None:
        assert self.run_dir is not None
        run = str(self.run_dir)
        for round_ in range(MAX_ROUNDS):
            wait_s = self.left() - 20
            if wait_s < 10:
                raise Stuck("no time left to wait for the run")
            rc, data, err = self.cli("wait", run, "--json", "--timeout", str(int(wait_s)), timeout=wait_s + 30)
            state = (data or {}).get("state")
            if rc == 0 and state == "succeeded":
                if self._second is not None and self._second.is_alive():
                    self._second.join(max(1.0, self.left() - 60))
                    if self._second.is_alive():
                        raise Stuck("the recovery fault did not end")
                    if not self.all_won():
                        continue
                if round_:
                    self.event(f"recovered in {round_} round(s)")
                if self.s.recovery_fault is not None and self._second is None:
                    self.event(f"recovery:{self.s.recovery_fault.kind} missed (no retry needed)")
                return
            if rc == 3:
                raise Stuck(f"ddslurm wait timed out (state {state})")
            if state in (None, "pending", "running"):
                time.sleep(2)
                continue
            shards = (data or {}).get("shards", [])
            if state == "cancelled" and self.run_cancelled:
                rc, out, err = self.cli("retry", run, "--resume-cancelled", "--json")
                self.event(f"retry --resume-cancelled (rc {rc})")
                self.second_blow()
                continue
            partial = [sh["shard"] for sh in shards if sh.get("state") == "partial"]
            if partial and self.s.accept_partial:
                rc, out, err = self.cli("accept-partial", run, "--shards", ",".join(map(str, partial)), "--json")
                for item in (out or {}).get("accepted", []):
                    self.accepted[int(item["shard"])] = int(item["rows"])
                self.event(f"accept-partial {partial} (rc {rc})")
                if rc == 0:
                    continue
            rc, out, err = self.cli("retry", run, "--json")
            self.event(f"retry {(out or {}).get('shards', '')} (rc {rc})")
            self.second_blow()
            if rc != 0:
                self.out.events.append(f"retry said: {err.strip().splitlines()[-1] if err.strip() else ''}")
                time.sleep(3)
        raise Failed(f"not succeeded after {MAX_ROUNDS} recovery rounds (last state {state})")

    # --- the verdict ---

    def check(self) -> None:
        assert self.run_dir is not None
        rc, data, err = self.cli("collect", str(self.run_dir), "--local", "--json", timeout=180)
        if rc != 0:
            raise Failed(f"collect failed (rc {rc}): {err.strip()[-300:]}")
        import pyarrow.parquet as pq

        table = pq.read_table(data["dataset"])  # type: ignore[no-untyped-call]
        rows = json.loads(json.dumps(table.to_pylist(), default=str))
        reference, columns = self.references.get(self.s)
        problems = []
        if sorted(table.column_names) != sorted(columns):
            problems.append(f"columns {table.column_names} != reference {columns}")
        allowed = 0
        for shard in range(self.s.shards):
            winner = json.loads((self.run_dir / "shards" / f"shard-{shard:05d}" / "winner.json").read_text())
            if winner.get("partial"):
                if shard not in self.accepted:
                    problems.append(f"shard {shard} partial without accept-partial")
                plan = json.loads((self.run_dir / "run.json").read_text())
                wanted = plan["shards"][shard]["num_records"]
                allowed += wanted - int(winner.get("rows", 0))
        self.event(self.attempt_summary())
        verdict = judge(reference, rows, allowed_lost=allowed)
        problems += verdict.problems
        problems += self.leftovers()
        hits = self.secret_hits()
        if hits:
            problems.append(f"secret in {len(hits)} file(s): {', '.join(hits[:3])}")
        if problems:
            raise Failed("; ".join(problems))

    def attempt_summary(self) -> str:
        """How hard the run was hit: its attempts, and the rows the winners resumed from earlier attempts."""
        records = self.attempt_records()
        resumed = sum(int(r.get("resumed_rows") or 0) for r in records if r.get("state") == "succeeded")
        states = Counter(str(r.get("state")) for r in records)
        return f"{len(records)} attempt(s) {dict(sorted(states.items()))}, winners resumed {resumed} row(s)"

    def leftovers(self) -> list[str]:
        """Slurm jobs, processes and scratch directories of the run still there once it ended (bounded waits)."""
        assert self.run_dir is not None
        arrays = self.arrays()
        problems = []
        end = time.monotonic() + min(60.0, max(5.0, self.left()))
        while (jobs := cluster.queued(arrays)) and time.monotonic() < end:
            time.sleep(1)
        if jobs:
            left = sorted(f"{v[0]} {v[1]} ({v[3]})" for v in jobs.values())
            problems.append(f"Slurm jobs left {len(left)} after the run ended: {', '.join(left[:4])}")
        self.jobs |= cluster.job_ids(arrays)
        end = time.monotonic() + 30
        while (procs := cluster.run_processes(self.run_dir, arrays, self.jobs)) and time.monotonic() < end:
            time.sleep(1)
        if procs:
            problems.append(f"processes left: {[(p.pid, p.kind, p.job) for p in procs][:4]}")
        scratch = cluster.scratch_dirs(self.jobs)
        # a process SIGKILLed cannot remove its own: documented to stay until the next ddslurm step of this user on
        # the node sweeps it; proven here by that sweep (the product's own), which must remove exactly those
        killed = [p for p in scratch if cluster.scratch_creator(p) in self.killed]
        if killed:
            kept = cluster.sweep_scratch(killed)
            gone = [p for p in killed if not p.exists()]
            self.event(f"scratch of a SIGKILLed process: {len(gone)} of {len(killed)} removed by the sweep" + kept)
            scratch = [p for p in scratch if p.exists()]
        if scratch:
            problems.append(f"scratch directories left: {[p.name for p in scratch][:3]}")
        return problems

    def secret_hits(self) -> list[str]:
        assert self.run_dir is not None
        return files_holding(self.run_dir, self.key)

    # --- the whole scenario ---

    def execute(self) -> Outcome:
        injector: threading.Thread | None = None
        with _ACTIVE_LOCK:
            ACTIVE.add(self)
        try:
            files = self.prepare()
            # a drawn time limit (2 minutes, the provider hanging) is meant to end the run's first allocation:
            # confirmed, as a user confirms a run predicted to outlast its limit
            overrun = ["--accept-overrun"] if any(f.kind == "time_limit" for f in self.s.faults) else []
            submit = ["submit", str(files / "run.yaml"), "--profile", str(files / "profile.yaml"), *overrun, "--json"]
            rc, data, err = self.cli(*submit, timeout=180)
            if rc != 0 or not data or "run_dir" not in data:
                raise Failed(f"submit failed (rc {rc}): {err.strip()[-400:]}")
            self.run_dir = Path(data["run_dir"])
            self.out.run_dir = str(self.run_dir)
            injector = threading.Thread(target=self.inject_all, daemon=True)
            injector.start()
            injector.join(max(1.0, self.left() - 30))
            if injector.is_alive():
                raise Stuck("fault injection did not end")
            if self._injector_error:
                raise Failed(self._injector_error)
            self.recover()
            self.check()
        except Stuck as exc:
            self.out.verdict, self.out.reason = "FAIL", f"stuck: {exc}"
        except Failed as exc:
            self.out.verdict, self.out.reason = "FAIL", str(exc)
        except Exception as exc:
            self.out.verdict, self.out.reason = "FAIL", f"harness error: {type(exc).__name__}: {exc}"
        finally:
            self.cleanup()
            self.out.seconds = self.t()
            with _ACTIVE_LOCK:
                ACTIVE.discard(self)
        return self.out

    def cleanup(self) -> None:
        if self.downed:
            cluster.sh("scontrol", "update", f"nodename={self.downed}", "state=resume")
        if self.run_dir is not None and self.out.verdict != "ok":
            with contextlib.suppress(Exception):
                subprocess.run(
                    [DDSLURM, "cancel", str(self.run_dir)], env=self.env, capture_output=True, timeout=120, check=False
                )
            arrays = self.arrays()
            if arrays:
                cluster.sh("scancel", *arrays)
            for proc in cluster.run_processes(self.run_dir, arrays, self.jobs):
                cluster.kill(proc.pid)
        if self.hosted is not None:
            self.hosted.stop()
        if self.out.verdict == "ok":
            shutil.rmtree(self.root, ignore_errors=True)


def files_holding(root: Path, secret: str) -> list[str]:
    """Files under ``root`` holding ``secret``: every file's bytes read in full, and every value of every Parquet
    file (whose pages may be compressed)."""
    import pyarrow.parquet as pq

    needle = secret.encode()
    hits = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found = needle in data
        if not found and (path.suffix == ".parquet" or data[:4] == b"PAR1"):
            with contextlib.suppress(Exception):
                table = pq.read_table(path)  # type: ignore[no-untyped-call]
                found = secret in json.dumps(table.to_pylist(), default=str)
        if found:
            hits.append(str(path.relative_to(root)))
    return hits


class Failed(Exception):
    """The scenario's verdict is FAIL, with this reason."""
