"""End to end: the real Data Designer engine (0.9.7) generates a small dataset against fake-vllm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fake_vllm.testing import EngineName, child_environment, start_server

SCRIPT = Path(__file__).with_name("dd_e2e_script.py")
NUM_RECORDS = 10


@pytest.mark.dd
def test_data_designer_generates_all_records_with_valid_judge_scores(tmp_path: Path) -> None:
    pytest.importorskip("data_designer")
    key = "e2e-secret-key"
    request_log = tmp_path / "requests.jsonl"
    args = ["--served-model-name", "served", "--fake-latency", "0.01", "--fake-request-log", str(request_log)]
    with start_server("org/weights", api_key=key, args=args) as server:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), server.base_url, "served", str(tmp_path / "dd"), str(NUM_RECORDS), "E2E_KEY"],
            env=child_environment({"E2E_KEY": key, "HOME": str(tmp_path / "home")}),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    records = result["records"]
    assert len(records) == NUM_RECORDS
    assert set(result["columns"]) == {"topic", "answer", "quality", "answer_chars"}
    for record in records:
        assert record["topic"] in ("astronomy", "cooking", "gardening")
        assert isinstance(record["answer"], str) and record["answer"]
        assert record["answer_chars"] == len(record["answer"])
        assert record["quality"]["Relevance"]["score"] in (1, 2, 3)
        assert record["quality"]["Tone"]["score"] in ("Poor", "Good")
        assert record["quality"]["Relevance"]["reasoning"]
    assert result["remote_hosts"] == []
    entries = [json.loads(line) for line in request_log.read_text().splitlines()]
    chats = [e for e in entries if e["path"] == "/v1/chat/completions"]
    # One health-check probe plus a text and a judge call per record, all authorized, none failed.
    assert len(chats) == 1 + 2 * NUM_RECORDS
    assert all(e["status"] == 200 and e["authorized"] and e["model"] == "served" for e in chats)
    assert key not in request_log.read_text()


def _generate(tmp_path: Path, engine: EngineName, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Data Designer against the stand-in in ``engine``'s mode: its records and the chat requests it made."""
    key = f"{engine}-e2e-secret-key"
    request_log = tmp_path / f"{name}-requests.jsonl"
    args = ["--served-model-name", "served", "--fake-latency", "0.01", "--fake-request-log", str(request_log)]
    with start_server("org/weights", api_key=key, args=args, engine=engine) as server:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), server.base_url, "served", str(tmp_path / name), str(NUM_RECORDS), "E2E_KEY"],
            env=child_environment({"E2E_KEY": key, "HOME": str(tmp_path / "home")}),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-6000:]
    entries = [json.loads(line) for line in request_log.read_text().splitlines()]
    assert key not in request_log.read_text()
    records: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])["records"]
    return records, [e for e in entries if e["path"] == "/v1/chat/completions"]


@pytest.mark.dd
def test_data_designer_through_the_sglang_mode_gets_the_same_rows(tmp_path: Path) -> None:
    """SGLang's API (its key on every route but /health and /metrics) gives Data Designer the very rows vLLM's
    does: a record's answer and judgement depend on its topic only."""
    pytest.importorskip("data_designer")
    sglang, sglang_chats = _generate(tmp_path, "sglang", "sglang")
    vllm, _ = _generate(tmp_path, "vllm", "vllm")
    assert len(sglang) == NUM_RECORDS
    assert all(e["status"] == 200 and e["authorized"] for e in sglang_chats)
    by_topic = {r["topic"]: (r["answer"], r["quality"]) for r in vllm}
    shared = [r for r in sglang if r["topic"] in by_topic]
    assert shared, "the two runs drew no common topic"
    for record in shared:
        assert (record["answer"], record["quality"]) == by_topic[record["topic"]]
