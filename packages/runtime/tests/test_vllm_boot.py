"""vLLM started with its key in its arguments, never in its environment (``ddslurm.runtime._vllm_boot``): the
``vllm`` script runs as ``__main__`` in its own Python with ``--api-key=TOKEN`` appended inside the process, its
children never see ``VLLM_API_KEY`` (so a vLLM before vllm-project/vllm#52523 does not hash it into its compile
cache), ``ps`` never shows it; a ``vllm`` that is no Python script is started as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ddslurm.runtime._vllm_boot import VLLM_BOOT, script_python

TOKEN = "-tok-secret-" + "z" * 30  # token_urlsafe may start with "-": one item, --api-key=TOKEN
FAKE_VLLM = """
import json, os, subprocess, sys
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('VLLM_API_KEY'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"name": __name__, "argv": sys.argv, "python": sys.executable, "child_key": child,
                  "env_key": os.environ.get("VLLM_API_KEY"),
                  "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0")}))
"""


def _script(folder: Path, shebang: str, body: str = FAKE_VLLM) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "vllm"
    script.write_text(f"#!{shebang}\n{body}")
    script.chmod(0o755)
    return script


def _boot(python: str, script: Path, env_key: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env.update({"PATH": f"{script.parent}:{env.get('PATH', '')}", **({"VLLM_API_KEY": env_key} if env_key else {})})
    argv = [python, "-c", VLLM_BOOT, "vllm", "serve", "M", "--port", "8100"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_key_moves_from_the_environment_into_the_arguments(tmp_path: Path) -> None:
    script = _script(tmp_path / "bin", sys.executable)
    assert script_python(str(script), {}) == sys.executable
    out = _boot(sys.executable, script)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["name"] == "__main__" and seen["argv"] == [str(script), "serve", "M", "--port", "8100",
                                                          f"--api-key={TOKEN}"]  # fmt: skip
    assert seen["env_key"] is None and seen["child_key"] == "None"  # vLLM's engine and workers never see it
    assert not any(TOKEN in word for word in seen["cmdline"])


def test_in_another_python_the_program_moves_into_the_scripts_own(tmp_path: Path) -> None:
    """A container's ``python3`` is not always the Python its ``vllm`` script runs in (a venv in the image)."""
    other = tmp_path / "other" / "python3"
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    script = _script(tmp_path / "bin", sys.executable)
    out = _boot(str(other), script)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["python"] == sys.executable and seen["argv"][-1] == f"--api-key={TOKEN}"
    assert seen["env_key"] is None and not any(TOKEN in word for word in seen["cmdline"])


def test_a_vllm_that_is_no_python_script_starts_as_before(tmp_path: Path) -> None:
    record = tmp_path / "seen.txt"
    script = _script(tmp_path / "bin", "/bin/sh", f'printf "%s|" "$@" "$VLLM_API_KEY" > "{record}"\n')
    assert script_python(str(script), {}) is None
    out = _boot(sys.executable, script)
    assert out.returncode == 0, out.stderr
    assert record.read_text() == f"serve|M|--port|8100|{TOKEN}|"  # no --api-key: the key in its environment
    assert script_python("no-such-vllm", {"PATH": str(tmp_path)}) is None


def test_without_the_key_vllm_never_starts(tmp_path: Path) -> None:
    out = _boot(sys.executable, _script(tmp_path / "bin", sys.executable), env_key=None)
    assert out.returncode == 1 and "VLLM_API_KEY is unset" in out.stderr and out.stdout == ""
