"""A two-stage run's attempts: the GPU stage in the shard's ``stage-0/``, the CPU stage reading the GPU stage's
verified winner as its one seed file, claims per stage, and the stage recipes Data Designer gets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    Resources,
    RunLayout,
    SnapshotModel,
    StagePlan,
    WinnerRecord,
    atomic_write,
    encode,
    read_json,
)
from ddslurm.runtime import EXIT_FAILED, EXIT_OK, AttemptRunner, EngineRequest, EngineResult, Inputs, load_inputs
from ddslurm.runtime._inputs import stage_inputs
from ddslurm.runtime._workers import ClaimPool
from ddslurm.runtime.testing import attempt_runner, write_run

SECRET = "sk-stage-test-secret-value"
RECIPE = (
    b"data_designer:\n  columns:\n"
    b"  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a]}}\n"
    b"  - {name: draft, column_type: llm-text, model_alias: gen, prompt: 'Say {{ topic }}'}\n"
    b"  - {name: q, column_type: llm-text, model_alias: writer, prompt: 'Improve {{ draft }}'}\n"
    b"  model_configs: []\n"
)
STAGES = (StagePlan(kind="gpu", columns=("topic", "draft")), StagePlan(kind="cpu", columns=("q",)))


def _run(
    tmp_path: Path,
    shard_records: tuple[int, ...] = (3, 3),
    *,
    recipe: bytes = RECIPE,
    stages: tuple[StagePlan, ...] = STAGES,
) -> RunLayout:
    return write_run(
        tmp_path / "run-1",
        shard_records,
        recipe=recipe,
        models=(SnapshotModel(alias="writer", model="m", provider="p"),),
        stages=stages,
        stage_reason="two stages",
        client_workers=2,
    )


class StageEngine:
    """Writes one batch per request: the GPU stage's columns, or the seed file's rows with the CPU column added;
    like Data Designer, drops what the recipe's ``drop_columns`` processors name and, with
    ``preserve_dropped_columns``, writes those columns row for row to ``dropped-columns-parquet-files/``."""

    def __init__(self, drop: int | None = None) -> None:
        self.requests: list[EngineRequest] = []
        self.drop = drop
        """Row the first request's dataset lacks (Data Designer dropped the record)."""

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        section = request.recipe["data_designer"]
        names = [c["name"] for c in section["columns"]]
        seed = section.get("seed_config")
        if seed is None:
            table = pa.table(
                {"topic": ["a"] * request.num_records, "draft": [f"d{i}" for i in range(request.num_records)]}
            )
        else:
            table = pq.read_table(seed["source"]["path"])
            table = table.append_column("q", pa.array([f"better {d}" for d in table.column("draft").to_pylist()]))
        assert all(n in table.column_names for n in names)
        if self.drop is not None and len(self.requests) == 1:
            table = pa.concat_tables([table.slice(0, self.drop), table.slice(self.drop + 1)])
        dataset = request.artifact_path / request.dataset_name
        (dataset / "parquet-files").mkdir(parents=True)
        processors = section.get("processors") or []
        dropped = [n for p in processors for n in p["column_names"] if n in table.column_names]
        if dropped and request.preserve_dropped_columns:
            (dataset / "dropped-columns-parquet-files").mkdir()
            pq.write_table(table.select(dropped), dataset / "dropped-columns-parquet-files" / "batch_00000.parquet")
        table = table.drop_columns(dropped)
        pq.write_table(table, dataset / "parquet-files" / "batch_00000.parquet")
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": table.num_rows}))
        return EngineResult(dataset_dir=dataset, rows=table.num_rows, requested=request.num_records)


def _runner(layout: RunLayout, engine: Any, stage: int | None) -> AttemptRunner:
    return attempt_runner(layout, engine, env={"T_KEY": SECRET}, scratch_home=layout.root / "dd", stage=stage)


def test_the_gpu_stage_runs_its_columns_and_publishes_into_stage_0(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    engine = StageEngine()
    assert _runner(layout, engine, 0).run(load_inputs(layout), 0, "100", "n1") == EXIT_OK
    section = engine.requests[0].recipe["data_designer"]
    assert [c["name"] for c in section["columns"]] == ["topic", "draft"]
    winner = read_json(layout.shard(0).stage(0).winner, WinnerRecord)
    assert winner.rows == 3 and winner.attempt == "attempt-100"
    assert (layout.shard(0).stage(0).attempts / "attempt-100" / "attempt.json").is_file()
    assert not layout.shard(0).winner.exists() and not layout.shard(0).attempts.exists()


def test_the_cpu_stage_reads_the_gpu_winner_once_and_publishes_the_final_winner(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 1, "100", "n1")
    engine = StageEngine()
    assert _runner(layout, engine, 1).run(stage_inputs(inputs, 1), 1, "200", "n3") == EXIT_OK
    request = engine.requests[0]
    section = request.recipe["data_designer"]
    assert [c["name"] for c in section["columns"]] == ["q"]
    seed_file = layout.shard(1).stage_seed("attempt-100")  # the shard's, one path for every CPU-stage attempt
    assert section["seed_config"]["source"]["path"] == str(seed_file)
    assert section["seed_config"]["sampling_strategy"] == "ordered" and request.num_records == 3
    assert pq.read_table(seed_file).column("draft").to_pylist() == ["d0", "d1", "d2"]
    assert pq.read_table(seed_file).column("_ddslurm_stage_row").to_pylist() == [0, 1, 2]
    final = read_json(layout.shard(1).winner, WinnerRecord)
    assert final.rows == 3 and final.attempt == "attempt-200"
    out = pq.read_table(Path(final.dataset_dir) / final.files[0].path)
    assert out.column("q").to_pylist() == ["better d0", "better d1", "better d2"]


def test_the_cpu_stage_refuses_a_gpu_result_that_changed_since_it_was_published(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 0, "100", "n1")
    first = read_json(layout.shard(0).stage(0).winner, WinnerRecord)
    pq.write_table(pa.table({"topic": ["a"], "draft": ["x"]}), Path(first.dataset_dir) / first.files[0].path)
    assert _runner(layout, StageEngine(), 1).run(stage_inputs(inputs, 1), 0, "200", "n3") == EXIT_FAILED
    record = read_json(layout.shard(0).attempt("attempt-200").record, AttemptRecord)
    assert record.reason == "inputs_invalid" and "changed since it was published" in (record.message or "")
    assert not layout.shard(0).winner.exists()


def test_a_cpu_stage_attempt_without_a_gpu_result_generates_nothing(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    engine = StageEngine()
    assert _runner(layout, engine, 1).begin(load_inputs(layout), 0, "200", "n3") is None
    record = read_json(layout.shard(0).attempt("attempt-200").record, AttemptRecord)
    assert (record.state, record.reason) == ("failed", "stage_missing") and not engine.requests


def test_a_gpu_stage_attempt_of_a_shard_with_a_final_winner_is_superseded(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 0, "100", "n1")
    _runner(layout, StageEngine(), 1).run(stage_inputs(inputs, 1), 0, "200", "n3")
    assert _runner(layout, StageEngine(), 0).begin(inputs, 0, "300", "n1") is None
    record = read_json(layout.shard(0).stage(0).attempt("attempt-300").record, AttemptRecord)
    assert (record.state, record.reason) == ("superseded", "winner_exists")


def test_the_cpu_stage_inputs_run_no_servers_and_cpu_stage_workers_clients_sharing_the_cpus(tmp_path: Path) -> None:
    inputs = load_inputs(_run(tmp_path))
    cpu = stage_inputs(inputs, 1).plan
    assert cpu.serving is None and cpu.client_workers == 1  # a plan from before cpu_stage_workers: one at a time
    sized = msgspec.structs.replace(
        inputs.plan, cpu_stage=Resources(time_minutes=10, cpus_per_task=8, gres="none"), cpu_stage_workers=3
    )
    cpu = stage_inputs(dataclasses.replace(inputs, plan=sized), 1).plan
    assert (cpu.serving, cpu.client_workers, cpu.client_cpus) == (None, 3, 8 // 3)
    assert stage_inputs(inputs, 0) is inputs and stage_inputs(inputs, None) is inputs
    with pytest.raises(ValueError, match="stage 1 does not exist"):
        stage_inputs(_one_stage(inputs), 1)


def _one_stage(inputs: Inputs) -> Inputs:
    return dataclasses.replace(inputs, plan=msgspec.structs.replace(inputs.plan, stages=()))


def _pool(layout: RunLayout, stage: int, array: str) -> ClaimPool:
    return ClaimPool(
        layout, range(3), array_job_id=array, task=0, job_id=array, node="n1", clock=lambda: "-", stage=stage
    )


def test_claims_follow_the_stages(tmp_path: Path) -> None:
    layout = _run(tmp_path, (2, 2, 2))
    inputs = load_inputs(layout)
    runner0 = _runner(layout, StageEngine(), 0)
    runner0.run(inputs, 0, "100", "n1")
    runner0.run(inputs, 1, "101", "n1")
    _runner(layout, StageEngine(), 1).run(stage_inputs(inputs, 1), 0, "200", "n3")
    # shard 0: both stages done; shard 1: GPU stage done; shard 2: nothing yet
    gpu = _pool(layout, 0, "300")
    assert [gpu.next(), gpu.next()] == [2, None]
    assert (layout.shard(2).stage(0).claims / "300.json").is_file()
    cpu = _pool(layout, 1, "400")
    assert [cpu.next(), cpu.next()] == [1, None]
    assert (layout.shard(1).claims / "400.json").is_file()


def test_a_cpu_stage_fill_reads_exactly_the_gpu_rows_whose_records_were_dropped(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 0, "100", "n1")
    engine = StageEngine(drop=1)
    assert _runner(layout, engine, 1).run(stage_inputs(inputs, 1), 0, "200", "n3") == EXIT_OK
    fill = engine.requests[1]
    fill_seed = pq.read_table(fill.recipe["data_designer"]["seed_config"]["source"]["path"])
    assert fill.num_records == 1 and fill_seed.column("draft").to_pylist() == ["d1"]
    final = read_json(layout.shard(0).winner, WinnerRecord)
    rows = pa.concat_tables([pq.read_table(Path(final.dataset_dir) / f.path) for f in final.files])
    assert final.rows == 3 and sorted(rows.column("q").to_pylist()) == ["better d0", "better d1", "better d2"]


DROPPED_DRAFT_RECIPE = RECIPE.replace(b"prompt: 'Say {{ topic }}'}", b"prompt: 'Say {{ topic }}', drop: true}")
DROPPED_DRAFT_STAGES = (
    StagePlan(kind="gpu", columns=("topic", "draft"), keep=("draft",)),
    StagePlan(kind="cpu", columns=("q",)),
)


@pytest.mark.parametrize("dropped", [0, 1, 2])
def test_a_cpu_stage_fill_regenerates_the_dropped_row_when_the_kept_columns_do_not_identify_it(
    tmp_path: Path, dropped: int
) -> None:
    """Every GPU-stage row has topic 'a' and its draft is dropped from the final dataset: only the row numbers of
    the CPU stage's seed file say which draft a dropped record had."""
    layout = _run(tmp_path, recipe=DROPPED_DRAFT_RECIPE, stages=DROPPED_DRAFT_STAGES)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 0, "100", "n1")
    engine = StageEngine(drop=dropped)
    assert _runner(layout, engine, 1).run(stage_inputs(inputs, 1), 0, "200", "n3") == EXIT_OK
    assert all(r.preserve_dropped_columns for r in engine.requests)
    fill_seed = pq.read_table(engine.requests[1].recipe["data_designer"]["seed_config"]["source"]["path"])
    assert fill_seed.column("draft").to_pylist() == [f"d{dropped}"]
    final = read_json(layout.shard(0).winner, WinnerRecord)
    rows = pa.concat_tables([pq.read_table(Path(final.dataset_dir) / f.path) for f in final.files])
    assert sorted(rows.column_names) == ["q", "topic"]
    assert final.rows == 3 and sorted(rows.column("q").to_pylist()) == ["better d0", "better d1", "better d2"]


def test_a_cpu_stage_fill_is_skipped_when_a_batch_lost_its_row_numbers(tmp_path: Path) -> None:
    layout = _run(tmp_path, recipe=DROPPED_DRAFT_RECIPE, stages=DROPPED_DRAFT_STAGES)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 0, "100", "n1")

    class Forgetful(StageEngine):
        def __call__(self, request: EngineRequest) -> EngineResult:
            result = super().__call__(request)
            for f in (result.dataset_dir / "dropped-columns-parquet-files").glob("*.parquet"):
                f.unlink()
            return result

    engine = Forgetful(drop=1)
    assert _runner(layout, engine, 1).run(stage_inputs(inputs, 1), 0, "200", "n3") == 3  # partial, not guessed
    assert len(engine.requests) == 1 and not layout.shard(0).winner.exists()


def test_the_cpu_stage_of_an_accepted_partial_gpu_stage_is_partial(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    _runner(layout, StageEngine(), 0).run(inputs, 0, "100", "n1")
    gpu = layout.shard(0).stage(0).winner
    accepted = msgspec.structs.replace(read_json(gpu, WinnerRecord), partial=True)
    gpu.unlink()
    atomic_write(gpu, encode(accepted))
    assert _runner(layout, StageEngine(), 1).run(stage_inputs(inputs, 1), 0, "200", "n3") == EXIT_OK
    final = read_json(layout.shard(0).winner, WinnerRecord)
    assert final.rows == 3 and final.partial
