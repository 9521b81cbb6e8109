"""SGLang mode: ``fake-sglang-python`` (-c BOOT, -m sglang.launch_server), SGLang's flags, API-key rules and
metrics, and the same replies as the vLLM mode."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fake_vllm.cli import EngineError, parse_sglang_args
from fake_vllm.testing import SGLANG_BOOT, child_environment, free_port, set_gate, start_server

CHAT = {"model": "m", "messages": [{"role": "user", "content": "tell me about ferns"}], "max_tokens": 64}
PYTHON = [sys.executable, "-m", "fake_vllm.sglang_python"]


def _python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PYTHON, *args], env=child_environment(env), capture_output=True, text=True, timeout=30, check=False
    )


def test_the_version_question_and_no_sglang_in_the_venv() -> None:
    asked = _python("-c", "import sglang; print(sglang.__version__)")
    assert asked.returncode == 0, asked.stderr
    assert re.fullmatch(r"0\.4\.7\+fakevllm\.\S+\n", asked.stdout)
    plain = subprocess.run([sys.executable, "-c", "import sglang"], capture_output=True, text=True, check=False)
    assert plain.returncode == 1 and "No module named 'sglang'" in plain.stderr  # the shim is not in the venv
    assert (Path(sys.executable).parent / "fake-sglang-python").is_file()


def test_acting_as_an_older_sglang_it_says_that_version_and_refuses_newer_flags() -> None:
    """``FAKE_VLLM_AS_SGLANG=0.4.6.post1``: ``sglang.__version__`` says so, and ``--pp-size`` (0.4.6.post2) is
    refused as that release's argparse refuses it (exit status 2); 0.4.6.post2 takes it."""
    old = {"FAKE_VLLM_AS_SGLANG": "0.4.6.post1"}
    asked = _python("-c", "import sglang; print(sglang.__version__)", env=old)
    assert asked.stdout == "0.4.6.post1\n"
    refused = _python("-m", "sglang.launch_server", "--model-path", "m", "--pp-size", "2", env=old)
    assert refused.returncode == 2 and refused.stderr.endswith(
        "launch_server.py: error: unrecognized arguments: --pp-size 2\n"
    ), refused.stderr
    with pytest.raises(SystemExit):
        parse_sglang_args(["--model-path", "m", "--enable-metrics"], {"FAKE_VLLM_AS_SGLANG": "0.3.5"})
    taken = parse_sglang_args(["--model-path", "m", "--pp-size", "2"], {"FAKE_VLLM_AS_SGLANG": "0.4.6.post2"})
    assert taken.pipeline_parallel_size == 2


def test_dash_c_sets_argv_as_python_does() -> None:
    shown = _python("-c", "import sys; print(sys.argv, __name__)", "--a", "b")
    assert shown.stdout.strip() == "['-c', '--a', 'b'] __main__"


def test_boot_serves_with_the_key_from_the_environment_only() -> None:
    key = "sglang-secret-token"
    with start_server(engine="sglang", api_key=key, args=["--enable-metrics"]) as server:
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
        assert SGLANG_BOOT.encode() in cmdline and key.encode() not in cmdline
        root = server.root_url
        # SGLang's middleware: every path but /health* and /metrics* needs the key.
        assert httpx.get(f"{root}/health").status_code == 200
        assert httpx.get(f"{root}/health_generate").status_code == 200
        assert httpx.get(f"{root}/metrics").status_code == 200
        for path in ("/v1/models", "/get_model_info"):
            refused = httpx.get(f"{root}{path}")
            assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
            assert httpx.get(f"{root}{path}", headers=server.headers).status_code == 200
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 401
        chat = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers=server.headers)
        assert chat.status_code == 200
        models = httpx.get(f"{server.base_url}/models", headers=server.headers).json()
        assert [(m["id"], m["owned_by"]) for m in models["data"]] == [("m", "sglang")]
        log = server.log_text()
    assert "SGLang server (launch_server)" in log and "api_key_required=yes" in log
    # As real SGLang (sgl-project/sglang#37457): its arguments at INFO, the key in clear among them, on its first
    # line; ddslurm's runtime keeps it out of the server's log file (ddslurm.runtime._redact).
    first = log.splitlines()[0]
    assert "server_args=ServerArgs(model_path='m', " in first and f"api_key='{key}'" in first
    assert "tp_size=1" in first and "node_rank=0" in first


def test_dash_m_serves_and_replies_as_vllm_does() -> None:
    with start_server(engine="sglang", args=["--served-model-name", "m"]) as server:
        argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert argv[3:5] == [b"-m", b"sglang.launch_server"]
        sglang = httpx.post(f"{server.base_url}/chat/completions", json=CHAT).json()
    with start_server() as server:
        vllm = httpx.post(f"{server.base_url}/chat/completions", json=CHAT).json()
    assert sglang["choices"][0]["message"]["content"] == vllm["choices"][0]["message"]["content"]
    assert sglang["usage"] == vllm["usage"]


def test_metrics_only_with_enable_metrics_under_sglang_names() -> None:
    with start_server(engine="sglang") as server:
        assert httpx.get(f"{server.root_url}/metrics").status_code == 404
    with start_server(engine="sglang", args=["--enable-metrics", "--served-model-name", "s"]) as server:
        assert httpx.post(f"{server.base_url}/chat/completions", json={**CHAT, "model": "s"}).status_code == 200
        text = httpx.get(f"{server.root_url}/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate"):
        assert f'{name}{{model_name="s"}} 0.0' in text
    assert 'sglang:num_requests_total{model_name="s"} 1.0' in text
    assert 'sglang:e2e_request_latency_seconds_count{model_name="s"} 1.0' in text
    assert "vllm:" not in text


def test_an_unknown_flag_is_refused_as_argparse_does() -> None:
    refused = _python("-m", "sglang.launch_server", "--model-path", "m", "--port", str(free_port()), "--bogus", "1")
    assert refused.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --bogus 1" in refused.stderr
    missing = _python("-m", "sglang.launch_server", "--port", "1")
    assert missing.returncode == 2
    assert "the following arguments are required: --model-path/--model" in missing.stderr


def test_sglang_aliases_prefixes_and_ignored_flags() -> None:
    settings = parse_sglang_args(
        ["--model", "org/w", "--tp", "2", "--dp", "2", "--ep-size", "2", "--max-running-requests", "3",
         "--mem-fraction-static", "0.8", "--disable-cuda-graph", "--trust-remote-code"],
        {},
    )  # fmt: skip
    assert (settings.model, settings.served_model_names, settings.port) == ("org/w", ("org/w",), 30000)
    assert (settings.tensor_parallel_size, settings.data_parallel_size, settings.expert_parallel_size) == (2, 2, 2)
    assert (settings.max_num_seqs, settings.capacity, settings.gpus_per_node) == (3, 6, 4)
    assert settings.ignored_args == ("--mem-fraction-static", "0.8", "--disable-cuda-graph", "--trust-remote-code")
    assert settings.api_keys == ()  # SGLang reads no key from the environment


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(
            ["--tp-size", "2", "--dp-size", "2", "--nnodes", "2", "--dist-init-addr", "h:1"],
            "unless dp attention",
            id="dp",
        ),
        pytest.param(
            ["--tp-size", "3", "--nnodes", "2", "--dist-init-addr", "h:1"], "divisible by number of nodes", id="tp"
        ),
        pytest.param(["--tp-size", "2", "--nnodes", "2"], "--dist-init-addr", id="no-address"),
    ],
)
def test_sglang_multi_node_checks(args: list[str], needle: str) -> None:
    with pytest.raises(EngineError, match=re.escape(needle)):
        parse_sglang_args(["--model-path", "m", *args], {})


def test_too_few_gpus_is_refused_like_cuda() -> None:
    refused = _python(
        "-m", "sglang.launch_server", "--model-path", "m", "--port", str(free_port()), "--tp-size", "2",
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )  # fmt: skip
    assert refused.returncode == 1
    assert "invalid device ordinal" in refused.stderr and "need 2 GPU(s)" in refused.stderr


def test_health_generates_one_token_and_fails_while_generation_is_held(tmp_path: Path) -> None:
    """SGLang's /health is a one-token generation: while the gate holds every generation it gets no output and
    answers 503 (after SGLANG_HEALTH_CHECK_TIMEOUT: the hold, not the timeout, decides it), as /health_generate
    does; /v1/models and /model_info, which do not generate, answer at once. With the gate open it is 200 again,
    and with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false /health answers without generating."""
    gate = tmp_path / "gate"
    key = "k"
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "0.2"}
    with start_server(engine="sglang", api_key=key, args=["--fake-gate", str(gate)], env=env) as server:
        root = server.root_url
        set_gate(gate, "hold")
        assert httpx.get(f"{root}/health", timeout=30).status_code == 503
        assert httpx.get(f"{root}/health_generate", timeout=30).status_code == 503
        assert "Health check failed" in server.log_text()
        for path in ("/v1/models", "/model_info", "/get_model_info"):
            assert httpx.get(f"{root}{path}", headers=server.headers, timeout=30).status_code == 200
        set_gate(gate, "")
        assert httpx.get(f"{root}/health", timeout=30).status_code == 200
    off = {**env, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
    with start_server(engine="sglang", api_key=key, args=["--fake-gate", str(gate)], env=off) as server:
        set_gate(gate, "hold")
        assert httpx.get(f"{server.root_url}/health", timeout=30).status_code == 200
        assert httpx.get(f"{server.root_url}/health_generate", timeout=30).status_code == 503


def test_metrics_behind_the_key_on_request() -> None:
    """``--fake-metrics-auth``: /metrics wants the key (a proposed vLLM change), 401 without it."""
    with start_server(api_key="k", args=["--fake-metrics-auth"]) as server:
        assert httpx.get(f"{server.root_url}/metrics").status_code == 401
        assert httpx.get(f"{server.root_url}/metrics", headers=server.headers).status_code == 200
    with start_server(api_key="k") as server:
        assert httpx.get(f"{server.root_url}/metrics").status_code == 200
