from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fake_vllm.cli import FAKE_OPTIONS, UsageError, main, parse_serve_args
from fake_vllm.testing import child_environment, free_port


def test_vllm_command_line_with_ignored_flags() -> None:
    settings = parse_serve_args(
        [
            "meta-llama/Llama-3.1-8B-Instruct",
            "--host", "0.0.0.0",
            "--port", "9001",
            "--served-model-name", "llama", "llama-8b",
            "--tensor-parallel-size", "4",
            "--max-model-len", "4096",
            "--gpu-memory-utilization", "0.9",
            "--dtype", "auto",
            "--enable-prefix-caching",
            "--trust-remote-code",
            "--kv-cache-dtype=fp8",
            "--swap-space", "-1",
            "--api-key", "secret",
        ],
        {},
    )  # fmt: skip
    assert settings.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert settings.served_model_names == ("llama", "llama-8b")
    assert (settings.host, settings.port, settings.tensor_parallel_size) == ("0.0.0.0", 9001, 4)
    assert settings.api_keys == ("secret",)
    assert settings.ignored_args == (
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.9", "--dtype", "auto",
        "--enable-prefix-caching", "--trust-remote-code", "--kv-cache-dtype", "fp8", "--swap-space", "-1",
    )  # fmt: skip


def test_defaults() -> None:
    settings = parse_serve_args(["m"], {})
    assert settings.served_model_names == ("m",)
    assert (settings.host, settings.port, settings.api_keys) == ("127.0.0.1", 8000, ())
    assert settings.uds is None
    assert settings.listen_address == "http://127.0.0.1:8000"
    for option in FAKE_OPTIONS:
        assert getattr(settings, option.dest) == option.default


@pytest.mark.parametrize(
    ("args", "want_model", "want_ignored"),
    [
        pytest.param(["--model", "m", "--dtype", "auto"], "m", ["--dtype", "auto"], id="model-flag"),
        pytest.param(["--disable-log-requests", "m"], "m", ["--disable-log-requests"], id="boolean-before-model"),
        pytest.param(["-tp", "2", "m", "-O3"], "m", ["-O", "3"], id="short-flags"),
        pytest.param(
            ["m", "--limit-mm-per-prompt", '{"image": 1}'],
            "m",
            ["--limit-mm-per-prompt", '{"image": 1}'],
            id="json-value",
        ),
    ],
)
def test_model_position_and_unknown_flags(args: list[str], want_model: str, want_ignored: list[str]) -> None:
    settings = parse_serve_args(args, {})
    assert settings.model == want_model
    assert list(settings.ignored_args) == want_ignored


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["m", "--uds", "/run/vllm/s.sock"], id="uds"),
        pytest.param(["m", "--uds=/run/vllm/s.sock", "--port", "70000"], id="inline-and-port-ignored"),
        pytest.param(["--uds", "/run/vllm/s.sock", "m", "--host", "0.0.0.0", "--dtype", "auto"], id="before-model"),
    ],
)
def test_uds(args: list[str]) -> None:
    settings = parse_serve_args(args, {})
    assert settings.model == "m"
    assert settings.uds == Path("/run/vllm/s.sock")
    assert settings.listen_address == "unix:/run/vllm/s.sock"  # host and port are ignored
    assert "--uds" not in settings.ignored_args


def test_listen_address_of_ipv6_and_empty_hosts() -> None:
    assert parse_serve_args(["m", "--host", "::1", "--port", "9"], {}).listen_address == "http://[::1]:9"
    assert parse_serve_args(["m", "--host", "", "--port", "9"], {}).listen_address == "http://0.0.0.0:9"


def test_vllm_spellings_underscores_and_short_forms() -> None:
    """vLLM's FlexibleArgumentParser: ``--max_num_seqs`` is ``--max-num-seqs``; ``-tp/-pp/-dp`` are the sizes."""
    settings = parse_serve_args(
        ["m", "--max_num_seqs", "3", "-tp", "2", "-pp", "2", "-dp", "2", "--no-enable-lora"], {}
    )
    assert (settings.tensor_parallel_size, settings.pipeline_parallel_size, settings.data_parallel_size) == (2, 2, 2)
    assert (settings.max_num_seqs, settings.capacity) == (3, 6)  # per data-parallel rank
    assert settings.ignored_args == ("--no-enable-lora",)


def test_env_sets_fake_options_and_flag_wins() -> None:
    env = {
        "FAKE_VLLM_LATENCY": "0.25",
        "FAKE_VLLM_CAPACITY": "3",
        "FAKE_VLLM_CRASH_AFTER": "5",
        "FAKE_VLLM_ERROR_RATE": "0.1",
        "FAKE_VLLM_429_RATE": "0.2",
        "FAKE_VLLM_NO_CHOICES_RATE": "0.3",
        "FAKE_VLLM_SEED": "9",
        "FAKE_VLLM_NEVER_HEALTHY": "yes",
        "FAKE_VLLM_FAIL_START": "0",
        "FAKE_VLLM_REQUEST_LOG": "/tmp/x.jsonl",
        "FAKE_VLLM_STARTUP_DELAY": "2",
        "VLLM_API_KEY": "from-env",
    }
    settings = parse_serve_args(["m", "--fake-latency", "0.5"], env)
    assert settings.latency == 0.5
    assert (settings.capacity, settings.crash_after, settings.seed) == (3, 5, 9)
    assert (settings.error_rate, settings.rate_429, settings.startup_delay) == (0.1, 0.2, 2.0)
    assert settings.no_choices_rate == 0.3
    assert parse_serve_args(["m", "--fake-no-choices-rate", "0.05"], env).no_choices_rate == 0.05
    assert settings.never_healthy is True and settings.fail_start is False
    assert settings.request_log == Path("/tmp/x.jsonl")
    assert settings.api_keys == ("from-env",)
    assert parse_serve_args(["m", "--api-key", "flag"], env).api_keys == ("flag",)


@pytest.mark.parametrize(
    ("args", "env", "want_capacity"),
    [
        pytest.param(["m", "--max-num-seqs", "8"], {}, 8, id="max-num-seqs"),
        pytest.param(["m", "--max-num-seqs=8"], {}, 8, id="max-num-seqs-inline"),
        pytest.param(["m", "--max-num-seqs", "8", "--fake-capacity", "3"], {}, 3, id="fake-capacity-flag-wins"),
        pytest.param(["m", "--max-num-seqs", "8"], {"FAKE_VLLM_CAPACITY": "2"}, 2, id="fake-capacity-env-wins"),
        pytest.param(["m", "--max-num-seqs", "8", "--fake-capacity", "0"], {}, 0, id="explicit-unlimited-wins"),
    ],
)
def test_max_num_seqs_is_the_capacity_unless_fake_capacity_is_given(
    args: list[str], env: dict[str, str], want_capacity: int
) -> None:
    settings = parse_serve_args(args, env)
    assert settings.max_num_seqs == 8
    assert settings.capacity == want_capacity
    assert settings.ignored_args == ()  # a flag the stand-in models, not one it ignores


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param([], {}, id="no-model"),
        pytest.param(["m", "--fake-error-rate", "1.5"], {}, id="rate-above-one"),
        pytest.param(["m", "--fake-latency", "-1"], {}, id="negative-latency"),
        pytest.param(["m"], {"FAKE_VLLM_NEVER_HEALTHY": "maybe"}, id="bad-env-bool"),
        pytest.param(["m"], {"FAKE_VLLM_ERROR_RATE": "0.6", "FAKE_VLLM_429_RATE": "0.6"}, id="rates-sum"),
        pytest.param(["m", "--fake-no-choices-rate", "0.5", "--fake-error-rate", "0.6"], {}, id="no-choices-sum"),
        pytest.param(["m", "--port", "70000"], {}, id="bad-port"),
        pytest.param(["a", "--model", "b"], {}, id="two-models"),
        pytest.param(["m", "--max-num-seqs", "0"], {}, id="max-num-seqs-zero"),
        pytest.param(["m", "--max-num-seqs", "many"], {}, id="max-num-seqs-not-a-number"),
        pytest.param(["m", "--uds", ""], {}, id="empty-uds"),
    ],
)
def test_bad_values_are_usage_errors(args: list[str], env: dict[str, str]) -> None:
    with pytest.raises(UsageError):
        parse_serve_args(args, env)


def test_main_version_and_usage(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_VLLM_AS_VLLM", raising=False)
    assert main(["--version"]) == 0
    # as `vllm --version`: the release alone (the one whose flags the stand-in has), marked as the stand-in's
    assert re.fullmatch(r"0\.11\.1\+fakevllm\.\S+\n", capsys.readouterr().out)
    assert main(["launch"]) == 2
    assert main(["serve", "m", "--fake-capacity", "x"]) == 2
    assert "fake-capacity" in capsys.readouterr().err


def test_fail_start_exits_non_zero_without_listening() -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "fake_vllm", "serve", "m", "--port", str(port), "--max-model-len", "8"],
        env=child_environment({"FAKE_VLLM_FAIL_START": "1"}),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 1
    assert "Engine core initialization failed" in proc.stderr
    assert "vLLM API server version fake-vllm" in proc.stderr
    assert "ignoring vLLM arguments the stand-in does not model: --max-model-len 8" in proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["--bogus-flag", "1"], "unrecognized arguments: --bogus-flag 1", id="unknown"),
        pytest.param(["--max-num"], "unrecognized arguments: --max-num", id="no-abbreviations"),
        pytest.param(
            ["--tensor-parallel-size", "two"], "argument --tensor-parallel-size/-tp: invalid int value", id="type"
        ),
    ],
)
def test_vllm_refuses_what_its_argparse_refuses(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "m", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vllm serve [model_tag] [options]")
    assert f"vllm serve: error: {needle}" in err


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--max-model-len", "8192"], id="max-model-len"),
        pytest.param(["--max-num-seqs=6"], id="max-num-seqs-inline"),
        pytest.param(["--hf-token"], id="bare-hf-token"),
        pytest.param(["--hf-token", "--dtype", "auto"], id="hf-token-then-flag"),
        pytest.param(["--no-enable-prefix-caching", "--enforce-eager", "-q", "fp8"], id="booleans-and-short"),
        pytest.param(["--disable-log-requests", "--enable-log-requests"], id="log-requests"),
        pytest.param(["--enable-expert-parallel", "-tp", "2", "-dp", "2", "--all2all-backend", "pplx"], id="ep"),
    ],
)
def test_real_vllm_flags_are_accepted(args: list[str]) -> None:
    parse_serve_args(["m", *args], {})


def test_expert_parallel_is_logged() -> None:
    from fake_vllm.server import describe

    settings = parse_serve_args(["m", "--enable-expert-parallel", "-tp", "2", "-dp", "2"], {})
    assert settings.expert_parallel_size == 4
    assert any("expert parallel enabled: EP size 4" in line for line in describe(settings))
    alone = parse_serve_args(["m", "--enable-expert-parallel"], {})
    assert any("TP x DP = 1" in line for line in describe(alone))


def test_multi_node_flags_become_a_group() -> None:
    nodes = parse_serve_args(
        ["m", "-tp", "4", "-pp", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "n1", "--master-port",
         "29600", "--headless"],
        {},
    )  # fmt: skip
    assert nodes.group is not None and (nodes.group.form, nodes.group.rank, nodes.group.rendezvous) == (
        "nodes", 1, "n1:29600",
    )  # fmt: skip
    assert nodes.gpus_per_node == 4 and nodes.headless
    dp = parse_serve_args(["m", "-tp", "2", "-dp", "4", "-dpl", "2", "-dpa", "n1", "-dpp", "13345"], {})
    assert dp.group is not None and (dp.group.form, dp.group.nodes, dp.group.rank) == ("data-parallel", 2, 0)
    assert dp.gpus_per_node == 4
    follower = parse_serve_args(["m", "-tp", "2", "-dp", "4", "-dpl", "2", "--headless", "-dpr", "2"], {})
    assert follower.group is not None and follower.group.rank == 1


def _serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fake_vllm", *args], env=child_environment(env), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_acting_as_an_older_vllm_it_says_that_version_and_refuses_newer_flags_as_argparse_does(
    tmp_path: Path,
) -> None:
    """``FAKE_VLLM_AS_VLLM=0.10.0``: ``--version`` says 0.10.0, and ``--uds`` (vLLM 0.10.1) and the multi-node
    flags (0.11.1) are unknown to it, exactly as to the real 0.10.0: usage, ``error: unrecognized arguments``,
    exit status 2, nothing served. Flags 0.10.0 has are still read."""
    old = {"FAKE_VLLM_AS_VLLM": "0.10.0"}
    said = _serve(["--version"], old)
    assert (said.returncode, said.stdout) == (0, "0.10.0\n")
    sock = tmp_path / "s.sock"
    refused = _serve(["serve", "m", "--uds", str(sock)], old)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.endswith(f"vllm serve: error: unrecognized arguments: --uds {sock}\n"), refused.stderr
    assert refused.stderr.startswith("usage: vllm serve")
    assert not sock.exists()
    multi = _serve(["serve", "m", "--nnodes", "2", "--node-rank", "1", "--headless"], old)
    assert multi.returncode == 2
    assert "error: unrecognized arguments: --nnodes 2 --node-rank 1" in multi.stderr
    settings = parse_serve_args(["m", "--data-parallel-size", "2", "--data-parallel-start-rank", "0"], old)
    assert settings.data_parallel_size == 2 and settings.uds is None and settings.group is None


def test_by_default_it_has_every_flag_ddslurm_renders(tmp_path: Path) -> None:
    args = ["m", "--uds", str(tmp_path / "s.sock"), "--nnodes", "1", "--node-rank", "0", "--master-addr", "h",
            "--master-port", "1", "--data-parallel-size-local", "1", "--data-parallel-address", "h",
            "--data-parallel-rpc-port", "2", "--data-parallel-start-rank", "0"]  # fmt: skip
    assert parse_serve_args(args, {}).uds == tmp_path / "s.sock"
    assert parse_serve_args(args, {"FAKE_VLLM_AS_VLLM": "0.11.1"}).uds == tmp_path / "s.sock"
    with pytest.raises(SystemExit) as refused:
        parse_serve_args(args, {"FAKE_VLLM_AS_VLLM": "0.11.0"})
    assert refused.value.code == 2
