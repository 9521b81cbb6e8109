"""The profile's checks against the cluster (``ddslurm doctor``, and ``submit`` and its dry run before anything is
submitted): each a :class:`Check`, ok, a problem placed at the ``file:line:col`` of the field that causes it, or
skipped with the reason.

What the cluster says is asked once per command (:class:`ClusterFacts`: one ``sinfo``, one ``scontrol show
config``, one ``sacctmgr show assoc``); :func:`profile_checks` needs only the profile (partitions, GPUs and memory
of their nodes, how jobs ask for GPUs, the account, ``python_env``'s versions, the vLLM executable or image);
:func:`job_checks` the compiled plan (every job fits on a node of its partition, the engines' versions against the
flags of the servers' command lines, the QOS, and ``sbatch
--test-only`` of the first array). :func:`refuse_problems` refuses all problems at once: ``submit`` and its dry
run call :func:`check_profile_first` before they prepare the inputs and :func:`check_jobs` once the arrays are
planned.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ddslurm.config import (
    ClusterProfile,
    ConfigError,
    Engine,
    Plan,
    Resources,
    RunFile,
    UnsafePathError,
    VersionsRequest,
    check_workspace,
    locate,
    read_yaml,
)
from ddslurm.launcher.cluster._cluster import ClusterInfo, NodeRow, read_cluster
from ddslurm.launcher.cluster._doctor_versions import judge_versions
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._process import Stopped
from ddslurm.launcher.cluster._python_env import runtime_command, runtime_problem
from ddslurm.launcher.cluster._slurm import Association, ClusterConfig, Slurm
from ddslurm.launcher.errors import InspectAnswerError, SlurmError, SubmitError
from ddslurm.launcher.submission._inputs import SubmitInputs
from ddslurm.launcher.submission._recipe import script_environment, secret_names
from ddslurm.planner import parse_memory_mb
from ddslurm.providers.discovery import settings_dir
from ddslurm.runtime import NODE_DISTRIBUTIONS, check_serving, engine_version, installed_versions, refusal_text

CheckStatus = Literal["ok", "problem", "skipped"]
VERSIONS_TIMEOUT_S = 60
_IMAGE_FILE = re.compile(r"^[./~]|\.(sif|sqsh|squashfs|simg)$")


@dataclass(frozen=True, slots=True)
class Check:
    """One check: ``status`` ``ok`` (``detail``: what was found), ``problem`` (``detail``: what is wrong, placed at
    ``where`` (``file:line:col``) and ``field``) or ``skipped`` (``detail``: why)."""

    name: str
    status: CheckStatus
    detail: str
    where: str = ""
    field: str = ""

    @property
    def message(self) -> str:
        head = ": ".join(part for part in (self.where, self.field) if part)
        return f"{head}: {self.detail}" if head else self.detail


def field_place(field: str, run_path: Path | None, profile_path: Path) -> tuple[str, str]:
    """Where a field is: ``(file:line:col, field)`` for a run-file field (``submission.memory``) or a profile field
    (``profile.gpus_per_node``, placed in the profile as ``gpus_per_node``); the file's first line when the field is
    not in it (a default), no place without a run file."""
    path = profile_path if field.startswith("profile.") else run_path
    field = field.removeprefix("profile.")
    if path is None:
        return "", field
    steps: list[str | int] = [int(i) if i else name for name, i in re.findall(r"([A-Za-z_][\w-]*)|\[(\d+)\]", field)]
    try:
        line, col = locate(read_yaml(path), steps)
    except ConfigError:
        line, col = None, None
    return (str(path) if line is None else f"{path}:{line}:{col}"), field


class ClusterFacts:
    """What the checks ask the scheduler, each at most once: one ``sinfo``, one ``scontrol show config``, one
    ``sacctmgr show assoc``; and where the run file and the profile are, to place a problem at its field. A
    question that cannot be answered is remembered with why (``*_error``), and the checks that need it are
    skipped."""

    def __init__(
        self,
        slurm: Slurm,
        env: Mapping[str, str],
        run_path: Path | None,
        profile_path: Path,
        host: EngineHost = RUNTIME_PROCESS,
        profile_text: str | None = None,
    ) -> None:
        self.slurm, self.env, self.run_path, self.profile_path = slurm, env, run_path, profile_path
        self.host = host
        self._profile_text = profile_text
        self._profile_fields: frozenset[str] | None = None
        self._cluster: ClusterInfo | None = None
        self._config: ClusterConfig | None = None
        self._assoc: list[Association] | None = None
        self.cluster_error = self.config_error = self.assoc_error = ""

    def profile_fields(self) -> frozenset[str]:
        """The fields the profile file sets itself (not left to their defaults): from its text as the caller read
        it (``profile_text``), else read here once."""
        if self._profile_fields is None:
            tree = read_yaml(self.profile_path, text=self._profile_text) or {}
            self._profile_fields = frozenset(str(k) for k in tree)
        return self._profile_fields

    def check(self, name: str, status: CheckStatus, detail: str, field: str = "") -> Check:
        """A check of ``field`` (``profile.partition``, ``submission.cpus``), placed at it when it is a problem."""
        if status != "problem" or not field:
            return Check(name, status, detail, field=field.removeprefix("profile."))
        where, shown = field_place(field, self.run_path, self.profile_path)
        return Check(name, status, detail, where, shown)

    def cluster(self) -> ClusterInfo | None:
        """The partitions and nodes sinfo shows; None (``cluster_error``: why) when it cannot be asked or shows no
        node."""
        if self._cluster is None and not self.cluster_error:
            try:
                cluster = read_cluster(self.slurm)
            except SlurmError as exc:
                self.cluster_error = f"sinfo could not be asked ({exc})"
                return None
            if not cluster.nodes:
                self.cluster_error = "sinfo shows no node"
                return None
            self._cluster = cluster
        return self._cluster

    def config(self) -> ClusterConfig | None:
        if self._config is None and not self.config_error:
            try:
                self._config = self.slurm.config()
            except SlurmError as exc:
                self.config_error = f"scontrol show config could not be asked ({exc})"
        return self._config

    def associations(self) -> list[Association] | None:
        """The user's associations; None (``assoc_error``) without accounting (no sacctmgr, no slurmdbd) or when
        sacctmgr lists none."""
        if self._assoc is None and not self.assoc_error:
            config = self.config()
            try:
                rows = self.slurm.associations(self.slurm.user(), config.cluster_name if config else "")
            except SlurmError as exc:
                self.assoc_error = f"sacctmgr could not be asked, so no accounting to check against ({exc})"
                return None
            if not rows:
                self.assoc_error = f"sacctmgr lists no association of user {self.slurm.user()!r} (no accounting here)"
                return None
            self._assoc = rows
        return self._assoc

    def enforced(self) -> bool:
        """Whether Slurm refuses jobs whose account or QOS the user's associations do not have."""
        config = self.config()
        return config is not None and config.enforces_associations


def refuse_problems(checks: Sequence[Check], what: str = "the profile does not fit this cluster") -> None:
    """Refuse, naming every problem at once, when any check found one (``what``: the refusal's first words)."""
    problems = [c for c in checks if c.status == "problem"]
    if problems:
        lines = "\n".join(f"  {c.message}" for c in problems)
        raise SubmitError(f"{what} ({len(problems)} problem(s)):\n{lines}")


def _names(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _partition_check(facts: ClusterFacts, field: str, value: str | None) -> Check:
    name = field.removeprefix("profile.")
    if not value:
        return facts.check(name, "skipped", "not set: jobs go to the cluster's default partition")
    cluster = facts.cluster()
    if cluster is None:
        return facts.check(name, "skipped", facts.cluster_error)
    known = [p.name for p in cluster.partitions]
    for part in _names(value):
        found = cluster.partition(part)
        if found is None:
            detail = f"partition {part!r} does not exist (sinfo shows {', '.join(known)}){_did_you_mean(part, known)}"
            return facts.check(name, "problem", detail, field)
        if not found.available:
            return facts.check(name, "problem", f"partition {part!r} is not up (sinfo: not available)", field)
    return facts.check(name, "ok", f"{value}: exists and is up (sinfo)")


def _gpu_partitions(facts: ClusterFacts, profile: ClusterProfile) -> list[str] | None:
    """The partitions the profile's GPU jobs go to, when sinfo knows them all."""
    cluster = facts.cluster()
    if cluster is None:
        return None
    names = _names(profile.partition) or [p.name for p in cluster.partitions if p.default]
    return names if names and all(cluster.partition(n) is not None for n in names) else None


def _largest(nodes: Sequence[NodeRow]) -> str:
    return f"{max(n.cpus for n in nodes)} CPUs, {max(n.memory_mb for n in nodes)} MB, {max(n.gpus for n in nodes)} GPUs"


def _gpu_checks(facts: ClusterFacts, profile: ClusterProfile) -> list[Check]:
    """``gpus_per_node``, ``gpu_request`` and ``memory_per_gpu`` against the nodes of the GPU partition."""
    per_node = profile.gpus_per_node
    if per_node == 0:
        why = "0: runs with model deployments are refused by the planner"
        return [facts.check(f, "skipped", why) for f in ("gpus_per_node", "gpu_request", "memory_per_gpu")]
    cluster, parts = facts.cluster(), _gpu_partitions(facts, profile)
    if cluster is None or parts is None:
        why = facts.cluster_error or "the partition is not known (above)"
        return [facts.check(f, "skipped", why) for f in ("gpus_per_node", "gpu_request", "memory_per_gpu")]
    checks: list[Check] = []
    shown = ", ".join(parts)
    enough = {p: cluster.fitting(p, gpus=per_node) for p in parts}
    short = [p for p in parts if not enough[p]]
    if short:
        most = max(n.gpus for p in short for n in cluster.fitting(p))
        detail = f"{per_node} GPUs per node, but the nodes of partition {short[0]} have at most {most} (sinfo GRES)"
        checks.append(facts.check("gpus_per_node", "problem", detail, "profile.gpus_per_node"))
    else:
        checks.append(facts.check("gpus_per_node", "ok", f"{per_node}: nodes of partition {shown} have as many"))
    checks.append(_gpu_request_check(facts, profile, cluster, parts))
    if profile.memory_per_gpu is None:
        checks.append(facts.check("memory_per_gpu", "skipped", "not set: jobs ask for submission.memory, if any"))
    elif not short:
        want = parse_memory_mb(profile.memory_per_gpu, "memory_per_gpu") * per_node
        big = [p for p in parts if not cluster.fitting(p, memory_mb=want, gpus=per_node)]
        if big:
            most = max(n.memory_mb for n in enough[big[0]])
            detail = (
                f"{profile.memory_per_gpu} x {per_node} GPUs = {want} MB, but the nodes of partition {big[0]} with "
                f"{per_node} GPUs have at most {most} MB (sinfo)"
            )
            checks.append(facts.check("memory_per_gpu", "problem", detail, "profile.memory_per_gpu"))
        else:
            detail = f"{want} MB for {per_node} GPUs: nodes of partition {shown} have as much"
            checks.append(facts.check("memory_per_gpu", "ok", detail))
    else:
        checks.append(facts.check("memory_per_gpu", "skipped", "no node has gpus_per_node GPUs (above)"))
    return checks


def _gpu_request_check(facts: ClusterFacts, profile: ClusterProfile, cluster: ClusterInfo, parts: list[str]) -> Check:
    if not any(n.gpus for p in parts for n in cluster.fitting(p)):
        detail = f"the nodes of partition {', '.join(parts)} have no GRES gpu (sinfo): Slurm cannot give them GPUs"
        return facts.check("gpu_request", "problem", detail, "profile.gpu_request")
    if profile.gpu_request == "gres":
        return facts.check("gpu_request", "ok", "gres (--gres=gpu:N): the nodes show GRES gpu (sinfo)")
    config = facts.config()
    if config is None or not config.select_type:
        return facts.check("gpu_request", "skipped", facts.config_error or "scontrol does not say the SelectType")
    if "cons_tres" not in config.select_type:
        detail = f"gpus (--gpus=N) needs SelectType select/cons_tres, this cluster has {config.select_type}; use gres"
        return facts.check("gpu_request", "problem", detail, "profile.gpu_request")
    return facts.check("gpu_request", "ok", f"gpus (--gpus=N): SelectType {config.select_type}")


def _account_check(facts: ClusterFacts, account: str | None, field: str) -> Check:
    if not account:
        return facts.check("account", "skipped", "not set: jobs use your default account")
    rows = facts.associations()
    if rows is None:
        return facts.check("account", "skipped", facts.assoc_error)
    accounts = sorted({r.account for r in rows})
    if account in accounts:
        return facts.check("account", "ok", f"{account}: one of your associations (sacctmgr)")
    detail = f"{account!r} is not one of your accounts (sacctmgr: {', '.join(accounts)})"
    detail += _did_you_mean(account, accounts)
    if not facts.enforced():
        return facts.check("account", "skipped", f"{detail}, but this cluster does not enforce associations")
    return facts.check("account", "problem", detail, field)


def _qos_check(facts: ClusterFacts, res: Resources) -> Check:
    if not res.qos:
        return facts.check("qos", "skipped", "not set: jobs use the association's default QOS")
    rows = facts.associations()
    if rows is None:
        return facts.check("qos", "skipped", facts.assoc_error)
    mine = [r for r in rows if not res.account or r.account == res.account]
    allowed = sorted({q for r in mine for q in r.qos})
    if res.qos in allowed:
        return facts.check("qos", "ok", f"{res.qos}: allowed by your association (sacctmgr)")
    detail = f"QOS {res.qos!r} is not allowed by your association (sacctmgr: {', '.join(allowed) or 'none'})"
    detail += _did_you_mean(res.qos, allowed)
    if not facts.enforced():
        return facts.check("qos", "skipped", f"{detail}, but this cluster does not enforce associations")
    return facts.check("qos", "problem", detail, "submission.qos")


def _python_env_check(facts: ClusterFacts, profile: ClusterProfile, run: RunFile | None) -> Check:
    field = "profile.python_env"
    problem = runtime_problem(profile.python_env)  # before anything in it runs
    if problem is not None:
        return facts.check("python_env", "problem", problem, field)
    runtime = runtime_command(profile.python_env)
    try:
        hidden = secret_names(run, facts.env, settings_dir(facts.env))  # the shell's, without the run's keys
        env = script_environment(facts.env, hidden)
        answer = facts.host.ask(runtime, VersionsRequest(), timeout_s=VERSIONS_TIMEOUT_S, env=env).answer
    except Stopped:
        return facts.check("python_env", "problem", f"{runtime} did not answer within {VERSIONS_TIMEOUT_S} s", field)
    except OSError as exc:
        return facts.check("python_env", "problem", f"cannot run {runtime}: {exc}", field)
    except InspectAnswerError as exc:
        said = str(exc) if exc.answered else exc.stderr.strip()[-300:] or f"exit {exc.returncode}"
        older = "" if exc.answered else " (an older ddslurm-runtime than the submit host's?)"
        return facts.check("python_env", "problem", f"{runtime} does not say its versions{older}: {said}", field)
    ok, detail = judge_versions(answer, installed_versions(NODE_DISTRIBUTIONS), profile.python_env)
    return facts.check("python_env", "ok", detail) if ok else facts.check("python_env", "problem", detail, field)


def _engine_check(facts: ClusterFacts, profile: ClusterProfile, engine: Engine, used: bool | None) -> Check:
    """The engine's command or image (checked on the submit host: the nodes must have it at the same path):
    ``vllm_executable``/``vllm_image`` or ``sglang_executable``/``sglang_image``. ``used``: whether the run's
    deployments use ``engine`` (None: no run file; vLLM is then checked as the usual engine, SGLang only when the
    profile sets its fields)."""
    set_in_file = facts.profile_fields()
    exe, image = (
        (profile.vllm_executable, profile.vllm_image)
        if engine == "vllm"
        else (profile.sglang_executable, profile.sglang_image)
    )
    exe_field, image_field = f"{engine}_executable", f"{engine}_image"
    if used is False:
        return facts.check(engine, "skipped", f"no deployment of the run uses {engine}")
    if used is None and engine == "sglang" and exe_field not in set_in_file and image_field not in set_in_file:
        return facts.check(
            engine, "skipped", "sglang_executable and sglang_image not set (deployments with engine: sglang need one)"
        )
    if profile.container_runtime != "none":
        field = f"profile.{image_field if image else 'container_runtime'}"
        if not image:
            detail = f"container_runtime {profile.container_runtime} needs {image_field}, which is not set"
            return facts.check(engine, "problem", detail, field)
        if not _IMAGE_FILE.search(image):
            return facts.check(engine, "skipped", f"{image}: an image of a registry, not checked on the submit host")
        path = Path(image) if Path(image).is_absolute() else facts.profile_path.resolve().parent / image
        if not path.is_file():
            return facts.check(engine, "problem", f"image {path} does not exist (checked on the submit host)", field)
        return facts.check(engine, "ok", f"image {path} exists (checked on the submit host)")
    field = f"profile.{exe_field}"
    if "/" in exe:
        found = exe if Path(exe).is_file() and os.access(exe, os.X_OK) else None
    else:
        found = shutil.which(exe, path=facts.env.get("PATH", os.defpath))
    if found is not None:
        return facts.check(engine, "ok", f"{exe_field} {found} (checked on the submit host)")
    where = "does not exist or is not executable" if "/" in exe else "is not on PATH"
    detail = f"{exe} {where} on the submit host (the nodes run it at the same path)"
    if used is None and exe_field not in set_in_file:
        return facts.check(engine, "skipped", f"{exe_field} not set and {detail}; runs with deployments need it")
    return facts.check(engine, "problem", detail, field)


def _workspace_check(facts: ClusterFacts, profile: ClusterProfile) -> Check:
    """The workspace (and its ``runs/``) is the user's alone: another user who can write in it, sticky bit or not,
    could plant the files ddslurm reads there (its facts, their lock) or replace runs."""
    workspace = Path(profile.workspace)
    try:
        check_workspace(workspace)
    except UnsafePathError as exc:
        return facts.check("workspace", "problem", str(exc), "profile.workspace")
    if not workspace.exists():
        return facts.check("workspace", "ok", f"{workspace} does not exist yet (submit makes it, 0700)")
    return facts.check("workspace", "ok", f"{workspace}: no other user can write in it")


def profile_checks(facts: ClusterFacts, profile: ClusterProfile, run: RunFile | None = None) -> list[Check]:
    """Every check the profile alone allows; with ``run``, only the engines its deployments use."""
    engines = None if run is None else {d.engine for d in run.deployments}
    return [
        _partition_check(facts, "profile.partition", profile.partition),
        _partition_check(facts, "profile.cpu_partition", profile.cpu_partition),
        *_gpu_checks(facts, profile),
        _account_check(facts, profile.account, "profile.account"),
        _workspace_check(facts, profile),
        _python_env_check(facts, profile, run),
        _engine_check(facts, profile, "vllm", None if engines is None else "vllm" in engines),
        _engine_check(facts, profile, "sglang", None if engines is None else "sglang" in engines),
    ]


def _named_by(res: Resources, fields: Sequence[tuple[str, str | None]]) -> str:
    """The field that gave the job its partition (the first of ``fields`` whose value it is)."""
    return next((field for field, value in fields if value and value == res.partition), "")


def _fit_check(
    facts: ClusterFacts, name: str, res: Resources, partition_field: str, cpus_field: str, memory_field: str
) -> Check:
    cluster = facts.cluster()
    if cluster is None:
        return facts.check(name, "skipped", facts.cluster_error)
    part = res.partition or next((p.name for p in cluster.partitions if p.default), "")
    if cluster.partition(part) is None:
        if partition_field.startswith("profile.") or not res.partition:
            return facts.check(name, "skipped", f"partition {part!r} not known (above)")
        known = [p.name for p in cluster.partitions]
        detail = f"partition {part!r} does not exist (sinfo shows {', '.join(known)}){_did_you_mean(part, known)}"
        return facts.check(name, "problem", detail, partition_field)
    gpus = res.gpus or (int(res.gres.split(":")[-1]) if res.gres.startswith("gpu:") else 0)
    memory = parse_memory_mb(res.memory) if res.memory else 0
    asked = f"{res.cpus_per_task} CPUs" + (f", {memory} MB" if memory else "") + (f", {gpus} GPUs" if gpus else "")
    if cluster.fitting(part, cpus=res.cpus_per_task, memory_mb=memory, gpus=gpus):
        return facts.check(name, "ok", f"{asked}: fits on a node of partition {part}")
    nodes = cluster.fitting(part)
    field = memory_field if cluster.fitting(part, cpus=res.cpus_per_task) else cpus_field
    detail = f"the job asks for {asked} on one node; no node of partition {part} has them (largest: {_largest(nodes)})"
    return facts.check(name, "problem", detail, field)


def _nodes_check(facts: ClusterFacts, res: Resources, profile: ClusterProfile) -> Check:
    """A job of several nodes (a replica that spans nodes) needs as many nodes of its partition with
    ``gpus_per_node`` GPUs each; Slurm would keep a job asking for more pending for ever."""
    name = "generation nodes"
    cluster = facts.cluster()
    if cluster is None:
        return facts.check(name, "skipped", facts.cluster_error)
    part = res.partition or next((p.name for p in cluster.partitions if p.default), "")
    if cluster.partition(part) is None:
        return facts.check(name, "skipped", f"partition {part!r} not known (above)")
    per_node = profile.gpus_per_node
    have = len({n.node for n in cluster.fitting(part, gpus=per_node)})
    if have >= res.nodes:
        return facts.check(name, "ok", f"{res.nodes} nodes of {per_node} GPUs: partition {part} has {have}")
    detail = (
        f"one replica spans {res.nodes} nodes of {per_node} GPUs, but partition {part} has {have} node(s) with "
        f"{per_node} GPUs or more (sinfo); use a smaller replica (tensor_parallel x pipeline_parallel x "
        f"data_parallel at most {have * per_node} GPUs) or a partition with more such nodes"
    )
    return facts.check(name, "problem", detail, "deployments")


def job_checks(facts: ClusterFacts, run: RunFile, profile: ClusterProfile, plan: Plan, script: str) -> list[Check]:
    """Every job of the plan fits on a node of its partition, its QOS, then (when nothing else is wrong and sinfo
    answered) ``sbatch --test-only`` of the first array's batch script (``script``)."""
    sub, col = run.submission, run.collection
    gen_memory = "submission.memory" if sub.memory else "profile.memory_per_gpu"
    profile_parts = [("profile.partition", profile.partition), ("profile.cpu_partition", profile.cpu_partition)]
    gen_partition = _named_by(plan.generation, [("submission.partition", sub.partition), *profile_parts])
    col_partition = _named_by(plan.collection, [("collection.partition", col.partition), *profile_parts[::-1]])
    checks = [
        _fit_check(facts, "generation job", plan.generation, gen_partition, "submission.cpus", gen_memory),
        _fit_check(facts, "collection job", plan.collection, col_partition, "collection.cpus", "collection.memory"),
    ]
    if plan.cpu_stage is not None:
        cpu_partition = _named_by(plan.cpu_stage, profile_parts[::-1])
        checks.append(
            _fit_check(facts, "cpu-stage job", plan.cpu_stage, cpu_partition, "submission.cpus", "submission.memory")
        )
    if plan.generation.nodes > 1:
        checks.append(_nodes_check(facts, plan.generation, profile))
    checks += _engine_version_checks(facts, run, plan)
    checks.append(_qos_check(facts, plan.generation))
    checks.append(_test_only_check(facts, plan, script, clean=not any(c.status == "problem" for c in checks)))
    return checks


def _engine_version_checks(facts: ClusterFacts, run: RunFile, plan: Plan) -> list[Check]:
    """Each engine the run's servers use, asked its version on the submit host (``vllm --version``, SGLang's
    ``__version__``; the nodes run the same path), and every flag of their command lines checked against it
    (:func:`ddslurm.runtime.check_serving`): a problem names each flag and the version it needs. An image, or a
    version that cannot be read, is not judged here (the server step asks the nodes' engine again)."""
    serving = plan.serving
    if serving is None:
        return []
    hidden = secret_names(run, facts.env, settings_dir(facts.env))
    env = script_environment(facts.env, hidden)
    checks: list[Check] = []
    for engine in dict.fromkeys(d.engine for d in serving.deployments):
        name, field = f"{engine} version", f"profile.{engine}_executable"
        exe = serving.sglang_executable if engine == "sglang" else serving.vllm_executable
        if serving.container_runtime != "none":
            why = f"the {serving.container_runtime} image's engine is asked on the node, before its servers start"
            checks.append(facts.check(name, "skipped", why))
            continue
        if ("/" in exe and not Path(exe).is_file()) or (
            "/" not in exe and shutil.which(exe, path=facts.env.get("PATH", os.defpath)) is None
        ):
            checks.append(facts.check(name, "skipped", f"{exe} is not on the submit host (above)"))
            continue
        (check,) = check_serving(serving, {engine: engine_version(serving, engine, env)})
        if check.refusals:
            checks.append(facts.check(name, "problem", refusal_text(check, exe), field))
        elif check.note:
            checks.append(facts.check(name, "skipped", f"{check.note}; the server step checks it again on the node"))
        else:
            flags = ", ".join(check.checked) or "none newer than the oldest release"
            checks.append(
                facts.check(name, "ok", f"{exe}: {check.version}, which has every flag the run's servers use ({flags})")
            )
    return checks


def _test_only_check(facts: ClusterFacts, plan: Plan, script: str, *, clean: bool) -> Check:
    name = "sbatch --test-only"
    if facts.cluster() is None:
        return facts.check(name, "skipped", facts.cluster_error)
    if not clean:
        return facts.check(name, "skipped", "the jobs do not fit (above)")
    with tempfile.TemporaryDirectory(prefix="ddslurm-test-only-") as tmp:
        path = Path(tmp) / "first-array.sbatch"
        path.write_text(script)
        try:
            said = facts.slurm.sbatch_test(str(path), export=(*plan.secret_env, *plan.server_secret_env), env=facts.env)
        except SlurmError as exc:
            if "unrecognized option" in exc.stderr or "invalid option" in exc.stderr:
                return facts.check(name, "skipped", f"this sbatch has no --test-only ({exc.stderr})")
            return facts.check(name, "problem", f"Slurm refuses the first array: {exc.stderr or exc}")
    return facts.check(name, "ok", said.removeprefix("sbatch: ") or "Slurm would accept the first array")


@dataclass(frozen=True, slots=True)
class ProfileChecked:
    """What :func:`check_profile_first` read, for :func:`check_jobs`: the scheduler's answers and the two files."""

    facts: ClusterFacts
    run: RunFile
    profile: ClusterProfile


def check_profile_first(
    inputs: SubmitInputs, slurm: Slurm, env: Mapping[str, str], host: EngineHost = RUNTIME_PROCESS
) -> ProfileChecked:
    """``submit``'s checks of the profile before its inputs are prepared (a builder script run, Data Designer's
    check), on the run file and profile as ``submit`` read them: refused with every problem at once. Returns what
    was read (for :func:`check_jobs`)."""
    facts = ClusterFacts(slurm, env, inputs.run_path, inputs.profile_path, host, inputs.profile_text)
    refuse_problems(profile_checks(facts, inputs.profile, inputs.run))
    return ProfileChecked(facts, inputs.run, inputs.profile)


def check_jobs(checked: ProfileChecked, plan: Plan, script: str) -> None:
    """``submit``'s checks of the compiled jobs (they fit on their partitions' nodes, the QOS, ``sbatch
    --test-only`` of the first array ``script``), refused with every problem at once."""
    problems = job_checks(checked.facts, checked.run, checked.profile, plan, script)
    refuse_problems(problems, "the run's jobs do not fit this cluster")
