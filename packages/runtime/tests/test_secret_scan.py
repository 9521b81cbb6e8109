"""The node's secret scan before a winner is published: every file under the attempt's directory and its pulling
allocation's directory, read in full, Parquet values decoded, links not followed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, WinnerRecord, read_json
from ddslurm.runtime import (
    EXIT_FAILED,
    EXIT_OK,
    EngineRequest,
    EngineResult,
    _verify,
    load_inputs,
    scan_for_secrets,
)
from ddslurm.runtime.testing import attempt_runner, write_run

SECRET = "sk-scan-test-4f9a1c7e2b6d8035"
OTHER = "sk-another-secret-value-91b3"


def _sparse(path: Path, offset: int, data: bytes) -> Path:
    """A file of ``offset`` zero bytes (a hole: nothing written) followed by ``data``."""
    with path.open("wb") as fh:
        fh.seek(offset)
        fh.write(data)
    return path


def test_a_secret_after_the_first_64_mib_of_a_text_file_is_found(tmp_path: Path) -> None:
    log = _sparse(tmp_path / "server.log", (64 << 20) + 10, f"Authorization: Bearer {SECRET}\n".encode())
    assert scan_for_secrets([tmp_path], [SECRET]) == [log]


@pytest.mark.parametrize("chunks", [1, 8], ids=["first-boundary", "64-mib"])
@pytest.mark.parametrize("before", [1, 14, len(SECRET) - 1])
def test_a_secret_split_across_a_chunk_boundary_is_found(tmp_path: Path, chunks: int, before: int) -> None:
    """``before`` bytes of the value end one read, the rest starts the next."""
    out = _sparse(tmp_path / "client.out", chunks * _verify._CHUNK - before, SECRET.encode())
    assert scan_for_secrets([tmp_path], [OTHER, SECRET]) == [out]


def test_every_file_is_read_whatever_its_name(tmp_path: Path) -> None:
    (tmp_path / "core.dump").write_bytes(b"\x00\x01" + SECRET.encode() + b"\xff")
    (tmp_path / "clean.bin").write_bytes(b"\x00" * 100)
    assert scan_for_secrets([tmp_path], [SECRET]) == [tmp_path / "core.dump"]


def _hidden(column: pa.Array, path: Path) -> Path:
    """Write ``column`` as a snappy Parquet file whose bytes do not hold the secret (its two halves come first, so
    the compressor copies them into the full value; no statistics) — only a decoded value shows it."""
    pq.write_table(pa.table({"answer": column}), path, compression="snappy", write_statistics=False)
    assert SECRET.encode() not in path.read_bytes()
    return path


HALVES = [SECRET[:14] + "|", "|" + SECRET[14:]]


def test_a_secret_in_a_compressed_parquet_string_column_is_found(tmp_path: Path) -> None:
    batches = tmp_path / "dataset" / "parquet-files"
    batches.mkdir(parents=True)
    leaked = _hidden(pa.array([*HALVES, f"the key is {SECRET}"]), batches / "batch_00000.parquet")
    _hidden(pa.array([*HALVES, "nothing to see"]), batches / "batch_00001.parquet")
    assert scan_for_secrets([tmp_path], [SECRET]) == [leaked]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.large_binary()], ids=str)
def test_a_secret_in_a_nested_list_of_structs_column_is_found(tmp_path: Path, kind: pa.DataType) -> None:
    nested = pa.list_(pa.struct([("n", pa.int64()), ("text", kind)]))
    rows = [[{"n": 1, "text": h}] for h in HALVES] + [[{"n": 2, "text": None}, {"n": 3, "text": f"k={SECRET}"}]]
    if kind == pa.large_binary():
        rows = [[{**e, "text": e["text"] and e["text"].encode()} for e in row] for row in rows]
    leaked = _hidden(pa.array(rows, nested), tmp_path / "fill.parquet")
    assert scan_for_secrets([tmp_path], [SECRET]) == [leaked]


def test_a_secret_in_a_dictionary_encoded_parquet_column_is_found(tmp_path: Path) -> None:
    column = pa.array([*HALVES, SECRET, SECRET]).dictionary_encode()
    leaked = _hidden(column, tmp_path / "dict.parquet")
    assert scan_for_secrets([tmp_path], [SECRET]) == [leaked]


def test_a_damaged_parquet_file_is_still_read_as_bytes(tmp_path: Path) -> None:
    (tmp_path / "torn.parquet").write_bytes(b"PAR1" + SECRET.encode())
    (tmp_path / "torn-clean.parquet").write_bytes(b"PAR1\x00\x00")
    assert scan_for_secrets([tmp_path], [SECRET]) == [tmp_path / "torn.parquet"]


def test_links_are_not_followed_and_each_root_is_scanned(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "leak.log").write_text(SECRET)
    attempt, allocation = tmp_path / "attempt", tmp_path / "allocation"
    attempt.mkdir()
    allocation.mkdir()
    (attempt / "to-file.log").symlink_to(outside / "leak.log")
    (attempt / "to-dir").symlink_to(outside, target_is_directory=True)
    assert scan_for_secrets([attempt], [SECRET]) == []
    server = _sparse(allocation / "vllm-0.log", (64 << 20) + 10, SECRET.encode())
    assert scan_for_secrets([attempt, allocation, tmp_path / "missing"], [SECRET]) == [server]


def test_a_named_pipe_does_not_stop_the_scan(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.log")
    (tmp_path / "z.log").write_text(SECRET)
    found: list[list[Path]] = []
    scan = threading.Thread(target=lambda: found.append(scan_for_secrets([tmp_path], [SECRET])), daemon=True)
    scan.start()
    scan.join(timeout=10)
    assert found == [[tmp_path / "z.log"]]


def test_no_values_scan_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text(SECRET)
    assert scan_for_secrets([tmp_path], ["", ""]) == []


# --- the attempt runner: a pulling attempt's allocation directory is scanned before the winner is published ---


class Engine:
    def __call__(self, request: EngineRequest) -> EngineResult:
        dataset = request.artifact_path / request.dataset_name
        (dataset / "parquet-files").mkdir(parents=True)
        pq.write_table(pa.table({"x": list(range(request.num_records))}), dataset / "parquet-files" / "b.parquet")
        return EngineResult(dataset_dir=dataset, rows=request.num_records, requested=request.num_records)


@pytest.mark.parametrize("leaked", [True, False], ids=["leak-in-server-log", "clean"])
def test_a_pulling_attempt_scans_its_allocations_server_and_proxy_logs(tmp_path: Path, leaked: bool) -> None:
    layout = write_run(tmp_path / "run-1")
    allocation = layout.allocation("77")
    allocation.mkdir(parents=True)
    (allocation / "proxy-0.log").write_text("GET /v1/models 200\n")
    server = _sparse(allocation / "vllm-0.log", (64 << 20) + 10, (SECRET if leaked else "no key").encode())
    runner = attempt_runner(layout, Engine(), env={"T_KEY": SECRET}, scratch_home=layout.root / "dd")
    inputs = load_inputs(layout)
    began = runner.begin(inputs, 0, "77", "n1", allocation=str(allocation))
    assert began is not None
    code = runner.generate(inputs, began, {})
    record = read_json(began.layout.record, AttemptRecord)
    if leaked:
        assert code == EXIT_FAILED and not layout.shard(0).winner.exists()
        assert record.reason == "output_invalid" and str(server) in (record.message or "")
        assert SECRET not in (record.message or "")
    else:
        assert code == EXIT_OK and read_json(layout.shard(0).winner, WinnerRecord).rows == 4
