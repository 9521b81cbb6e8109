"""What environment the jobs of a run get on the local Slurm cluster: exactly the one ddslurm builds.

With ``sbatch --export=NAME,...`` (or ``--export=NONE``) Slurm 22.05 implies ``--get-user-env``: the node runs the
user's login shell and every process of the job inherits what ``~/.profile`` and ``~/.bashrc`` set. This test
plants a variable (and a ``PATH`` entry) in the login file of the submitting user, in the home directory Slurm
really uses (the passwd entry's, not ``$HOME``, which the test suite points elsewhere), runs a mixed run and its
collection job, and reads the environment of every process of them: the batch step, the Data Designer client
step, both vLLM server steps, the proxy step and the collection job.

Each process records its own environment as it starts: the profile's ``python_env`` is a virtual environment
whose site-packages make every Python process of it write ``os.environ`` to a file (the runtime starts its client
and proxy steps with the interpreter it runs in, so they are recorded too), and ``vllm_executable`` is a shell
script that writes ``env`` before it becomes the vLLM stand-in.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import secrets
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import MIXED_RECIPE, REPO, generator
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

BIN = Path(sys.executable).parent
LOGIN_FILES_LOCK = Path("/tmp/ddslurm-login-files.lock")
GENERATOR = generator(replicas=2, tensor_parallel=2)
# Set by Slurm, bash or the batch script itself on the node; everything else must come from ddslurm's choice.
SET_ON_THE_NODE = {
    "ENVIRONMENT", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "PYTHONNOUSERSITE",
    "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
}  # fmt: skip
ALLOWED = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SLURM_CONF", "SSL_CERT_FILE", "SSL_CERT_DIR"}

ENV_DUMP = """
import json, os
def _dump():
    try:
        argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    except OSError:
        return
    words = [os.path.basename(a.decode(errors="replace")) for a in argv[1:3] if a]
    tag = "-".join(w for w in words if w.replace("-", "").isalnum()) or "python"
    with open(os.path.join({dump_dir!r}, f"{{tag}}-{{os.getpid()}}.json"), "w") as fh:
        json.dump(dict(os.environ), fh)
_dump()
"""


@contextmanager
def planted_login_variable(line: str) -> Iterator[Path]:
    """``line`` appended to the submitting user's ``~/.profile`` (the passwd home that ``su -`` logs in to) and
    removed again afterwards, whatever happens; the rest of the file is left as it is."""
    profile = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".profile"
    with LOGIN_FILES_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existed = profile.exists()
        before = profile.read_text() if existed else ""
        added = ("\n" if before and not before.endswith("\n") else "") + line + "\n"
        with profile.open("a") as fh:
            fh.write(added)
        try:
            yield profile
        finally:
            text = profile.read_text().replace(added, "", 1)
            if not existed and not text:
                profile.unlink()
            else:
                profile.write_text(text)


def _recording_python_env(root: Path, dump_dir: Path) -> Path:
    """A virtual environment that runs the workspace's code, every Python process of it writing its environment
    to ``dump_dir`` as it starts."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)}))
    workspace_site = sysconfig.get_path("purelib")
    (site / "a_ddslurm_workspace.pth").write_text(f"import site; site.addsitedir({workspace_site!r})\n")
    (site / "_ddslurm_env_dump.py").write_text(ENV_DUMP.format(dump_dir=str(dump_dir)))
    (site / "b_ddslurm_env_dump.pth").write_text("import _ddslurm_env_dump\n")
    for tool in ("ddslurm-runtime", "ddslurm-collect"):
        text = (BIN / tool).read_text().split("\n", 1)[1]
        (root / "bin" / tool).write_text(f"#!{root / 'bin' / 'python'}\n{text}")
        (root / "bin" / tool).chmod(0o755)
    return root


def _recording_vllm(path: Path, dump_dir: Path) -> Path:
    path.write_text(
        f'#!/bin/sh\n[ "$1" = serve ] && env > "{dump_dir}/server-$$.env"\nexec "{BIN / "fake-vllm"}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def _environments(dump_dir: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for f in sorted(dump_dir.iterdir()):
        if f.suffix == ".json":
            out[f.stem] = json.loads(f.read_text())
        else:
            out[f.stem] = dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line)
    return out


def _sbatch_wrap(command: str, output: Path, *, export: str, env: dict[str, str]) -> None:
    job = subprocess.run(
        ["sbatch", "--parsable", f"--export={export}", f"--output={output}", "--partition=cpu", "--wrap", command],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    deadline = time.monotonic() + 180
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} did not end"
        time.sleep(0.3)


def test_no_login_file_and_nothing_else_of_the_submitting_shell_reaches_any_step(
    make_run_files: Any, hosted_endpoint: Any, tmp_path: Path
) -> None:
    token = secrets.token_hex(6)
    planted, value, planted_dir = f"DDSLURM_PLANTED_{token.upper()}", f"login-{token}", f"/planted-{token}/bin"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dumps.chmod(0o777)
    python_env = _recording_python_env(tmp_path / "venv", dumps)
    files = make_run_files(
        "env",
        num_records=4,
        shards=1,
        buffer_size=4,
        recipe=MIXED_RECIPE,
        extra_run=GENERATOR,
        vllm_executable=_recording_vllm(tmp_path / "vllm", dumps),
    )
    files.profile.write_text(files.profile.read_text().replace(str(REPO / ".venv"), str(python_env)))
    env = {**files.env, "DDSLURM_SUBMITTER_ONLY": "from-the-submitting-shell"}

    with planted_login_variable(f"export {planted}={value}; export PATH={planted_dir}:$PATH") as login_file:
        # The plant works: a job submitted the way ddslurm used to (--export=NAME) gets it from the login shell.
        control = tmp_path / "control.out"
        _sbatch_wrap("env", control, export="DEMO_HOSTED_API_KEY", env=env)
        assert f"{planted}={value}" in control.read_text(), f"{login_file} was not read: {control.read_text()}"

        submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)
        run_dir = Path(submitted["run_dir"])
        final = _cli("wait", str(run_dir), "--json", env=env)
        attempt = next(run_dir.glob("shards/shard-*/attempts/attempt-*"))
        assert final["state"] == "succeeded", (attempt / "client.out").read_text()[-3000:]
        collected = _cli("collect", str(run_dir), "--json", env=env)
        assert collected["rows"] == 4

    envs = _environments(dumps)
    asked = {name: seen for name, seen in envs.items() if name.startswith("ddslurm-runtime-inspect-")}
    assert asked, "the submit did not ask python_env about the recipe"
    for name, seen in asked.items():  # on the submit host, in its shell's environment, without the run's keys
        assert seen.get("DDSLURM_SUBMITTER_ONLY") and hosted_endpoint.api_key not in str(seen), name
    envs = {name: seen for name, seen in envs.items() if name not in asked}  # what runs on the nodes
    kinds = {name.rsplit("-", 1)[0] for name in envs}
    assert {"ddslurm-runtime-generate", "ddslurm-runtime-client", "ddslurm-runtime-proxy", "server"} <= kinds, envs
    assert any(name.startswith("ddslurm-collect-") for name in envs), kinds
    assert sum(name.startswith("server-") for name in envs) == 2
    key = hosted_endpoint.api_key
    for name, seen in envs.items():
        text = "\n".join(f"{k}={v}" for k, v in seen.items())
        assert planted not in text and value not in text, f"{name} carries the login file's variable"
        assert planted_dir not in seen.get("PATH", ""), f"{name}: PATH from the login file: {seen.get('PATH')}"
        assert "DDSLURM_SUBMITTER_ONLY" not in seen, f"{name} carries the submitting shell's environment"
        assert "SLURM_GET_USER_ENV" not in seen and "HOME" not in seen and "USER" not in seen, name
        assert seen.get("PATH") == env["PATH"], name
        assert seen.get("SSL_CERT_FILE") == env["SSL_CERT_FILE"], f"{name}: not the CA bundle the submitter trusts"
        holds_key = name.startswith(("ddslurm-runtime-generate", "ddslurm-runtime-client"))
        assert (seen.get("DEMO_HOSTED_API_KEY") == key) is holds_key, f"{name}: the key where it does not belong"
        assert holds_key or key not in text, name
    batch = next(seen for name, seen in envs.items() if name.startswith("ddslurm-runtime-generate"))
    chosen = ALLOWED | {"DEMO_HOSTED_API_KEY"} | SET_ON_THE_NODE
    assert sorted(n for n in batch if n not in chosen and not n.startswith("SLURM")) == []
