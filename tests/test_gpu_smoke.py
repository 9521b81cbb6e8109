"""``make gpu-smoke`` (tools/gpu_smoke) without a GPU: vLLM's help parsed in each shape its versions print, the flag
check, the token scanner, the skip path of a CPU-only machine, and the checks' plumbing end to end against the
stand-in (``--no-gpu-check``: ``fake-vllm`` in vLLM's place, its engine a process of its own)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu_smoke.checks import Deadline, Smoke, check_flags, engine_processes
from tools.gpu_smoke.cli import gpu_absent, main
from tools.gpu_smoke.helptext import collect_help, flags_of, help_flags, missing
from tools.gpu_smoke.rendered import rendered
from tools.gpu_smoke.scan import find_in_file, scan

REPO = Path(__file__).resolve().parents[1]
FAKE_VLLM = Path(sys.executable).parent / "fake-vllm"

# -- vLLM's help, in the shapes its versions print (argparse's layout with vLLM's SortedHelpFormatter and
# -- ArgumentDefaultsHelpFormatter: invocations indented by 2, help text at column 24 or on the next line)

FLAT_HELP = """\
usage: vllm serve [model_tag] [options]

Start the vLLM OpenAI Compatible API server.

positional arguments:
  model_tag             The model tag to serve (optional if specified in config) (default: None)

options:
  --allow-credentials   Allow credentials. (default: False)
  --api-key API_KEY     If provided, the server will require this key to be presented in the header. (default: None)
  --headless            Run in headless mode. See multi-node data parallel documentation for more details.
                        (default: False)
  --host HOST           Host name. (default: None)
  --port PORT           Port number. (default: 8000)
  --uds UDS             Unix domain socket path. If set, host and port arguments are ignored. (default: None)
  -h, --help            show this help message and exit

ModelConfig:
  Configuration for the model.

  --dtype {auto,bfloat16,float,float16,float32,half}
                        Data type for model weights and activations. (default: auto)
  --max-model-len MAX_MODEL_LEN
                        Model context length (prompt and output). Parses human-readable integers like '1k'.
                        --max-model-len is also read from the model's config. (default: None)
  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]
                        The model name(s) used in the API. (default: None)

ParallelConfig:
  Configuration for the distributed execution.

  --data-parallel-address DATA_PARALLEL_ADDRESS, -dpa DATA_PARALLEL_ADDRESS
                        Address of data parallel cluster head-node. (default: None)
  --data-parallel-rpc-port DATA_PARALLEL_RPC_PORT, -dpp DATA_PARALLEL_RPC_PORT
                        Port for data parallel RPC communication. (default: None)
  --data-parallel-size DATA_PARALLEL_SIZE, -dp DATA_PARALLEL_SIZE
                        Number of data parallel groups. (default: 1)
  --data-parallel-size-local DATA_PARALLEL_SIZE_LOCAL, -dpl DATA_PARALLEL_SIZE_LOCAL
                        Number of data parallel replicas to run on this node. (default: None)
  --data-parallel-start-rank DATA_PARALLEL_START_RANK, -dpr DATA_PARALLEL_START_RANK
                        Starting data parallel rank for secondary nodes. (default: None)
  --enable-expert-parallel, --no-enable-expert-parallel
                        Use expert parallelism instead of tensor parallelism for MoE layers. (default: False)
  --master-addr MASTER_ADDR
                        distributed master address for multi-node distributed inference when
                        distributed_executor_backend is mp. (default: 127.0.0.1)
  --master-port MASTER_PORT
                        distributed master port for multi-node distributed inference. (default: 29501)
  --nnodes NNODES, -n NNODES
                        num of nodes for multi-node distributed inference. (default: 1)
  --node-rank NODE_RANK, -r NODE_RANK
                        distributed node rank for multi-node distributed inference. (default: 0)
  --pipeline-parallel-size PIPELINE_PARALLEL_SIZE, -pp PIPELINE_PARALLEL_SIZE
                        Number of pipeline parallel groups. (default: 1)
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
                        Number of tensor parallel groups. (default: 1)

SchedulerConfig:
  --max-num-seqs MAX_NUM_SEQS
                        Maximum number of sequences to be processed in a single iteration. (default: None)

When passing JSON CLI arguments, the following sets of arguments are equivalent:
   --json-arg '{"key1": "value1", "key2": {"key3": "value2"}}'
   --json-arg.key1 value1 --json-arg.key2.key3 value2
"""
"""vLLM up to 0.10, ``vllm serve --help``; since 0.11 the same text is ``vllm serve --help=all``."""

SUMMARY_HELP = """\
usage: vllm serve [model_tag] [options]

Launch a local OpenAI-compatible API server to serve LLM
completions via HTTP. Defaults to Qwen/Qwen3-0.6B if no model is specified.

Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,
--help=ModelConfig, --help=Frontend)
  Use `--help=all` to show all available flags at once.

Config Groups:
  positional arguments
  options
  Frontend                Arguments for the OpenAI-compatible frontend server.
  ModelConfig             Configuration for the model.
  ParallelConfig          Configuration for the distributed execution.

When passing JSON CLI arguments, the following sets of arguments are equivalent:
   --json-arg '{"key1": "value1", "key2": {"key3": "value2"}}'
"""
"""vLLM 0.11 and later, ``vllm serve --help``: the groups only (``FlexibleArgumentParser.format_help``)."""

KEYWORD_HELP = """\

Parameters matching 'all':

  --allow-credentials   Allow credentials. (default: False)
  --allowed-headers ALLOWED_HEADERS
                        Allowed headers. (default: ['*'])
"""
"""vLLM 0.10.x, ``vllm serve --help=all``: a keyword search (``show_filtered_argument_or_group_from_help``)."""


def test_the_options_of_vllms_flat_help_are_read_and_its_prose_is_not() -> None:
    flags = help_flags(FLAT_HELP)
    assert {
        "--uds",
        "--tensor-parallel-size",
        "-tp",
        "--enable-expert-parallel",
        "--no-enable-expert-parallel",
    } <= flags
    assert {"--nnodes", "-n", "--node-rank", "--headless", "--data-parallel-start-rank", "-h", "--help"} <= flags
    assert "--dtype" in flags and "--served-model-name" in flags
    # flags only mentioned in help text or the epilog are not options
    assert "--json-arg" not in flags and "--json-arg.key1" not in flags
    assert "--max-model-len" in flags  # an option, whatever its help text mentions


def test_the_grouped_summary_lists_no_option_and_the_keyword_search_only_its_matches() -> None:
    assert help_flags(SUMMARY_HELP) == set()
    assert help_flags(KEYWORD_HELP) == {"--allow-credentials", "--allowed-headers"}


def _fake_vllm(tmp_path: Path, answers: dict[str, str], prelude: str = "") -> Path:
    """An executable that answers ``serve --help...`` with the given texts (exit 0), anything else as fake-vllm."""
    for argument, text in answers.items():
        (tmp_path / f"help{argument}.txt").write_text(text)
    script = tmp_path / "vllm"
    script.write_text(
        "#!/bin/sh\n"
        f"{prelude}"
        f'if [ "$1" = serve ] && [ -f "{tmp_path}/help$2.txt" ]; then cat "{tmp_path}/help$2.txt"; exit 0; fi\n'
        f'if [ "$1" = serve ] && [ "${{2#--help}}" != "$2" ]; then echo "error: unrecognized: $2" >&2; exit 2; fi\n'
        f'exec "{FAKE_VLLM}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param({"--help=all": FLAT_HELP, "--help": SUMMARY_HELP}, id="0.11+: --help=all"),
        pytest.param({"--help=all": KEYWORD_HELP, "--help": FLAT_HELP}, id="0.10: --help, --help=all a search"),
        pytest.param({"--help": FLAT_HELP}, id="older: --help=all refused"),
    ],
)
def test_the_help_is_collected_whichever_shape_the_version_prints(tmp_path: Path, answers: dict[str, str]) -> None:
    flags, said = collect_help(str(_fake_vllm(tmp_path, answers)), dict(os.environ), timeout=60)
    assert help_flags(FLAT_HELP) <= flags
    assert [a.argument for a in said] == ["--help=all", "--help"]


def test_every_rendered_flag_is_in_the_flat_help() -> None:
    rendered_flags = {flag for _shape, argv in rendered() for flag in flags_of(argv[2:])}
    assert {
        "--uds",
        "--headless",
        "--nnodes",
        "--data-parallel-start-rank",
        "--enable-expert-parallel",
    } <= rendered_flags
    assert missing(sorted(rendered_flags), help_flags(FLAT_HELP)) == []


def test_a_flag_vllm_lacks_fails_the_check_by_its_name(tmp_path: Path) -> None:
    """A vLLM before vllm-project/vllm#18097 has no ``--uds``: the check fails and says which forms render it."""
    old = "\n".join(line for line in FLAT_HELP.splitlines() if not line.startswith("  --uds"))
    vllm = _fake_vllm(tmp_path, {"--help": old})
    smoke = Smoke(vllm=str(vllm), model="m", work=tmp_path, runtime_exe=Path("unused"), env=dict(os.environ))
    status, detail = check_flags(smoke, Deadline(60))
    assert status == "FAIL", detail
    assert "1 flag(s)" in detail and "--uds (rendered for: one node, --uds, tensor parallel" in detail


def test_spellings_are_compared_as_vllm_reads_them() -> None:
    assert flags_of(["--max_num_seqs=8", "-O3", "--x.y", "2", "-1", "--max-num-seqs"]) == [
        "--max-num-seqs",
        "-O3",
        "--x.y",
    ]
    assert missing(["--max-num-seqs", "-O3", "--json-arg.key1"], {"--max-num-seqs", "-O", "--json-arg"}) == []
    assert missing(["--nope"], {"--max-num-seqs"}) == ["--nope"]


# -- the token scanner


TOKEN = "tok-" + "x7Q" * 10


@pytest.mark.parametrize("chunk", [1, 5, 7, len(TOKEN) - 1, len(TOKEN), 64])
@pytest.mark.parametrize("at", [0, 3, 6, 13, 40])
def test_a_token_is_found_wherever_the_chunks_cut_it(tmp_path: Path, chunk: int, at: int) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a" * at + TOKEN.encode() + b"z" * 9)
    assert find_in_file(path, TOKEN.encode(), chunk=chunk) == at


def test_a_file_without_the_token_or_with_part_of_it_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"b" * 100 + TOKEN[:-1].encode() + b"\n" + TOKEN[1:].encode())
    assert find_in_file(path, TOKEN.encode(), chunk=7) is None


def test_the_scan_reads_the_caches_files_written_since_and_names_where_the_token_is(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "vllm" / "torch_compile_cache" / "abc" / "rank_0_0"
    cache.mkdir(parents=True)
    leak = cache / "cache_key_factors.json"
    leak.write_text(json.dumps({"env": {"VLLM_API_KEY": TOKEN}}))
    clean = cache / "other.py"
    clean.write_text("nothing here")
    old = tmp_path / "cache" / "vllm" / "old.json"
    old.write_text(TOKEN)
    os.utime(old, (1_000_000, 1_000_000))
    (tmp_path / "cache" / "vllm" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text(TOKEN)
    log = tmp_path / "server.log"
    log.write_text("INFO ready\n")

    read, found = scan([log, tmp_path / "cache" / "vllm", tmp_path / "missing"], TOKEN, since=2_000_000)
    assert read == 3  # the log, the two recent cache files: not the old file, not the link
    assert [(f.path, f.offset) for f in found] == [(leak, leak.read_text().index(TOKEN))]
    assert scan([log, clean], TOKEN) == (2, [])


# -- a CPU-only machine


def _bin(tmp_path: Path, name: str, body: str) -> Path:
    tool = tmp_path / "bin" / name
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return tool.parent


def test_without_a_gpu_every_check_is_skipped_and_the_run_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"PATH": str(_bin(tmp_path, "true", "exit 0"))}  # no nvidia-smi
    assert main(["--vllm", str(FAKE_VLLM)], env=env) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in out[:6]] == [["SKIP", str(n), name] for n, name in enumerate(
        ["flags", "server", "proxy", "engine-death", "token", "e2e"], start=1)]  # fmt: skip
    assert out[-1] == "gpu-smoke: skipped: no nvidia-smi on PATH (no NVIDIA driver)"


def test_a_driver_without_gpus_or_a_missing_vllm_skips_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_bin(tmp_path, "nvidia-smi", "echo 'No devices were found'; exit 6"))
    assert gpu_absent({"PATH": path}) is not None and "lists no GPU" in str(gpu_absent({"PATH": path}))
    with_gpu = str(_bin(tmp_path / "g", "nvidia-smi", "echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'"))
    assert gpu_absent({"PATH": with_gpu}) is None
    assert main(["--json", "--vllm", "no-such-vllm"], env={"PATH": with_gpu}) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit"] == 0 and doc["counts"] == {"PASS": 0, "FAIL": 0, "SKIP": 6}
    assert doc["summary"] == "skipped: no vLLM executable 'no-such-vllm' (VLLM=path names one)"


# -- the checks' plumbing against the stand-in


def _smoke(
    tmp_path: Path, vllm: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_VLLM_", "VLLM_"))}
    environ |= {"HOME": str(tmp_path / "home"), "FAKE_VLLM_ENGINE_PROCESS": "1", "FAKE_VLLM_LATENCY": "0.05"}
    argv = [sys.executable, "-m", "tools.gpu_smoke", "--no-gpu-check", "--vllm", str(vllm), "--model", "org/smoke"]
    return subprocess.run(
        [*argv, "--json", "--keep", str(tmp_path / "work"), *extra],
        cwd=REPO,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_checks_one_to_five_pass_against_the_stand_in(tmp_path: Path) -> None:
    done = _smoke(tmp_path, FAKE_VLLM, "--skip", "e2e")
    doc = json.loads(done.stdout)
    status = {c["name"]: (c["status"], c["detail"]) for c in doc["checks"]}
    assert [s for s, _ in status.values()] == ["PASS"] * 5 + ["SKIP"], status
    assert "are in vLLM's help" in status["flags"][1]
    assert "/v1/models 401 without the token, 200 with it" in status["server"][1]
    waiting = int(status["proxy"][1].split("the proxy saw ")[1].split()[0])
    assert waiting > 0, status["proxy"]
    assert "killed the engine" in status["engine-death"][1] and "the server exited 1" in status["engine-death"][1]
    assert "the token is in none of" in status["token"][1]
    # skipping a check on a machine that could run it is no pass: incomplete
    assert (done.returncode, doc["summary"]) == (3, "incomplete: skipped e2e"), done.stderr[-2000:]
    # the server ran as ddslurm renders it: on --uds, the token only in its environment
    log = (tmp_path / "work" / "server-generator-0.log").read_text()
    assert "Starting vLLM API server on unix:" in log and "api_key_required=yes" in log


def test_a_server_that_writes_its_token_into_its_cache_fails_the_token_check_naming_the_file(tmp_path: Path) -> None:
    """As vLLM before vllm-project/vllm#52523 did with the key in its environment: the token in
    ``~/.cache/vllm/.../cache_key_factors.json``. The token it prints on its output is another matter: the smoke test
    starts the server as the runtime does, its output through the runtime's redaction, so the log holds
    ``[redacted]`` and only the cache file fails the check."""
    factors = tmp_path / "home" / ".cache" / "vllm" / "torch_compile_cache" / "cache_key_factors.json"
    leaky = _fake_vllm(
        tmp_path,
        {"--help": FLAT_HELP},
        prelude=(
            'if [ "$1" = serve ]; then echo "args: api_key=$VLLM_API_KEY"; '
            f'mkdir -p "{factors.parent}"; echo "{{\\"VLLM_API_KEY\\": \\"$VLLM_API_KEY\\"}}" > "{factors}"; fi\n'
        ),
    )
    done = _smoke(tmp_path, leaky, "--skip", "e2e")
    doc = json.loads(done.stdout)
    token = next(c for c in doc["checks"] if c["name"] == "token")
    assert token["status"] == "FAIL" and str(factors) in token["detail"], token
    assert str(tmp_path / "work" / "server-generator-0.log") not in token["detail"]
    assert "args: api_key=[redacted]" in (tmp_path / "work" / "server-generator-0.log").read_text()
    assert done.returncode == 1 and doc["summary"] == "FAILED: token"


def test_a_server_whose_engine_is_not_a_process_of_its_own_fails_the_engine_check(tmp_path: Path) -> None:
    done = _smoke(tmp_path, FAKE_VLLM, "--skip", "e2e", env={"FAKE_VLLM_ENGINE_PROCESS": "0"})
    doc = json.loads(done.stdout)
    engine = next(c for c in doc["checks"] if c["name"] == "engine-death")
    assert engine["status"] == "FAIL" and "no process with 'EngineCore'" in engine["detail"], engine
    assert engine_processes(os.getpid()) == []


@pytest.mark.dd
def test_all_six_checks_pass_against_the_stand_in_the_run_end_to_end_included(tmp_path: Path) -> None:
    done = _smoke(tmp_path, FAKE_VLLM)
    doc = json.loads(done.stdout)
    assert done.returncode == 0 and doc["summary"] == "all 6 checks passed", doc
    e2e = doc["checks"][-1]
    assert e2e["name"] == "e2e" and "4 records generated" in e2e["detail"]


def test_without_a_model_or_transformers_the_server_checks_are_skipped_and_the_run_is_incomplete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``MODEL`` and no ``transformers`` to make a tiny one: only the flag check runs, the rest say why not, and
    the run is no pass (exit 3), since this machine could have run them."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it fails, as where it is not installed
    code = main(["--no-gpu-check", "--vllm", str(FAKE_VLLM), "--keep", str(tmp_path / "work")], env=dict(os.environ))
    out = capsys.readouterr().out.splitlines()
    assert code == 3 and out[-1] == "gpu-smoke: incomplete: skipped server, proxy, engine-death, token, e2e"
    assert out[0].startswith("PASS 1 flags")
    assert all(line.startswith("SKIP") and "transformers is not importable" in line for line in out[1:6]), out
