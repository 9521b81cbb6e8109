"""Root conftest: fixtures shared by every test in the workspace."""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import NODE_DD, dd_python_env, one_ca_bundle

REPO_ROOT = Path(__file__).resolve().parent


# --- local Slurm cluster ---
# Tests marked `@pytest.mark.slurm` get the session fixture `slurm_cluster` automatically. It runs
# `tools/local-slurm start` once per test process under an fcntl lock, so with pytest-xdist the first worker
# starts the cluster and the others wait, then find it running (start is an idempotent, cheap no-op).
# DDSLURM_SKIP_SLURM=1 skips these tests; otherwise a cluster that fails to start fails them.

LOCAL_SLURM = REPO_ROOT / "tools" / "local-slurm"
LOCAL_SLURM_LOCK = Path("/tmp/ddslurm-local-slurm.lock")
LOCAL_SLURM_START_TIMEOUT_S = 900  # a fresh machine installs packages first


@dataclass(frozen=True)
class SlurmCluster:
    """Facts about the local cluster that tools/local-slurm sets up."""

    state_dir: Path
    gpu_partition: str = "gpu"  # the default partition: n1, n2
    cpu_partition: str = "cpu"  # n1, n2, n3; n3 has the lowest weight, so CPU-only jobs land there first
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    gpu_nodes: tuple[str, ...] = ("n1", "n2")
    cpu_only_nodes: tuple[str, ...] = ("n3",)
    gpus_per_node: int = 4
    cpus_per_node: int = 16
    memory_per_node_mb: int = 32000
    max_array_size: int = 1001


def _start_local_slurm() -> SlurmCluster:
    state_dir = Path(os.environ.get("DDSLURM_SLURM_STATE") or "/var/lib/ddslurm/local-slurm")
    with LOCAL_SLURM_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            proc = subprocess.run(
                [sys.executable, str(LOCAL_SLURM), "--state-dir", str(state_dir), "start"],
                capture_output=True,
                text=True,
                timeout=LOCAL_SLURM_START_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"tools/local-slurm start did not finish in {LOCAL_SLURM_START_TIMEOUT_S}s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"tools/local-slurm start failed (exit {proc.returncode}); "
            f"set DDSLURM_SKIP_SLURM=1 to skip Slurm tests\n{proc.stdout}{proc.stderr}",
            pytrace=False,
        )
    return SlurmCluster(state_dir=state_dir)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The running local Slurm cluster (started once per session; left running afterwards)."""
    if os.environ.get("DDSLURM_SKIP_SLURM") == "1":
        pytest.skip("DDSLURM_SKIP_SLURM=1: local Slurm cluster disabled")
    return _start_local_slurm()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slurm = os.environ.get("DDSLURM_SKIP_SLURM") == "1"
    for item in items:
        if item.get_closest_marker("slurm") is None:
            continue
        if skip_slurm:
            item.add_marker(pytest.mark.skip(reason="DDSLURM_SKIP_SLURM=1: local Slurm cluster disabled"))
        elif isinstance(item, pytest.Function) and "slurm_cluster" not in item.fixturenames:
            item.fixturenames.insert(0, "slurm_cluster")  # set up before the test's own fixtures


# --- isolation: no test reads or writes the real home directory ---


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DATA_DESIGNER_HOME", raising=False)
    monkeypatch.delenv("DDSLURM_PROFILE", raising=False)


# --- runs: a hosted provider (the vLLM stand-in with a key) and run files that use it ---

EXAMPLE_RECIPE = REPO_ROOT / "examples" / "hosted-only" / "recipe.yaml"
MIXED_RECIPE = REPO_ROOT / "examples" / "mixed" / "recipe.yaml"
FAKE_VLLM = REPO_ROOT / ".venv" / "bin" / "fake-vllm"  # the vLLM stand-in, started as `vllm serve ...`
HOSTED_KEY_ENV = "DEMO_HOSTED_API_KEY"


@dataclass(frozen=True)
class HostedEndpoint:
    base_url: str
    api_key: str
    request_log: Path
    root_url: str = ""
    """The stand-in itself (``/metrics``, ``/health``), where ``base_url`` is its ``/v1``."""


@dataclass(frozen=True)
class RunFiles:
    """A run file, its recipe, a DD settings dir and a cluster profile, all under one tmp directory."""

    root: Path
    run_file: Path
    profile: Path
    dd_home: Path
    workspace: Path
    env: dict[str, str]


@contextmanager
def hosted_stand_in(root: Path, *args: str) -> Iterator[HostedEndpoint]:
    """A vLLM stand-in requiring a key of its own, serving the example recipes' hosted models (its request log and
    server log in ``root``); ``args``: more of the stand-in's options (``--fake-gate``, ``--fake-outage``, ...)."""
    from fake_vllm.testing import start_server

    key = "sk-test-" + os.urandom(12).hex()
    request_log = root / "requests.jsonl"
    served = ["--served-model-name", "demo/writer-8b", "demo/judge-70b", "--fake-request-log", str(request_log)]
    with start_server("demo", args=[*served, *args], api_key=key, log_path=root / "server.log") as server:
        yield HostedEndpoint(base_url=server.base_url, api_key=key, request_log=request_log, root_url=server.root_url)


@pytest.fixture(scope="session")
def hosted_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostedEndpoint]:
    """One vLLM stand-in per test process, requiring an API key, serving the example recipe's models."""
    with hosted_stand_in(tmp_path_factory.mktemp("hosted")) as endpoint:
        yield endpoint


def write_run_files(
    root: Path,
    endpoint: HostedEndpoint,
    *,
    num_records: int = 6,
    shards: int = 2,
    buffer_size: int | None = 3,
    extra_run: str = "",
    recipe: Path = EXAMPLE_RECIPE,
    extra_profile: str = "",
    vllm_executable: Path = FAKE_VLLM,
) -> RunFiles:
    root.mkdir(parents=True, exist_ok=True)
    dd_home = root / "dd-home"
    dd_home.mkdir()
    (dd_home / "model_providers.yaml").write_text(
        "providers:\n"
        "- name: demo-hosted\n"
        f"  endpoint: {endpoint.base_url}\n"
        "  provider_type: openai\n"
        f"  api_key: {HOSTED_KEY_ENV}\n"
    )
    (root / "recipe.yaml").write_bytes(recipe.read_bytes())
    for data in recipe.parent.iterdir():  # files the recipe refers to, such as a seed dataset
        if data.is_file() and data.suffix in {".csv", ".jsonl", ".parquet", ".json"}:
            (root / data.name).write_bytes(data.read_bytes())
    run_file = root / "run.yaml"
    run_file.write_text(
        f"name: t\nrecipe: recipe.yaml\nnum_records: {num_records}\nshards: {shards}\n"
        + ("" if buffer_size is None else f"buffer_size: {buffer_size}\n")  # None: the planner chooses
        + f"submission:\n  time_limit: '00:10:00'\n  cpus: 1\n  memory: 1G\n{extra_run}"
    )
    workspace = root / "work"
    profile = root / "profile.yaml"
    profile.write_text(
        f"name: test\nworkspace: {workspace}\npython_env: {REPO_ROOT / '.venv'}\npartition: gpu\ncpu_partition: cpu\n"
        f"gpus_per_node: 4\nvllm_executable: {vllm_executable}\n{extra_profile}"
    )
    env = {**os.environ, "DATA_DESIGNER_HOME": str(dd_home), HOSTED_KEY_ENV: endpoint.api_key}
    env["SSL_CERT_FILE"] = str(one_ca_bundle(root))  # reaches the jobs' steps (tests.e2e.one_ca_bundle)
    return RunFiles(root, run_file, profile, dd_home, workspace, env)


@pytest.fixture
def run_files(tmp_path: Path, hosted_endpoint: HostedEndpoint) -> RunFiles:
    return write_run_files(tmp_path / "run", hosted_endpoint)


@pytest.fixture
def make_run_files(tmp_path: Path, hosted_endpoint: HostedEndpoint) -> Callable[..., RunFiles]:
    """``make_run_files(name, num_records=..., shards=..., buffer_size=..., extra_run=...)``."""

    def make(name: str = "run", **kwargs: Any) -> RunFiles:
        return write_run_files(tmp_path / name, hosted_endpoint, **kwargs)

    return make


def start_attempt(
    files: RunFiles,
    job_id: str,
    *,
    gpus: str = "",
    extra: tuple[str, ...] = (),
    node_env: Mapping[str, str] | None = None,
) -> tuple[Path, subprocess.Popen[str]]:
    """Submit-side preparation of ``files`` as a run, then its shard 0 as one attempt outside Slurm
    (``ddslurm-runtime generate --launcher local``): the same controller, with plain processes for steps.
    ``node_env``: values the attempt sees instead of those submit saw (a key rotated in between)."""
    from ddslurm.launcher import prepare, write_run_dir
    from ddslurm.launcher.testing import InProcessHost

    # the recipe check answered in this process (docs/testing.md: seams, not subprocesses)
    prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=InProcessHost())
    write_run_dir(prepared)
    env = {k: v for k, v in {**files.env, **(node_env or {})}.items() if not k.startswith("SLURM")}
    env["CUDA_VISIBLE_DEVICES"] = gpus
    runtime = Path(sys.executable).parent / "ddslurm-runtime"
    argv = [str(runtime), "generate", "--run-dir", str(prepared.layout.root), "--shard", "0", "--job-id", job_id]
    argv += ["--launcher", "local", "--grace", "3", *extra]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return prepared.layout.root, proc


@pytest.fixture(scope="session")
def local_attempt() -> Callable[..., tuple[Path, subprocess.Popen[str]]]:
    """``local_attempt(run_files, job_id, gpus="0", extra=(...)) -> (run_dir, process)``."""
    return start_attempt


@pytest.fixture(scope="session")
def scan_for_secret() -> Callable[[Path, str], list[Path]]:
    return scan_tree_for


def scan_tree_for(root: Path, secret: str) -> list[Path]:
    """Every file under ``root`` (binary ones too) whose bytes contain ``secret``."""
    needle = secret.encode()
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
            hits.append(path)
    return hits


@pytest.fixture(params=["workspace", NODE_DD], ids=lambda version: f"dd-{version}")
def builder_env(request: pytest.FixtureRequest) -> tuple[Path, str]:
    """The ``python_env`` of a builder run and its Data Designer version: this workspace's (its ``.venv``, the run
    files' default), or (``NODE_DD``) one holding that Data Designer and this checkout's ddslurm, built once for the
    module."""
    if request.param == "workspace":
        return REPO_ROOT / ".venv", importlib.metadata.version("data-designer")
    env: Path = request.getfixturevalue("node_dd_env")
    return env, str(request.param)


@pytest.fixture(scope="module")
def node_dd_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``python_env`` of Data Designer ``NODE_DD`` and every ddslurm package of this checkout (editable)."""
    return dd_python_env(tmp_path_factory, NODE_DD)
