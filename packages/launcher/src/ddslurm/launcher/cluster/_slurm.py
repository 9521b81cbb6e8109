"""A small Slurm client over argument vectors (no shell). The command runner is injected for tests.

Every scheduler command runs with a timeout (:class:`SubprocessRunner`; ``DDSLURM_SLURM_TIMEOUT`` seconds,
120 by default): one that does not answer in time is stopped, with everything it started, and raises
:class:`SlurmTimeoutError`, a :class:`SlurmError` whose message says which command and how long it waited.
"""

from __future__ import annotations

import math
import os
import pwd
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ddslurm.config import Limit, QueuedJob, SchedulerLimits, expand_ranges, parse_array_task
from ddslurm.launcher.cluster._process import Stopped, run_in_group
from ddslurm.launcher.errors import LauncherError, SlurmError


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed: ...


DEFAULT_TIMEOUT_S = 120.0
JOB_UMASK = 0o077
"""The umask of every scheduler command ddslurm runs, so of every job it submits (and the logs Slurm opens)."""
TIMEOUT_ENV = "DDSLURM_SLURM_TIMEOUT"
"""Seconds every scheduler command may take (sbatch, squeue, sacct, scancel, scontrol, sacctmgr, sinfo)."""


class SlurmTimeoutError(SlurmError):
    """A scheduler command did not answer within its timeout and was stopped."""

    def __init__(self, argv: list[str], seconds: float) -> None:
        why = "the Slurm controller is busy or unreachable"
        if argv[0] == "sbatch":
            why += ", or the cluster is at a job limit (sbatch waits while slurmctld holds MaxJobCount jobs)"
        LauncherError.__init__(
            self,
            f"{argv[0]} did not answer within {seconds:g} s and was stopped ({why}; {TIMEOUT_ENV} sets the timeout)",
        )
        self.argv, self.returncode, self.stderr, self.seconds = argv, -1, "", seconds


class SubprocessRunner:
    """Runs a scheduler command in its own process group, without a shell, stdin from /dev/null. A command
    that takes longer than ``timeout_s`` is killed with its whole group (sbatch wrappers that fork included)
    and raises :class:`SlurmTimeoutError`; a command that is not installed raises :class:`SlurmError`."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SubprocessRunner:
        """The timeout from ``DDSLURM_SLURM_TIMEOUT`` (seconds) when it is a positive number."""
        raw = env.get(TIMEOUT_ENV, "")
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        return cls(value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_S)

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        args = list(argv)
        try:
            # sbatch hands its umask to the job (SLURM_UMASK): the logs Slurm writes for the run's jobs are then
            # owner-only whatever the submitting shell's umask.
            done = run_in_group(args, timeout_s=self.timeout_s, env=env, umask=JOB_UMASK)
        except FileNotFoundError:
            raise SlurmError(args, 127, f"{args[0]}: command not found (is Slurm installed and on PATH?)") from None
        except Stopped:
            raise SlurmTimeoutError(args, self.timeout_s) from None
        return Completed(done.returncode, done.stdout, done.stderr)


subprocess_runner = SubprocessRunner()
"""The default runner (120 s per command)."""


@dataclass(frozen=True, slots=True)
class TaskState:
    """Scheduler view of one array task (or a plain job, ``task`` None)."""

    job_id: str
    task: int | None
    state: str
    reason: str = ""
    exit_code: str = ""


@dataclass(frozen=True, slots=True)
class Accounting:
    """What one run of an array task (or job) was allocated and for how long (``sacct``)."""

    job_id: str
    task: int | None
    state: str
    elapsed_s: int
    gpus: int
    """GPUs of the allocation (``gres/gpu`` of its AllocTRES); 0 when it had none."""
    start: str | None = None
    end: str | None = None
    cpus: int = 0
    """CPUs of the allocation (``cpu`` of its AllocTRES); 0 when sacct does not say."""


_TYPED_GPU_TRES = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)")


def tres_gpus(tres: str) -> int:
    """``billing=2,cpu=2,gres/gpu=4,mem=2G`` → 4; a typed count (``gres/gpu:a100=4``) when no plain one is given."""
    plain = re.search(r"(?:^|,)gres/gpu=(\d+)", tres)
    if plain:
        return int(plain.group(1))
    typed = _TYPED_GPU_TRES.findall(tres)
    return sum(int(n) for n in typed)


_RANGE = re.compile(r"^(?P<array>\d+)_\[(?P<spec>[^\]]+)\]$")


def expand_task_spec(spec: str) -> list[int]:
    """``0-3,7%2`` → [0, 1, 2, 3, 7] (the throttle after ``%`` is ignored)."""
    return expand_ranges(spec.split("%")[0])


def parse_job_key(key: str) -> list[tuple[str, int | None]]:
    """``12_3`` → [("12", 3)]; ``12_[0-2]`` → three tasks; ``12`` → [("12", None)]."""
    if m := _RANGE.match(key):
        return [(m.group("array"), t) for t in expand_task_spec(m.group("spec"))]
    if (task := parse_array_task(key)) is not None:
        return [(task.array_job_id, task.task)]
    return [(key, None)]


NODE_ENV_ALLOWED = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SLURM_CONF", "SSL_CERT_FILE", "SSL_CERT_DIR",
)  # fmt: skip
"""The submitting environment's variables a job gets besides the ones its submission names: where programs are,
the locale and time zone, the temporary directory, where Slurm's configuration is, and which certificate
authorities TLS trusts (OpenSSL's ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``, which httpx reads too: a site's own CA
bundle, so the nodes' hosted calls trust what ``--check-endpoints`` trusted on the submit host). Nothing else."""


def job_environment(env: Mapping[str, str], names: Sequence[str] = ()) -> dict[str, str]:
    """The whole environment a job gets: :data:`NODE_ENV_ALLOWED` and ``names`` as ``env`` has them (unset or
    empty ones are left out). ``sbatch --export=ALL`` from exactly this environment: Slurm passes it on as it
    is, and does not load the user's login environment (``--export=NONE`` and ``--export=NAME,...`` both make
    the node run the user's login shell, ``~/.profile`` and ``~/.bashrc`` included, and keep what it sets)."""
    out: dict[str, str] = {}
    for name in (*NODE_ENV_ALLOWED, *names):
        value = env.get(name)
        if value:
            out[name] = value
    return out


_NO_LIMIT = frozenset({"", "-1", "INFINITE", "UNLIMITED", "NONE", "N/A"})


def parse_limit(value: str) -> int | None:
    """A Slurm limit as sacctmgr or scontrol prints it; None for "no limit" (empty, -1, INFINITE, ...)."""
    text = value.strip()
    if text.upper() in _NO_LIMIT or not text.isdigit():
        return None
    return int(text)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """What ``scontrol show config`` says about submission limits."""

    max_array_size: int
    max_job_count: int | None
    cluster_name: str
    enforce: str
    """``AccountingStorageEnforce``: association and QOS limits hold only with ``limits`` (or ``safe``) in it."""
    store_flags: str = ""
    """``AccountingStoreFlags``: with ``job_env`` slurmdbd keeps every batch job's environment (its API keys)."""
    slurm_conf: str = ""
    """``SLURM_CONF``: the configuration file the controller read ("" when it does not say)."""
    select_type: str = ""
    """``SelectType``: ``--gpus=N`` needs ``select/cons_tres``."""

    @property
    def enforces_limits(self) -> bool:
        return bool(self._enforced() & {"limits", "safe"})

    @property
    def enforces_associations(self) -> bool:
        """Whether Slurm refuses a job whose account or QOS the user's associations do not have (``associations``,
        which ``limits``, ``qos`` and ``safe`` imply)."""
        return bool(self._enforced() & {"associations", "limits", "qos", "safe"})

    def _enforced(self) -> set[str]:
        return {w.strip().lower() for w in self.enforce.split(",")}

    @property
    def stores_job_env(self) -> bool:
        return "job_env" in {w.strip().lower() for w in self.store_flags.split(",")}


@dataclass(frozen=True, slots=True)
class Association:
    """One of the user's associations (``sacctmgr show assoc``); limits are None when not set."""

    account: str
    user: str
    partition: str
    max_submit_jobs: int | None
    max_jobs: int | None
    grp_submit_jobs: int | None
    qos: tuple[str, ...]
    default_qos: str


@dataclass(frozen=True, slots=True)
class Qos:
    name: str
    max_submit_per_user: int | None
    max_submit_per_account: int | None
    grp_submit_jobs: int | None
    max_jobs_per_user: int | None


class Slurm:
    def __init__(
        self, runner: Runner | None = None, env: Mapping[str, str] | None = None, *, user: str | None = None
    ) -> None:
        self._run: Runner = (
            runner if runner is not None else SubprocessRunner.from_env(env if env is not None else os.environ)
        )
        self._env = env
        self._user = user
        self._config: ClusterConfig | None = None

    def _check(self, argv: list[str], env: Mapping[str, str] | None = None) -> str:
        done = self._run(argv, env=env if env is not None else self._env)
        if done.returncode != 0:
            raise SlurmError(argv, done.returncode, done.stderr or done.stdout)
        return done.stdout

    def sbatch(self, script: str, *, export: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        """Submit ``script`` (a path). The job's environment is exactly :func:`job_environment` of the submitting
        environment (``env``, else the client's, else this process's) and ``export``: sbatch runs in it with
        ``--export=ALL``, so no login file of the user and nothing else of the submitting shell reaches the job."""
        base = env if env is not None else self._env if self._env is not None else os.environ
        out = self._check(["sbatch", "--parsable", "--export=ALL", script], job_environment(base, export))
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(["sbatch"], 0, f"unexpected output: {out!r}")
        return job_id

    def sbatch_test(self, script: str, *, export: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        """``sbatch --test-only SCRIPT`` in the environment :meth:`sbatch` would submit it from: whether Slurm would
        accept the job, and when and where it would start (what sbatch printed); submits nothing. Raises
        :class:`SlurmError` with Slurm's words when it refuses the job."""
        base = env if env is not None else self._env if self._env is not None else os.environ
        argv = ["sbatch", "--test-only", "--export=ALL", script]
        done = self._run(argv, env=job_environment(base, export))
        if done.returncode != 0:
            raise SlurmError(argv, done.returncode, done.stderr or done.stdout)
        return (done.stderr or done.stdout).strip()

    def squeue(self, job_ids: Sequence[str]) -> list[TaskState]:
        """Live jobs among ``job_ids`` (one call whatever their number). Unknown ids are simply absent."""
        if not job_ids:
            return []
        done = self._run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T|%r"], env=self._env)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return []
            raise SlurmError(["squeue"], done.returncode, done.stderr)
        states: list[TaskState] = []
        for line in done.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 3:
                continue
            for job, task in parse_job_key(parts[0]):
                states.append(TaskState(job, task, parts[1], parts[2]))
        return states

    def _sacct(self, job_ids: Sequence[str], fields: str, least: int) -> Iterator[list[str]]:
        """The allocation lines (``-X``) of every run of every task of ``job_ids`` (``--duplicates``: a requeued
        task has one per run, oldest first), split into ``fields``; lines with fewer than ``least`` are skipped.
        The state's first word only (``CANCELLED by 0`` → ``CANCELLED``)."""
        if not job_ids:
            return
        argv = ["sacct", "-X", "-n", "--duplicates", "--parsable2", "-j", ",".join(job_ids), f"--format={fields}"]
        for line in self._check(argv).splitlines():
            parts = line.strip().split("|")
            if len(parts) >= least:
                parts[1] = parts[1].split()[0] if parts[1] else ""
                yield parts

    def sacct(self, job_ids: Sequence[str]) -> list[TaskState]:
        """Accounting records for ``job_ids``, allocation lines only: every run of a task (a requeued task has one
        per run, oldest first), so the last line of a task is its latest run."""
        return [
            TaskState(job, task, parts[1], parts[3] if len(parts) > 3 else "", parts[2])
            for parts in self._sacct(job_ids, "JobID,State,ExitCode,Reason", 3)
            for job, task in parse_job_key(parts[0])
        ]

    def accounting(self, job_ids: Sequence[str]) -> list[Accounting]:
        """Every run of every task of ``job_ids`` (requeued runs included): elapsed seconds and GPUs allocated."""
        found: list[Accounting] = []
        for parts in self._sacct(job_ids, "JobID,State,ElapsedRaw,AllocTRES,Start,End", 4):
            elapsed = int(parts[2]) if parts[2].isdigit() else 0
            start = parts[4] if len(parts) > 4 and parts[4][:1].isdigit() else None
            end = parts[5] if len(parts) > 5 and parts[5][:1].isdigit() else None
            cpus = re.search(r"(?:^|,)cpu=(\d+)", parts[3])
            for job, task in parse_job_key(parts[0]):
                gpus = tres_gpus(parts[3])
                found.append(Accounting(job, task, parts[1], elapsed, gpus, start, end, int(cpus[1]) if cpus else 0))
        return found

    def scancel(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs, array tasks (``12_3``) or steps; unknown or finished ids are not an error."""
        if job_ids:
            self._check(["scancel", *job_ids])

    def sinfo_nodes(self, fmt: str) -> str:
        """``sinfo -h -N -o FMT``: one line per node and partition, of the partitions this user may see."""
        return self._check(["sinfo", "-h", "-N", "-o", fmt])

    def config(self) -> ClusterConfig:
        """``scontrol show config`` (read once per client): MaxArraySize (1001 when Slurm does not say; task ids
        stay below it), MaxJobCount, ClusterName, AccountingStorageEnforce, AccountingStoreFlags and SLURM_CONF."""
        if self._config is None:
            out = self._check(["scontrol", "show", "config"])

            def value(name: str) -> str:
                match = re.search(rf"^{name}\s*=\s*(.*?)\s*$", out, re.MULTILINE)
                return match.group(1) if match else ""

            array = value("MaxArraySize")
            self._config = ClusterConfig(
                max_array_size=int(array) if array.isdigit() else 1001,
                max_job_count=parse_limit(value("MaxJobCount")) or None,
                cluster_name=value("ClusterName"),
                enforce=value("AccountingStorageEnforce"),
                store_flags=value("AccountingStoreFlags"),
                slurm_conf=value("SLURM_CONF"),
                select_type=value("SelectType"),
            )
        return self._config

    def max_array_size(self) -> int:
        """The cluster's MaxArraySize: task ids must stay below it (1001 when Slurm does not say)."""
        return self.config().max_array_size

    def user(self) -> str:
        """The submitting user's name (the client's ``user``, else this process's owner)."""
        if self._user is None:
            self._user = pwd.getpwuid(os.getuid()).pw_name
        return self._user

    def queue(self) -> list[QueuedJob]:
        """Every job and array task slurmctld holds now, of every user and in every state (one ``squeue``):
        what counts against its limits, and the batch script each was submitted from."""
        out = self._check(["squeue", "-h", "-r", "-t", "all", "-o", "%F|%u|%a|%q|%T|%o"])
        jobs: list[QueuedJob] = []
        for line in out.splitlines():
            parts = line.strip().split("|", 5)
            if len(parts) == 6:
                jobs.append(QueuedJob(*parts))
        return jobs

    def associations(self, user: str, cluster: str = "", account: str = "") -> list[Association]:
        """The associations of ``user`` (or, with ``user`` "", every association of ``account``)."""
        argv = ["sacctmgr", "-nP", "show", "assoc"]
        argv += [f"user={user}"] if user else []
        argv += [f"account={account}"] if account else []
        argv += [f"cluster={cluster}"] if cluster else []
        argv.append("format=Account,User,Partition,MaxSubmitJobs,MaxJobs,GrpSubmitJobs,QOS,DefaultQOS")
        rows: list[Association] = []
        for line in self._check(argv).splitlines():
            parts = line.strip().split("|")
            if len(parts) < 8:
                continue
            rows.append(
                Association(
                    account=parts[0],
                    user=parts[1],
                    partition=parts[2],
                    max_submit_jobs=parse_limit(parts[3]),
                    max_jobs=parse_limit(parts[4]),
                    grp_submit_jobs=parse_limit(parts[5]),
                    qos=tuple(q for q in parts[6].split(",") if q),
                    default_qos=parts[7],
                )
            )
        return rows

    def default_account(self, user: str) -> str:
        out = self._check(["sacctmgr", "-nP", "show", "user", f"name={user}", "format=DefaultAccount"])
        return next((line.strip() for line in out.splitlines() if line.strip()), "")

    def qos(self, name: str) -> Qos | None:
        out = self._check(
            [
                "sacctmgr", "-nP", "show", "qos", name,
                "format=Name,MaxSubmitJobsPerUser,MaxSubmitJobsPerAccount,GrpSubmitJobs,MaxJobsPerUser",
            ]
        )  # fmt: skip
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 5 and parts[0] == name:
                return Qos(name, *(parse_limit(p) for p in parts[1:5]))
        return None

    def limits(
        self, *, account: str | None = None, qos: str | None = None, partition: str | None = None
    ) -> SchedulerLimits:
        """Every limit a submission of jobs with this ``account``, ``qos`` and ``partition`` (None: the user's
        defaults) must fit in, with what counts against each now. One ``scontrol show config`` (cached), one
        ``squeue`` and, where the cluster enforces association and QOS limits, three or four ``sacctmgr`` calls.

        MaxJobCount counts every job slurmctld holds (all users, finished ones kept for MinJobAge included);
        the submit limits of an association or QOS count the pending and running jobs of its user, account or
        QOS. Each array task counts as one job. Limits that only hold back running jobs (``MaxJobs``) are notes."""
        config = self.config()
        queue = tuple(self.queue())
        limits: list[Limit] = []
        notes: list[str] = []
        if config.max_job_count is not None:
            limits.append(Limit("MaxJobCount", "cluster", config.max_job_count, len(queue)))
        if not config.enforces_limits:
            notes.append(
                "association and QOS limits: not enforced by this cluster "
                f"(AccountingStorageEnforce = {config.enforce or 'none'}), so not read"
            )
            return SchedulerLimits(config.max_array_size, tuple(limits), tuple(notes), queue)
        user = self.user()
        active = [j for j in queue if j.active]
        rows = self.associations(user, config.cluster_name)
        if account is None:
            accounts = sorted({r.account for r in rows})
            account = accounts[0] if len(accounts) == 1 else self.default_account(user) if accounts else ""
        row = _pick_association([r for r in rows if r.account == account], partition)
        if row is None:
            notes.append(f"no association of user {user!r} with account {account!r} was found: its limits not read")
        else:
            self._association_limits(row, user, active, config.cluster_name, limits, notes)
        if qos is None:
            qos = (row.default_qos or (row.qos[0] if len(row.qos) == 1 else "")) if row is not None else ""
        self._qos_limits(qos or "normal", user, account, active, limits, notes)
        return SchedulerLimits(config.max_array_size, tuple(limits), tuple(notes), queue)

    def _association_limits(
        self, row: Association, user: str, active: list[QueuedJob], cluster: str, limits: list[Limit], notes: list[str]
    ) -> None:
        account = row.account
        scope = f"association {account}/{user}" + (f" (partition {row.partition})" if row.partition else "")
        mine = len([j for j in active if j.user == user and j.account == account])
        if row.max_submit_jobs is not None:
            limits.append(Limit("MaxSubmitJobs", scope, row.max_submit_jobs, mine))
        if row.grp_submit_jobs is not None:
            limits.append(Limit("GrpSubmitJobs", scope, row.grp_submit_jobs, mine))
        if row.max_jobs is not None:
            notes.append(f"MaxJobs {row.max_jobs} ({scope}): at most that many tasks run at once; the rest wait")
        parent = next((r for r in self.associations("", cluster, account) if not r.user and not r.partition), None)
        if parent is not None and parent.grp_submit_jobs is not None:  # the whole account's jobs
            used = len([j for j in active if j.account == account])
            limits.append(Limit("GrpSubmitJobs", f"account {account}", parent.grp_submit_jobs, used))

    def _qos_limits(
        self, qos: str, user: str, account: str, active: list[QueuedJob], limits: list[Limit], notes: list[str]
    ) -> None:
        found = self.qos(qos)
        if found is None:
            notes.append(f"QOS {qos!r} was not found: its limits not read")
            return
        in_qos = [j for j in active if j.qos == qos]
        for name, value, counted, who in (
            ("MaxSubmitJobsPerUser", found.max_submit_per_user, [j for j in in_qos if j.user == user], "per user"),
            ("MaxSubmitJobsPerAccount", found.max_submit_per_account, [j for j in in_qos if j.account == account],
             "per account"),
            ("GrpSubmitJobs", found.grp_submit_jobs, in_qos, "all users"),
        ):  # fmt: skip
            if value is not None:
                limits.append(Limit(name, f"QOS {qos} ({who})", value, len(counted)))
        if found.max_jobs_per_user is not None:
            notes.append(f"MaxJobsPerUser {found.max_jobs_per_user} (QOS {qos}): at most that many tasks run at once")


def _pick_association(rows: list[Association], partition: str | None) -> Association | None:
    """The association a job uses: the one of its partition, else the one without a partition."""
    return next((r for r in rows if partition and r.partition == partition), None) or next(
        (r for r in rows if not r.partition), rows[0] if rows else None
    )
