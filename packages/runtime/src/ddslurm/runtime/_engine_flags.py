"""Which engine version each flag ddslurm renders needs, and the check of a rendered command line against the
version an engine says it is: one table (:data:`FLAG_VERSIONS`), read by the server step before it starts any
server (a too-old engine fails the attempt ``engine_too_old``, :class:`~ddslurm.runtime._serving.EngineTooOldError`)
and by ``ddslurm doctor`` (and ``submit``) on the submit host.

Each minimum is the first release whose source has the flag, read in the releases' source distributions on PyPI
(``vllm/engine/arg_utils.py``, ``vllm/entrypoints/openai/cli_args.py``, ``vllm/entrypoints/cli/serve.py``;
SGLang's ``python/sglang/srt/server_args.py``), with the change that brought it where it is known. An engine without
the flag exits at once with argparse's ``error: unrecognized arguments: ...`` (status 2).

Versions are read as PEP 440 (``packaging``, as ``doctor`` reads Data Designer's) from what the engines print
(``0.11.1``, ``0.10.1.1``, ``0.11.1rc2.dev12+g1234``, SGLang's ``0.4.6.post2``): a version that cannot be read
(``unknown``, an image's), or a pre-release or development build of the very release that brought a flag (it may
or may not have the change), is
never refused; the check says so instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ddslurm.config import DeploymentPlan, Engine, ServingPlan
from ddslurm.runtime._listeners import unix_url
from ddslurm.runtime._server_command import RankPlace, server_step_name, sglang_args, vllm_serve_args


@dataclass(frozen=True, slots=True)
class FlagSince:
    """``flag`` of ``engine`` is in every release from ``version`` on; ``change``: what brought it (a pull request,
    or where the release has it); ``protects``: what ddslurm uses it for."""

    engine: Engine
    flag: str
    version: str
    change: str
    protects: str


_VLLM_DP = "vllm-project/vllm#15977"
_MULTI_NODE_PP = "vllm-project/vllm#23691"
_SGLANG_SOURCE = "sglang {v}'s python/sglang/srt/server_args.py"

FLAG_VERSIONS: tuple[FlagSince, ...] = (
    FlagSince("vllm", "--uds", "0.10.1", "vllm-project/vllm#18097", "replicas on Unix-domain sockets (listen: unix)"),
    FlagSince("vllm", "--headless", "0.9.0", _VLLM_DP, "the followers of a replica that spans nodes"),
    FlagSince("vllm", "--data-parallel-size-local", "0.9.0", _VLLM_DP, "data parallel over nodes"),
    FlagSince("vllm", "--data-parallel-address", "0.9.0", _VLLM_DP, "data parallel over nodes"),
    FlagSince("vllm", "--data-parallel-rpc-port", "0.9.0", _VLLM_DP, "data parallel over nodes"),
    FlagSince("vllm", "--data-parallel-start-rank", "0.10.0", "vllm-project/vllm#21238", "data parallel over nodes"),
    FlagSince("vllm", "--nnodes", "0.11.1", _MULTI_NODE_PP, "tensor x pipeline parallel over nodes"),
    FlagSince("vllm", "--node-rank", "0.11.1", _MULTI_NODE_PP, "tensor x pipeline parallel over nodes"),
    FlagSince("vllm", "--master-addr", "0.11.1", _MULTI_NODE_PP, "tensor x pipeline parallel over nodes"),
    FlagSince("vllm", "--master-port", "0.11.1", _MULTI_NODE_PP, "tensor x pipeline parallel over nodes"),
    FlagSince("sglang", "--dist-init-addr", "0.3.3", _SGLANG_SOURCE.format(v="0.3.3"), "a replica that spans nodes"),
    FlagSince(
        "sglang",
        "--enable-metrics",
        "0.3.5.post1",
        _SGLANG_SOURCE.format(v="0.3.5.post1"),
        "the proxy's backpressure (sglang:num_queue_reqs)",
    ),
    FlagSince("sglang", "--ep-size", "0.4.0.post1", _SGLANG_SOURCE.format(v="0.4.0.post1"), "expert_parallel"),
    FlagSince("sglang", "--pp-size", "0.4.6.post2", _SGLANG_SOURCE.format(v="0.4.6.post2"), "pipeline_parallel"),
)
"""Every flag ddslurm renders that not every release of its engine has (the others, ``--host``, ``--port``,
``--served-model-name``, ``--tensor-parallel-size``, ``--tp-size``, ``--dp-size``, ``--nnodes``/``--node-rank`` of
SGLang, are in every release since 0.8.5 (vLLM) and 0.2.15 (SGLang), the oldest checked)."""

ENGINE_NAMES: Mapping[Engine, str] = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True, slots=True)
class EngineVersion:
    """A version as an engine prints it: its release numbers (trailing zeros dropped: ``0.11`` is ``0.11.0``), its
    post-release number (None: none), and whether it is a pre-release or development build of that release."""

    release: tuple[int, ...]
    post: int | None = None
    unreleased: bool = False

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """The order of released versions: release, then post-release."""
        return self.release, -1 if self.post is None else self.post

    def at_least(self, needed: EngineVersion) -> bool | None:
        """Whether this version has what came in ``needed``: None when it cannot be told (a pre-release or
        development build of ``needed``'s own release)."""
        if self.release != needed.release:
            return self.release > needed.release
        if self.unreleased and self.post is None:
            return None
        return self.key >= needed.key


def parse_version(text: str) -> EngineVersion | None:
    """The version in ``text`` (``0.11.1``, ``0.10.1.1``, ``0.11.1rc2.dev12+g1234``, ``0.4.6.post2``,
    ``v0.9.0``), read as PEP 440 (``packaging``), or None when it is none (``unknown``, ``unknown (pyxis image
    ...)``)."""
    try:
        version = Version(text.strip())
    except InvalidVersion:
        return None
    numbers = list(version.release)
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return EngineVersion(release=tuple(numbers), post=version.post, unreleased=version.is_prerelease)


@dataclass(frozen=True, slots=True)
class FlagRefusal:
    """``since.flag`` is on ``step``'s command line, and the engine's ``found`` version is older than it."""

    since: FlagSince
    found: str
    step: str

    def __str__(self) -> str:
        name = ENGINE_NAMES[self.since.engine]
        return (
            f"{self.since.flag} ({self.since.protects}) needs {name} >= {self.since.version} "
            f"({self.since.change}); the server's {name} is {self.found}"
        )


@dataclass(frozen=True, slots=True)
class FlagCheck:
    """What :func:`check_flags` found for one engine: the refusals, and the flags it could not judge (``unsure``:
    the version is unreadable, or a pre-release of the release that brought a flag), with the version read."""

    engine: Engine
    version: str
    refusals: tuple[FlagRefusal, ...] = ()
    unsure: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()
    """The flags of the table the command lines have (each once)."""

    @property
    def note(self) -> str:
        """What was not judged and why ('' when everything was)."""
        if not self.unsure:
            return ""
        name = ENGINE_NAMES[self.engine]
        flags = ", ".join(self.unsure)
        if parse_version(self.version) is None:
            return f"{name} version {self.version!r} cannot be read, so {flags} not checked against it"
        return f"{name} {self.version} is a pre-release of the version that brought {flags}: not checked"


def _flags(argv: Sequence[str]) -> list[str]:
    """The options of ``argv`` (``--flag`` or ``--flag=value``), in order, each once."""
    seen: dict[str, None] = {}
    for word in argv:
        if word.startswith("--"):
            seen.setdefault(word.partition("=")[0], None)
    return list(seen)


def check_flags(engine: Engine, version: str, argvs: Iterable[tuple[str, Sequence[str]]]) -> FlagCheck:
    """Check each ``(step, argv)`` of ``engine`` (:func:`~ddslurm.runtime._server_command.vllm_serve_args` or
    :func:`~ddslurm.runtime._server_command.sglang_args`) against the engine's ``version`` (what it printed):
    every flag of :data:`FLAG_VERSIONS` that ``version`` is older than is refused (once, at the first step that
    has it); an unreadable version refuses nothing and says so (:attr:`FlagCheck.note`)."""
    table = {s.flag: s for s in FLAG_VERSIONS if s.engine == engine}
    found = parse_version(version)
    refusals: dict[str, FlagRefusal] = {}
    unsure: dict[str, None] = {}
    checked: dict[str, None] = {}
    for step, argv in argvs:
        for flag in _flags(argv):
            since = table.get(flag)
            if since is None or flag in checked:
                continue
            checked[flag] = None
            verdict = None if found is None else found.at_least(_parsed(since.version))
            if verdict is None:
                unsure[flag] = None
            elif not verdict:
                refusals[flag] = FlagRefusal(since, version, step)
    return FlagCheck(engine, version, tuple(refusals.values()), tuple(unsure), tuple(checked))


def _parsed(version: str) -> EngineVersion:
    parsed = parse_version(version)
    if parsed is None:  # pragma: no cover - the table's own versions are plain releases
        raise ValueError(f"not a version: {version!r}")
    return parsed


def deployment_argvs(dep: DeploymentPlan) -> list[tuple[str, list[str]]]:
    """Every step's engine arguments of ``dep`` (each replica, each node rank of one that spans nodes), as the
    server step renders them, with stand-ins for what the job chooses (the socket, the leader, the ports); a step
    whose shape cannot be rendered is left out."""
    argvs: list[tuple[str, list[str]]] = []
    for rep in dep.replicas:
        listen = (
            unix_url(Path(f"/sockets/{dep.alias}-{rep.index}.sock")) if dep.listen == "unix" else "http://127.0.0.1:1"
        )
        for rank in range(rep.nodes):
            place = RankPlace(rank, rep.nodes, "leader", "1") if rep.nodes > 1 else None
            render = sglang_args if dep.engine == "sglang" else vllm_serve_args
            try:
                argvs.append((server_step_name(dep.alias, rep.index, rank), render(dep, listen, place)))
            except ValueError:  # a shape no engine can start: the server step refuses it with its own reason
                continue
    return argvs


def check_serving(serving: ServingPlan, versions: Mapping[Engine, str]) -> list[FlagCheck]:
    """:func:`check_flags` of every step the plan's deployments start, one check per engine of ``versions``."""
    checks: list[FlagCheck] = []
    for engine, version in versions.items():
        argvs = [a for d in serving.deployments if d.engine == engine for a in deployment_argvs(d)]
        checks.append(check_flags(engine, version, argvs))
    return checks


def refusal_text(check: FlagCheck, where: str) -> str:
    """One line for every refusal of ``check``: the engine at ``where`` (its executable or image) and what to
    install."""
    needed = max((r.since.version for r in check.refusals), key=lambda v: _parsed(v).key)
    name = ENGINE_NAMES[check.engine]
    flags = "; ".join(str(r) for r in check.refusals)
    return (
        f"{where} is {name} {check.version}, too old for the run's command lines ({flags}): they would exit "
        f"with 'unrecognized arguments'; install {name} >= {needed} there"
    )


def api_server_count(dep: DeploymentPlan) -> int:
    """The API-server processes vLLM starts on a replica's leader: ``--api-server-count N`` (or ``-asc``) in
    ``server.extra_args``, else, with data parallel, one per data-parallel rank (``vllm serve`` since 0.16.0 defaults
    it so, ``vllm/entrypoints/cli/serve.py``: ``data_parallel_size`` without ``--data-parallel-start-rank`` on
    the leader; 0.14.0 still started one), else one."""
    args = list(dep.extra_args)
    for i, word in enumerate(args):
        key, sep, value = word.partition("=")
        if key in ("--api-server-count", "--api_server_count", "-asc"):
            raw = value if sep else (args[i + 1] if i + 1 < len(args) else "")
            if raw.isdigit():
                return int(raw)
    return dep.data_parallel if dep.engine == "vllm" else 1


def data_parallel_cpus(dep: DeploymentPlan) -> int | None:
    """The processes a vLLM replica with data parallel keeps busy on its leader's node (:func:`api_server_count`
    API servers and one engine core per data-parallel rank there), when its step's ``server.cpus`` is below them;
    None when they fit (or the deployment has no data parallel)."""
    if dep.engine != "vllm" or dep.data_parallel <= 1 or not dep.replicas:
        return None
    rep = dep.replicas[0]
    local = dep.data_parallel // rep.nodes if rep.nodes > 1 else dep.data_parallel
    busy = api_server_count(dep) + local
    return busy if rep.cpus < busy else None
