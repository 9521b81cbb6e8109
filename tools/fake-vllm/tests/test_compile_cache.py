"""vLLM's torch.compile cache in the stand-in (``--fake-compile-cache``): where it is (``VLLM_CACHE_ROOT``,
``XDG_CACHE_HOME``), what names it, and the key among its factors before vllm-project/vllm#52523."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_vllm.compile_cache import cache_root, env_factors
from fake_vllm.testing import start_server


def _serve_twice(tmp_path: Path, mode: str) -> tuple[list[Path], list[str]]:
    """Two servers one after the other, each with its own key (as two allocations), the same cache root."""
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "cache"), "FAKE_VLLM_COMPILE_CACHE": mode}
    logs = []
    for key in ("first-key-0123456789abcdef", "second-key-0123456789abcdef"):
        with start_server(env=env, api_key=key) as server:
            logs.append(server.log_text())
    dirs = sorted((tmp_path / "cache" / "torch_compile_cache").iterdir())
    return dirs, logs


def test_a_vllm_before_the_fix_hashes_the_key_and_never_hits(tmp_path: Path) -> None:
    dirs, logs = _serve_twice(tmp_path, "old")
    assert len(dirs) == 2  # one directory per key: the second server compiled again
    assert all("Compiling a graph" in log and "Directly load" not in log for log in logs)
    factors = [json.loads((d / "cache_key_factors.json").read_text())["env"] for d in dirs]
    assert sorted(f["VLLM_API_KEY"] for f in factors) == ["first-key-0123456789abcdef", "second-key-0123456789abcdef"]


def test_a_fixed_vllm_reuses_its_cache_whatever_the_key(tmp_path: Path) -> None:
    dirs, logs = _serve_twice(tmp_path, "fixed")
    assert len(dirs) == 1
    assert "Compiling a graph" in logs[0] and "Directly load the compiled graph(s)" in logs[1]
    assert "key" not in json.dumps(json.loads((dirs[0] / "cache_key_factors.json").read_text())["env"]).lower()


def test_off_writes_nothing(tmp_path: Path) -> None:
    with start_server(env={"VLLM_CACHE_ROOT": str(tmp_path / "cache")}, api_key="k") as server:
        assert "torch.compile" not in server.log_text()
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("environ", "want"),
    [
        ({"VLLM_CACHE_ROOT": "/c/v", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/c/v"),
        ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/vllm"),
        ({"HOME": "/h"}, "/h/.cache/vllm"),
    ],
)
def test_the_cache_root_is_where_vllm_reads_it(environ: dict[str, str], want: str) -> None:
    assert cache_root(environ) == Path(want)


def test_ignored_variables_are_no_factors() -> None:
    environ = {"VLLM_API_KEY": "k", "VLLM_CACHE_ROOT": "/c", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "HOME": "/h"}
    assert env_factors(environ, "old") == {"VLLM_API_KEY": "k", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
    assert env_factors(environ, "fixed") == {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
