"""What the end-to-end tests share: the ``ddslurm`` CLI run as a user runs it (a subprocess of this environment's
entry point), waiting, bounded, for what a run does next, a run's records and Slurm arrays, a run whose jobs Slurm
holds and an ``sbatch`` that fails on cue, the node's processes and a script run as another, unprivileged user of
the node, the mixed example's local generator served by the vLLM stand-in, and a ``python_env`` of another Data
Designer version holding this checkout's ddslurm."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ddslurm.config import AttemptRecord, SubmissionRecord, read_json

if TYPE_CHECKING:
    import pyarrow as pa

NOBODY = 65534
"""The other user of the shared-node tests (``nobody``); starting its processes needs root."""
SYSTEM_PYTHON = "/usr/bin/python3"
"""A Python another user can run (the project's environment may be unreadable to it)."""
DDSLURM = str(Path(sys.executable).parent / "ddslurm")
FAKE_VLLM = Path(sys.executable).parent / "fake-vllm"
"""The vLLM stand-in (``tools/fake-vllm``), this environment's entry point."""
REPO = Path(__file__).resolve().parents[1]
MIXED_RECIPE = REPO / "examples" / "mixed" / "recipe.yaml"
"""The mixed example: a local generator (``generator``, served as ``qwen3-8b``) and a hosted judge."""
_DD_BOUNDS = dict(re.findall(r"^(DD_OLDEST|DD_NEWEST)\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), re.MULTILINE))
NODE_DD = os.environ.get("DDSLURM_NODE_DD") or _DD_BOUNDS["DD_NEWEST"]
"""The Data Designer of the other version's ``python_env`` (:func:`dd_python_env`): the newest the runtime supports
(the Makefile's ``DD_NEWEST``), or ``DDSLURM_NODE_DD`` where set (``make test-dd-range`` sets the oldest)."""
DDSLURM_PACKAGES = ("config", "providers", "planner", "collector", "runtime", "launcher")
"""Every ddslurm package of the workspace (``packages/<name>``)."""


def one_ca_bundle(folder: Path) -> Path:
    """``folder/ca.pem``: a CA bundle of one certificate (certifi's first), the ``SSL_CERT_FILE`` of the suite's
    runs and oracles. No test speaks TLS, yet each model of a Data Designer run makes up to 16 httpx transports,
    each loading its CA bundle into an SSL context of its own: about 20 ms with certifi's 117 certificates, under
    1 ms with one, so a client step of the examples' two models spends about 0.7 CPU-seconds less (docs/testing.md)."""
    path = folder / "ca.pem"
    path.write_text(_first_certificate())
    return path


@functools.cache
def _first_certificate() -> str:
    """The first certificate of certifi's bundle, as PEM (read once per process)."""
    import certifi

    bundle = Path(certifi.where()).read_text()
    end = "-----END CERTIFICATE-----\n"
    return bundle[bundle.index("-----BEGIN CERTIFICATE-----") : bundle.index(end) + len(end)]


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 600, umask: int | None = None, outputs: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ddslurm ARGS`` with ``env`` (and ``umask``, else this process's), its output captured (and appended to
    ``outputs``, standard output then standard error, for a test that scans all it printed)."""
    done = subprocess.run(
        [DDSLURM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False,
        umask=-1 if umask is None else umask,
    )  # fmt: skip
    if outputs is not None:
        outputs.extend((done.stdout, done.stderr))
    return done


def cli_json(
    *args: str,
    env: dict[str, str],
    timeout: float = 600,
    umask: int | None = None,
    codes: tuple[int, ...] = (0,),
    outputs: list[str] | None = None,
) -> Any:
    """``ddslurm ARGS`` that must exit with one of ``codes``; its standard output decoded as JSON."""
    done = run_cli(*args, env=env, timeout=timeout, umask=umask, outputs=outputs)
    assert done.returncode in codes, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    show: Callable[[], Any] | None = None,
    *,
    interval: float = 0.2,
    fail: bool = True,
) -> Any:
    """The first true value of ``predicate()`` within ``timeout`` seconds; the test fails naming ``what`` (and
    ``show()``, the last state seen) otherwise, or, with ``fail`` false, the wait returns None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    if not fail:
        return None
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; last seen: {show()}" if show else ""))


def slurm(*argv: str, check: bool = False) -> str:
    """What the Slurm command ``argv`` prints (``check``: it must succeed)."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=check).stdout


def attempts(run_dir: Path, shard: int | None = None) -> list[AttemptRecord]:
    """The attempt records of the run (of ``shard`` only, unless None), oldest first; one that cannot be read (being
    written) is left out."""
    pattern = "shard-*" if shard is None else f"shard-{shard:05d}"
    records = []
    for path in run_dir.glob(f"shards/{pattern}/attempts/*/attempt.json"):
        try:
            records.append(read_json(path, AttemptRecord))
        except Exception:
            continue
    return sorted(records, key=lambda r: r.started_at)


def submissions(run_dir: Path) -> list[SubmissionRecord]:
    """The records of every submission of the run (one a Slurm array), oldest first."""
    records = (read_json(p, SubmissionRecord) for p in run_dir.glob("submissions/*.json"))
    return sorted(records, key=lambda r: int(r.array_job_id))


def array_jobs(run_dir: Path) -> list[str]:
    """The Slurm array job ids of every submission of the run, oldest first."""
    return [r.array_job_id for r in submissions(run_dir)]


HELD_RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  model_configs:
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 2}}
"""


def held_run(root: Path, *, shards: int, extra: str = "") -> tuple[Path, Path, dict[str, str]]:
    """A run of ``shards`` shards (``extra``: more of its run file) whose jobs are held an hour (``--begin``: nothing
    runs), its profile and its environment (its provider's key in ``HELD_KEY``)."""
    root.mkdir(parents=True, exist_ok=True)
    home = root / "dd"
    home.mkdir()
    (home / "model_providers.yaml").write_text(
        "providers:\n- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HELD_KEY}\n"
    )
    (root / "recipe.yaml").write_text(HELD_RECIPE)
    run = root / "run.yaml"
    run.write_text(
        f"name: held-{secrets.token_hex(3)}\nrecipe: recipe.yaml\nnum_records: {shards}\nshards: {shards}\n"
        "submission:\n  time_limit: '00:10:00'\n  cpus: 1\n  memory: 100M\n  extra_sbatch: ['--begin=now+1hour']\n"
        f"{extra}"
    )
    profile = root / "profile.yaml"
    profile.write_text(
        f"workspace: {root / 'work'}\npython_env: {REPO / '.venv'}\npartition: gpu\ncpu_partition: cpu\n"
    )
    env = {**os.environ, "DATA_DESIGNER_HOME": str(home), "HELD_KEY": "sk-held-e2e-" + "5" * 16}
    env.pop("DDSLURM_SLURM_TIMEOUT", None)
    return run, profile, env


def sbatch_wrapper(folder: Path, call: int, instead: str) -> str:
    """A directory (for the front of ``PATH``) holding an ``sbatch`` that runs the real one, except on its
    ``call``-th call that submits (``sbatch --test-only``, the profile's check, is not counted): the shell commands
    ``instead``."""
    real = shutil.which("sbatch")
    assert real is not None
    bin_dir = folder / "wrapped-bin"
    bin_dir.mkdir()
    count = folder / "sbatch-calls"
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\n"
        f'case " $* " in *" --test-only "*) exec {real} "$@";; esac\n'  # the profile's check submits nothing
        f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
        f'if [ "$n" = {call} ]; then\n{instead}\nfi\n'
        f'exec {real} "$@"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    return str(bin_dir)


def processes() -> list[tuple[int, list[str]]]:
    """Every process of the node: its pid and its command line (one that ended while it was read is left out)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        found.append((int(cmdline.parent.name), argv))
    return found


def as_nobody(script: str, *args: str, timeout: float = 60) -> str:
    """What the Python ``script`` (with ``args``) prints when :data:`NOBODY` runs it, from ``/``."""
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", script, *args], user=NOBODY, group=NOBODY, cwd="/", capture_output=True, text=True,
        timeout=timeout, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def generator(
    *,
    model: str = "Qwen/Qwen3-8B",
    replicas: int | None = None,
    tensor_parallel: int | None = None,
    startup_timeout: int = 120,
    env: Mapping[str, str] | str = "",
    extra_args: Sequence[str] = (),
    restarts: int | None = None,
) -> str:
    """The run file's ``deployments:`` for the mixed example's ``generator``: ``model`` served as ``qwen3-8b``
    (``replicas`` and ``tensor_parallel``: the run file's default where None) on one CPU; ``env``: the server's
    environment (the stand-in's ``FAKE_VLLM_*`` settings), a mapping or a YAML flow mapping as written;
    ``extra_args``: the server's ``extra_args`` (``--max-num-seqs 1``: a replica that runs one request at once);
    ``restarts``: ``server.restarts`` (None: the run file's default)."""
    lines = ["deployments:", "  - model_alias: generator", f"    model: {model}", "    served_model_name: qwen3-8b"]
    lines += [f"    {key}: {value}" for key, value in (("replicas", replicas), ("tensor_parallel", tensor_parallel))
              if value is not None]  # fmt: skip
    lines += ["    server:", "      cpus: 1", f"      startup_timeout: {startup_timeout}"]
    if not isinstance(env, str):
        env = "{" + ", ".join(f"{key}: '{value}'" for key, value in env.items()) + "}"
    if env:
        lines.append(f"      env: {env}")
    if extra_args:
        lines.append(f"      extra_args: {json.dumps(list(extra_args))}")
    if restarts is not None:
        lines.append(f"      restarts: {restarts}")
    return "\n".join(lines) + "\n"


def vllm_stand_in(folder: Path, name: str = "", *, record_env: bool = False, record_args: bool = False) -> Path:
    """``vllm`` for a profile's ``vllm_executable``: a script in ``folder`` (``vllm``, or ``vllm-<name>``) that
    becomes :data:`FAKE_VLLM`, each server process keeping its own request log,
    ``folder/[<name>-]requests-<job>-<pid>.jsonl`` (``<job>``: the Slurm job it serves, ``none`` outside one);
    with ``record_env``, a server step first writes its environment (its GPUs, its token) to
    ``folder/server-env-<pid>.txt``; with ``record_args``, its arguments (which replica it is, ``--uds
    .../<alias>-<i>.sock``, and its ``--tensor-parallel-size``), one a line, to
    ``folder/[<name>-]args-<job>-<pid>.txt``."""
    script = folder / (f"vllm-{name}" if name else "vllm")
    log = folder / (f"{name}-requests" if name else "requests")
    record = f'[ "$1" = serve ] && env > "{folder}/server-env-$$.txt"\n' if record_env else ""
    args = folder / (f"{name}-args" if name else "args")
    record += (
        f"""[ "$1" = serve ] && printf '%s\\n' "$@" > "{args}-${{SLURM_JOB_ID:-none}}-$$.txt"\n"""
        if record_args
        else ""
    )
    requests = f'FAKE_VLLM_REQUEST_LOG="{log}-${{SLURM_JOB_ID:-none}}-$$.jsonl"'
    script.write_text(f'#!/bin/sh\n{record}{requests} exec "{FAKE_VLLM}" "$@"\n')
    script.chmod(0o755)
    return script


def one_draw_recipe(tmp_path: Path) -> Path:
    """The mixed example with one value for its ``difficulty`` sampler: the draws, and with them every prompt and
    (the stand-ins reply as a function of the prompt) every generated value, are the same in every run."""
    import yaml

    folder = tmp_path / "recipe"
    folder.mkdir()
    recipe = yaml.safe_load(MIXED_RECIPE.read_text())
    for column in recipe["data_designer"]["columns"]:
        if column["name"] == "difficulty":
            column["params"]["values"] = ["with a join"]
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    for data in MIXED_RECIPE.parent.glob("*.csv"):
        (folder / data.name).write_bytes(data.read_bytes())
    return folder / "recipe.yaml"


def requests_waiting(root_url: str) -> int:
    """Chat requests a stand-in holds (at its gate) or queues: its ``vllm:num_requests_waiting`` gauge, read as the
    proxy reads its replicas' (``root_url``: the server's address without ``/v1``)."""
    import httpx

    from ddslurm.runtime._upstreams import parse_waiting

    return parse_waiting(httpx.get(f"{root_url}/metrics", timeout=10).text)


LOCAL_CREATE = """
import json, os, sys
os.environ["NEMO_TELEMETRY_ENABLED"] = "false"
from ddslurm.runtime._engine import preload_engine
preload_engine()  # as the client step imports it (frozen)
import data_designer.config as dd
from data_designer.interface import DataDesigner
job = json.loads(sys.argv[1])
provider = dd.ModelProvider(name="oracle", endpoint=job["endpoint"], provider_type="openai", api_key="ORACLE_KEY")
designer = DataDesigner(artifact_path=job["out"], model_providers=[provider])
result = designer.create(dd.DataDesignerConfigBuilder.from_config(job["recipe"]), num_records=job["records"])
print(json.dumps(str(result.artifact_storage.base_dataset_path)))
"""


def local_dataset(recipe: Path, records: int, folder: Path) -> pa.Table:
    """The dataset of a plain local ``DataDesigner.create`` of ``recipe`` (a YAML file beside its seed data) with
    ``records`` records, as Data Designer wrote it (its Parquet files), in a process of its own (in ``folder``),
    every model of the recipe served by one vLLM stand-in whose replies each take 0.1 s: the oracle of a collected
    dataset's rows (the stand-in's replies are a function of the request) and of its column order (Data Designer
    writes columns in the order their cells finish: docs/collection.md#column-order)."""
    import pyarrow.parquet as pq
    import yaml

    from fake_vllm.testing import start_server

    folder.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(recipe.read_text())
    models = config["data_designer"]["model_configs"]
    for model in models:
        model["provider"] = "oracle"
    for data in recipe.parent.iterdir():
        if data.is_file() and data.suffix in {".csv", ".jsonl", ".parquet", ".json"}:
            shutil.copyfile(data, folder / data.name)
    served = ["--served-model-name", *sorted({m["model"] for m in models}), "--fake-latency", "0.1"]
    env = {"PATH": os.environ["PATH"], "HOME": str(folder), "ORACLE_KEY": "oracle-key-of-the-stand-in"}
    env.update(DATA_DESIGNER_HOME=str(folder / "dd-home"), SSL_CERT_FILE=str(one_ca_bundle(folder)))
    with start_server("oracle", args=served, api_key=env["ORACLE_KEY"], log_path=folder / "stand-in.log") as server:
        job = {"endpoint": server.base_url, "recipe": config, "records": records, "out": str(folder / "out")}
        done = subprocess.run(
            [sys.executable, "-c", LOCAL_CREATE, json.dumps(job)],
            capture_output=True, text=True, env=env, cwd=folder, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    dataset = Path(json.loads(done.stdout.strip().splitlines()[-1]))
    return pq.read_table(dataset / "parquet-files")


def dd_python_env(tmp_path_factory: pytest.TempPathFactory, version: str) -> Path:
    """A new ``python_env`` of Data Designer ``version`` and every ddslurm package of this checkout (editable), as a
    user installs them (``uv pip install``; about 3 s from uv's cache), with this environment's interpreter: a node's
    environment, and a submit host's too (its ``bin/ddslurm``). ``typer<0.29``: as the workspace constrains it (Data
    Designer's CLI, tests/test_dd_cli.py)."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the Data Designer environment"
    env = tmp_path_factory.mktemp(f"dd-{version}") / "venv"
    python = REPO / ".venv" / "bin" / "python"
    subprocess.run([uv, "venv", "-q", "-p", str(python), str(env)], check=True, timeout=120)
    editable = [arg for name in DDSLURM_PACKAGES for arg in ("-e", str(REPO / "packages" / name))]
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"), *editable,
         f"data-designer=={version}", "typer<0.29"],
        check=True, timeout=600,
    )  # fmt: skip
    return env


def resumable_rows(run_dir: Path, shard: int) -> int:
    """The most rows an attempt of ``shard`` has on disk that a later attempt can continue: its progress (the rows
    of the batches written) once its dataset has Data Designer's ``metadata.json``. Data Designer calls the batch
    callback (which writes ``progress.json``) before it writes ``metadata.json`` after the first batch, and resumes
    nothing without it: a kill between the two leaves rows no attempt continues. The event a test kills a client on
    when the next attempt must resume."""
    best = 0
    for attempt in (run_dir / "shards" / f"shard-{shard:05d}" / "attempts").glob("*"):
        if not any(attempt.glob("output/shard-*/metadata.json")):
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            best = max(best, int(json.loads((attempt / "progress.json").read_text())["rows"]))
    return best


def shard_client(run_dir: Path, shard: int) -> int | None:
    """The pid of the client step of the run's shard ``shard`` (its array task), if one runs now."""
    from tools.chaos import cluster

    for proc in cluster.run_processes(run_dir, [], set()):
        environ = Path(f"/proc/{proc.pid}/environ")
        with contextlib.suppress(OSError):
            if proc.kind == "client" and f"SLURM_ARRAY_TASK_ID={shard}\0".encode() in environ.read_bytes():
                return proc.pid
    return None


@functools.cache
def local_slurm_tool() -> Any:
    """``tools/local-slurm`` (a script without a suffix) loaded once as a module, for its pure functions: what it
    calls a node that is up (``node_ok``) is what the tests call so."""
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("local_slurm_tool", str(REPO / "tools" / "local-slurm"))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    sys.modules[loader.name] = module  # its dataclasses look their module up while it runs
    loader.exec_module(module)
    return module
