"""One attempt of one shard, with a stand-in engine (the real engine is exercised in the end-to-end tests)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    Plan,
    ProviderSnapshot,
    Resources,
    RunLayout,
    ShardSpec,
    SnapshotModel,
    SnapshotProvider,
    WinnerRecord,
    atomic_write,
    encode,
    encode_pretty,
    read_json,
    sha256_bytes,
)
from ddslurm.runtime import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    AttemptRunner,
    EngineError,
    EngineRequest,
    EngineResult,
    InputsError,
    load_inputs,
    recipe_with_models,
)
from ddslurm.runtime._log import new_logger

SECRET = "sk-attempt-test-secret-value"
RECIPE = b"data_designer:\n  columns:\n  - {name: x, column_type: sampler}\n  model_configs: []\n"


def _run(tmp_path: Path, *, shard_records: tuple[int, ...] = (4, 4)) -> RunLayout:
    layout = RunLayout(tmp_path / "run-1")
    layout.inputs.mkdir(parents=True)
    snapshot = ProviderSnapshot(
        providers=(SnapshotProvider(name="p", endpoint="http://127.0.0.1:9/v1", api_key_env="T_KEY"),),
        models=(SnapshotModel(alias="gen", model="m", provider="p", inference_parameters={"temperature": 0.5}),),
    )
    snap_bytes = encode_pretty(snapshot)
    atomic_write(layout.recipe, RECIPE)
    atomic_write(layout.snapshot, snap_bytes)
    shards, first = [], 0
    for i, n in enumerate(shard_records):
        shards.append(ShardSpec(index=i, first_record=first, num_records=n))
        first += n
    res = Resources(time_minutes=5)
    plan = Plan(
        run_id="run-1",
        run_name="t",
        num_records=first,
        shards=tuple(shards),
        resume="never",
        buffer_size=2,
        recipe_file=str(layout.recipe),
        recipe_sha256=sha256_bytes(RECIPE),
        snapshot_file=str(layout.snapshot),
        snapshot_sha256=sha256_bytes(snap_bytes),
        secret_env=("T_KEY",),
        python_env="/x",
        generation=res,
        collection=res,
    )
    atomic_write(layout.plan, encode(plan))
    return layout


class FakeEngine:
    """Writes Data Designer's output layout: <artifact>/<dataset>/parquet-files/batch_*.parquet + metadata."""

    def __init__(self, *, rows: int | None = None, fail: Exception | None = None, leak: str | None = None) -> None:
        self.rows, self.fail, self.leak = rows, fail, leak
        self.requests: list[EngineRequest] = []

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        rows = request.num_records if self.rows is None else self.rows
        dataset = request.artifact_path / request.dataset_name
        (dataset / "parquet-files").mkdir(parents=True)
        pq.write_table(pa.table({"x": list(range(rows))}), dataset / "parquet-files" / "batch_00000.parquet")
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": rows}))
        if self.leak:
            (dataset / "debug.log").write_text(f"Authorization: Bearer {self.leak}\n")
        if request.on_batch_complete:
            request.on_batch_complete(dataset / "parquet-files" / "batch_00000.parquet")
        return EngineResult(dataset_dir=dataset, rows=rows, requested=request.num_records)


def _runner(layout: RunLayout, engine: Any, env: dict[str, str] | None = None) -> AttemptRunner:
    return AttemptRunner(
        layout,
        engine=engine,
        env={"T_KEY": SECRET} if env is None else env,
        scratch_home=layout.root / "dd",
        make_logger=lambda stream: new_logger(stream, io.BytesIO()),
    )


def test_attempt_publishes_winner_with_verified_files(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    engine = FakeEngine()
    assert _runner(layout, engine).run(load_inputs(layout), 1, "101", "n1") == EXIT_OK
    winner = read_json(layout.shard(1).winner, WinnerRecord)
    assert (winner.shard, winner.rows, winner.attempt) == (1, 4, "attempt-101")
    assert [f.path for f in winner.files] == ["parquet-files/batch_00000.parquet"]
    record = read_json(layout.shard(1).attempt("attempt-101").record, AttemptRecord)
    assert record.state == "succeeded" and record.rows == 4 and record.ended_at
    dataset = Path(winner.dataset_dir)
    assert dataset.stat().st_mode & 0o077 == 0
    assert engine.requests[0].num_records == 4 and engine.requests[0].dataset_name == "shard-00001"
    log = layout.shard(1).attempt("attempt-101").client_log.read_text().splitlines()
    assert [json.loads(line)["event"] for line in log][-1] == "attempt.published"


def test_second_attempt_after_winner_is_superseded_and_runs_nothing(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    assert _runner(layout, FakeEngine()).run(inputs, 0, "1", "n1") == EXIT_OK
    late = FakeEngine()
    assert _runner(layout, late).run(inputs, 0, "2", "n2") == EXIT_OK
    assert late.requests == []
    assert read_json(layout.shard(0).attempt("attempt-2").record, AttemptRecord).state == "superseded"
    assert read_json(layout.shard(0).winner, WinnerRecord).attempt == "attempt-1"


def test_racing_attempts_publish_exactly_one_winner(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    barrier = threading.Barrier(4)

    class Racing(FakeEngine):
        def __call__(self, request: EngineRequest) -> EngineResult:
            result = super().__call__(request)
            barrier.wait(timeout=10)  # everyone has a candidate before anyone publishes
            return result

    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda j=j: codes.append(_runner(layout, Racing()).run(inputs, 0, str(j), "n")))
        for j in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    states = sorted(read_json(layout.shard(0).attempt(f"attempt-{j}").record, AttemptRecord).state for j in range(4))
    assert codes == [EXIT_OK] * 4
    assert states == ["succeeded", "superseded", "superseded", "superseded"]
    winner = read_json(layout.shard(0).winner, WinnerRecord)
    assert read_json(layout.shard(0).attempt(winner.attempt).record, AttemptRecord).state == "succeeded"


def test_short_shard_is_partial_not_a_winner(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    assert _runner(layout, FakeEngine(rows=3)).run(load_inputs(layout), 0, "7", "n") == EXIT_PARTIAL
    assert not layout.shard(0).winner.exists()
    record = read_json(layout.shard(0).attempt("attempt-7").record, AttemptRecord)
    assert (record.state, record.rows, record.reason) == ("partial", 3, "rows_dropped")


@pytest.mark.parametrize(
    ("engine", "env", "reason"),
    [
        pytest.param(FakeEngine(), {}, "secret_missing", id="key-variable-unset"),
        pytest.param(FakeEngine(fail=EngineError("boom", retryable=True)), None, "generation_failed", id="engine"),
        pytest.param(FakeEngine(leak=SECRET), None, "output_invalid", id="secret-in-output"),
    ],
)
def test_failures_record_a_reason_and_publish_nothing(
    tmp_path: Path, engine: FakeEngine, env: dict[str, str] | None, reason: str
) -> None:
    layout = _run(tmp_path)
    assert _runner(layout, engine, env).run(load_inputs(layout), 0, "9", "n") == EXIT_FAILED
    assert not layout.shard(0).winner.exists()
    record = read_json(layout.shard(0).attempt("attempt-9").record, AttemptRecord)
    assert record.state == "failed" and record.reason == reason and record.message
    assert SECRET not in record.message


def test_modified_inputs_are_refused(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    layout.snapshot.write_bytes(layout.snapshot.read_bytes().replace(b"T_KEY", b"X_KEY"))
    with pytest.raises(InputsError, match="sha256 differs"):
        load_inputs(layout)


def test_unknown_shard_is_refused(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    with pytest.raises(InputsError, match="shard 5 does not exist"):
        _runner(layout, FakeEngine()).run(load_inputs(layout), 5, "1", "n")


def test_recipe_models_replaced_by_snapshot_keeping_params() -> None:
    snapshot = ProviderSnapshot(
        providers=(),
        models=(SnapshotModel(alias="a", model="m", provider="p", inference_parameters={"top_p": 0.9}),),
    )
    recipe = {"data_designer": {"columns": [], "model_configs": [{"alias": "old", "model": "x", "provider": "y"}]}}
    out = recipe_with_models(recipe, snapshot)
    assert out["data_designer"]["model_configs"] == [
        {
            "alias": "a",
            "model": "m",
            "provider": "p",
            "inference_parameters": {"top_p": 0.9},
            "skip_health_check": False,
        }
    ]
    assert recipe["data_designer"]["model_configs"][0]["alias"] == "old"


def test_each_shard_gets_its_own_block_of_the_seed() -> None:
    from ddslurm.runtime import partition_seed

    recipe = {"data_designer": {"seed_config": {"source": {"path": "x"}, "selection_strategy": None}}}
    out = partition_seed(recipe, 2, 4)
    assert out["data_designer"]["seed_config"]["selection_strategy"] == {"index": 2, "num_partitions": 4}
    assert recipe["data_designer"]["seed_config"]["selection_strategy"] is None
    assert partition_seed(recipe, 0, 1) is recipe  # one shard: the whole seed
    chosen = {"data_designer": {"seed_config": {"selection_strategy": {"start": 0, "end": 3}}}}
    assert partition_seed(chosen, 1, 2) is chosen  # the recipe's own selection wins
