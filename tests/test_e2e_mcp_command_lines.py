"""Issue 37, item 1: a key in an MCP server's arguments. While ``ddslurm submit`` lists a stdio MCP server's tools
(its tool config has ``allow_tools``), another user of the machine (``nobody``) reads every command line: none holds
a secret of the run. A server whose arguments hold one (``--auth=<the server's own token>``) is refused at its file,
line, column and field before it is started; one given its token through its environment (``${VAR}``) is started
and listed, the token on no command line.

The stdio server is held: it marks that it started and waits for the test to release it, so the look happens
while the check is under way, with no timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import DDSLURM, as_nobody, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

DOCS_TOKEN = "mcp-docs-" + "PLm02kfj2n4vB61x9d"

RECIPE = """\
data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [owls, bats]}}
  - {name: near, column_type: llm-text, model_alias: writer, prompt: "Seek {{ topic }}", tool_alias: local-tools}
  model_configs:
  - {alias: writer, model: demo/writer-8b, provider: demo-hosted, inference_parameters: {max_tokens: 64}}
  tool_configs:
  - {tool_alias: local-tools, providers: [local], allow_tools: [local_lookup], timeout_sec: 60}
"""

HELD_SERVER = """\
import os, sys, time
from pathlib import Path

here = Path(sys.argv[1])
(here / "started").write_text(str(os.getpid()))
while not (here / "release").exists():  # held until the test has looked
    time.sleep(0.05)
log = str(here / "local.jsonl")
os.execv(sys.executable, [sys.executable, "-m", "fake_vllm.mcp_server", "--tool", "local_lookup", "--log", log])
"""

EVERY_COMMAND_LINE = r"""
import json, pathlib
lines = []
for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    try:
        lines.append(cmdline.read_bytes().decode(errors="replace").replace("\0", " "))
    except OSError:
        pass
print(json.dumps(lines))
"""


def _submit_and_look(files: Any, extra_args: list[str]) -> tuple[int, str, str, bool, list[str]]:
    """``ddslurm submit --dry-run --json`` of ``files`` whose stdio server gets ``extra_args`` too; while the server
    is held (if it is started at all), ``nobody`` reads every command line of the machine. Returns the exit code,
    what it printed (standard output, standard error), whether the server was started, and the command lines
    ``nobody`` saw."""
    root: Path = files.root
    (root / "recipe.yaml").write_text(RECIPE)
    server = root / "held_server.py"
    server.write_text(HELD_SERVER)
    args = [str(server), str(root), *extra_args]
    (files.dd_home / "mcp_providers.yaml").write_text(
        "providers:\n"
        f"- {{name: local, provider_type: stdio, command: '{sys.executable}', args: {json.dumps(args)},\n"
        "   env: {DOCS_TOKEN: '${MCP_DOCS_TOKEN}'}}\n"
    )
    env = {**files.env, "MCP_DOCS_TOKEN": DOCS_TOKEN}
    started, release = root / "started", root / "release"
    out, err = root / "submit.out", root / "submit.err"
    argv = [DDSLURM, "submit", str(files.run_file), "--profile", str(files.profile), "--dry-run", "--json"]
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, text=True)
        try:
            until(lambda: started.exists() or proc.poll() is not None, 300, "the server's start or submit's end")
            seen = json.loads(as_nobody(EVERY_COMMAND_LINE)) if started.exists() else []
        finally:
            release.write_text("")
            code = proc.wait(timeout=300)
    return code, out.read_text(), err.read_text(), started.exists(), seen


def test_an_mcp_server_argument_with_the_runs_token_is_refused_before_any_user_can_see_it(
    make_run_files: Any,
) -> None:
    files = make_run_files("mcp-args")
    code, out, err, started, seen = _submit_and_look(files, [f"--auth={DOCS_TOKEN}"])
    secrets = {"docs token": DOCS_TOKEN, "hosted key": files.env["DEMO_HOSTED_API_KEY"]}
    for name, secret in secrets.items():
        assert not any(secret in line for line in seen), f"nobody saw the {name} on a command line"
        assert secret not in out + err, name
    assert not started, "the server was started with the token on its command line"
    assert code == 2, out + err
    mcp = files.dd_home / "mcp_providers.yaml"
    col = mcp.read_text().splitlines()[1].index('"--auth=') + 1  # line 2: the argument's opening quote
    place = f"{mcp}:2:{col}: providers[0].args[2]: MCP provider 'local': holds the value of $MCP_DOCS_TOKEN"
    assert place in json.loads(out)["error"]["message"] and place in err, out + err


def test_an_mcp_server_given_its_token_by_environment_is_listed_with_no_secret_on_any_command_line(
    make_run_files: Any,
) -> None:
    files = make_run_files("mcp-env")
    code, out, err, started, seen = _submit_and_look(files, ["--mode=fast"])
    assert started and code == 0, out + err
    assert any("held_server.py" in line and "--mode=fast" in line for line in seen)  # nobody saw the server
    # Listed by the profile's python_env (issue 38), whose Data Designer the client step calls the tools with.
    python_env = next(line for line in files.profile.read_text().splitlines() if line.startswith("python_env:"))
    runtime = Path(python_env.split(":", 1)[1].strip()) / "bin" / "ddslurm-runtime"
    assert any(f"{runtime} inspect" in line for line in seen), seen
    for name, secret in {"docs token": DOCS_TOKEN, "hosted key": files.env["DEMO_HOSTED_API_KEY"]}.items():
        assert not any(secret in line for line in seen), f"nobody saw the {name} on a command line"
        assert secret not in out + err, name
