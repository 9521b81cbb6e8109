"""Empty or null LLM outputs (an endpoint that answered HTTP 200 without ``choices``) fail the attempt with
``empty_outputs`` instead of being published, and the next generation starts the shard again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    ProviderSnapshot,
    RunLayout,
    WinnerRecord,
    llm_columns,
    make_private_dir,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.runtime import EXIT_FAILED, EXIT_OK, AttemptRunner, EngineError, EngineRequest, EngineResult, Inputs
from ddslurm.runtime._resume import EmptyLimit, continued_files
from ddslurm.runtime._verify import count_empty_outputs, reject_empty_outputs
from ddslurm.runtime.errors import EmptyOutputsError
from ddslurm.runtime.testing import attempt_runner

RECIPE: dict[str, Any] = {
    "data_designer": {
        "columns": [
            {"name": "topic", "column_type": "sampler"},
            {"name": "answer", "column_type": "llm-text", "model_alias": "gen"},
            {"name": "sql", "column_type": "llm-code", "model_alias": "gen"},
            {"name": "facts", "column_type": "llm-structured", "model_alias": "gen"},
            {"name": "quality", "column_type": "llm-judge", "model_alias": "gen"},
            {"name": "notes", "column_type": "llm-text", "model_alias": "gen", "drop": True},
            {"name": "chars", "column_type": "expression"},
        ]
    }
}
GOOD = {"answer": "a", "sql": "SELECT 1", "facts": {"k": "v"}, "quality": {"Score": {"score": 2}}, "notes": "n"}


def _write_dataset(dataset: Path, rows: list[dict[str, Any]], batch: int = 2) -> None:
    """Data Designer's layout: parquet-files/batch_*.parquet (dropped columns apart) and metadata.json."""
    (dataset / "parquet-files").mkdir(parents=True)
    (dataset / "dropped-columns-parquet-files").mkdir()
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        kept = [{k: v for k, v in r.items() if k != "notes"} | {"topic": "t", "chars": 1} for r in chunk]
        pq.write_table(pa.Table.from_pylist(kept), dataset / "parquet-files" / f"batch_{i // batch:05d}.parquet")
        dropped = pa.Table.from_pylist([{"notes": r["notes"]} for r in chunk])
        pq.write_table(dropped, dataset / "dropped-columns-parquet-files" / f"batch_{i // batch:05d}.parquet")
    meta = {"actual_num_records": len(rows), "target_num_records": len(rows), "buffer_size": batch}
    (dataset / "metadata.json").write_text(json.dumps(meta))


def test_llm_columns_are_read_from_the_recipe() -> None:
    assert llm_columns(RECIPE) == ("answer", "sql", "facts", "quality", "notes")
    assert llm_columns(RECIPE["data_designer"]) == ("answer", "sql", "facts", "quality", "notes")  # shorthand
    assert llm_columns({"data_designer": {"columns": None}}) == ()


def test_empty_and_null_values_are_counted_per_column(tmp_path: Path) -> None:
    rows = [
        GOOD,
        {**GOOD, "answer": ""},  # what Data Designer stores for a 200 answer without choices
        {**GOOD, "answer": "  \n", "sql": None},
        {**GOOD, "quality": None, "notes": ""},
        {**GOOD, "facts": None},
    ]
    _write_dataset(tmp_path / "d", rows)
    counts = count_empty_outputs(tmp_path / "d", llm_columns(RECIPE))
    assert counts == {"answer": 2, "sql": 1, "facts": 1, "quality": 1, "notes": 1}
    assert count_empty_outputs(tmp_path / "d", ("missing",)) == {}


def test_above_the_limit_the_dataset_is_set_aside_with_counts_in_the_message(tmp_path: Path) -> None:
    _write_dataset(tmp_path / "shard-00000", [GOOD, {**GOOD, "sql": ""}, {**GOOD, "sql": ""}, {**GOOD, "answer": ""}])
    assert reject_empty_outputs(tmp_path / "shard-00000", RECIPE, None, 4) == {}
    assert reject_empty_outputs(tmp_path / "shard-00000", RECIPE, 2, 4)["sql"] == 2
    with pytest.raises(EmptyOutputsError) as failure:
        reject_empty_outputs(tmp_path / "shard-00000", RECIPE, 1, 4)
    assert failure.value.reason == "empty_outputs" and failure.value.retryable
    assert failure.value.counts == {"sql": 2}
    assert "answer: 1 of 4, sql: 2 of 4" in failure.value.message and "max_empty_outputs: 1" in failure.value.message
    assert not (tmp_path / "shard-00000").exists()
    [aside] = tmp_path.glob("rejected-shard-00000-*")
    assert len(list((aside / "parquet-files").glob("*.parquet"))) == 2  # kept, only renamed


class EmptyingEngine:
    """Writes the dataset Data Designer would write, with ``empty`` rows whose LLM text is ''."""

    def __init__(self, empty: int) -> None:
        self.empty = empty
        self.requests: list[EngineRequest] = []

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        dataset = request.artifact_path / request.dataset_name
        if request.resume:
            # A resumed dataset keeps its batches: Data Designer would find it complete and add nothing.
            rows = read_json(dataset / "metadata.json", dict[str, int])["actual_num_records"]
            return EngineResult(dataset_dir=dataset, rows=rows, requested=request.num_records)
        n = request.num_records
        _write_dataset(dataset, [{**GOOD, "answer": ""} if i < self.empty else GOOD for i in range(n)])
        return EngineResult(dataset_dir=dataset, rows=n, requested=n)


def _setup(tmp_path: Path, **plan: Any) -> tuple[RunLayout, Inputs]:
    layout = RunLayout(tmp_path / "run-1")
    make_private_dir(layout.root)
    inputs = Inputs(
        plan=make_plan("run-1", (6,), resume="if_possible", **plan),
        plan_sha256="-",
        recipe=RECIPE,
        snapshot=ProviderSnapshot(),
    )
    return layout, inputs


def _runner(layout: RunLayout, engine: Any) -> AttemptRunner:
    return attempt_runner(layout, engine, scratch_home=layout.root)


def test_empty_outputs_fail_the_attempt_and_a_retry_regenerates_the_shard(tmp_path: Path) -> None:
    layout, inputs = _setup(tmp_path)
    shard = layout.shard(0)
    assert _runner(layout, EmptyingEngine(empty=2)).run(inputs, 0, "11", "n1") == EXIT_FAILED
    record = read_json(shard.attempt("attempt-11").record, AttemptRecord)
    assert (record.state, record.reason, record.retryable) == ("failed", "empty_outputs", True)
    assert "answer: 2 of 6" in (record.message or "")
    assert not shard.winner.exists()

    # The in-allocation rerun (client_retries) does not resume the rejected dataset: it starts afresh.
    rerun = EmptyingEngine(empty=0)
    runner = _runner(layout, rerun)
    began = runner.resume(0, "attempt-11")
    runner.rerun(began)
    assert runner.generate(inputs, began, {}, resume_own=True) == EXIT_OK
    assert rerun.requests[0].resume is False
    winner = read_json(shard.winner, WinnerRecord)
    assert winner.rows == 6 and winner.attempt == "attempt-11"
    table = pq.read_table(Path(winner.dataset_dir) / "parquet-files")
    assert table.num_rows == 6 and "" not in table.column("answer").to_pylist()


def test_a_retry_after_empty_outputs_does_not_resume_the_rejected_batches(tmp_path: Path) -> None:
    layout, inputs = _setup(tmp_path)
    assert _runner(layout, EmptyingEngine(empty=1)).run(inputs, 0, "21", "n1") == EXIT_FAILED
    retry = EmptyingEngine(empty=0)
    assert _runner(layout, retry).run(inputs, 0, "22", "n1") == EXIT_OK
    assert retry.requests[0].resume is False
    record = read_json(layout.shard(0).attempt("attempt-22").record, AttemptRecord)
    assert record.state == "succeeded" and record.resumed_from is None and record.rows == 6


@pytest.mark.parametrize(("limit", "state"), [(None, "succeeded"), (3, "succeeded"), (2, "failed")])
def test_the_run_file_limit_decides(tmp_path: Path, limit: int | None, state: str) -> None:
    layout, inputs = _setup(tmp_path)
    inputs = Inputs(
        plan=msgspec.structs.replace(inputs.plan, max_empty_outputs=limit),
        plan_sha256="-",
        recipe=RECIPE,
        snapshot=ProviderSnapshot(),
    )
    _runner(layout, EmptyingEngine(empty=3)).run(inputs, 0, "31", "n1")
    assert read_json(layout.shard(0).attempt("attempt-31").record, AttemptRecord).state == state


class BatchEngine:
    """Data Designer's batches, one per ``buffer_size`` records: the batches in ``empty`` hold one row whose
    LLM text is ''; on resume the batches on disk are kept and only the missing ones generated (holes too);
    ``stop_after`` batches it stops as a cancelled job would, before any verification."""

    def __init__(self, *, empty: frozenset[int] = frozenset(), stop_after: int | None = None) -> None:
        self.empty, self.stop_after = empty, stop_after
        self.requests: list[EngineRequest] = []
        self.generated: list[int] = []

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        dataset = request.artifact_path / request.dataset_name
        files, dropped = dataset / "parquet-files", dataset / "dropped-columns-parquet-files"
        if not request.resume:
            files.mkdir(parents=True)
            (dataset / "metadata.json").write_text(json.dumps({"buffer_size": request.buffer_size}))
        dropped.mkdir(exist_ok=True)
        size = request.buffer_size
        for b in range(-(-request.num_records // size)):
            name = f"batch_{b:05d}.parquet"
            if (files / name).exists():
                continue
            if self.stop_after is not None and len(self.generated) >= self.stop_after:
                raise EngineError("the job was cancelled", retryable=True)
            rows = [
                {**GOOD, "answer": "" if b in self.empty and i == 0 else f"a{b}-{i}"}
                for i in range(min(size, request.num_records - b * size))
            ]
            kept = [{k: v for k, v in r.items() if k != "notes"} | {"topic": "t", "chars": 1} for r in rows]
            pq.write_table(pa.Table.from_pylist(kept), files / name)
            pq.write_table(pa.Table.from_pylist([{"notes": r["notes"]} for r in rows]), dropped / name)
            self.generated.append(b)
        total = sum(pq.read_metadata(f).num_rows for f in files.glob("*.parquet"))
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": total, "buffer_size": size}))
        return EngineResult(dataset_dir=dataset, rows=total, requested=request.num_records)


def _answers(layout: RunLayout) -> list[str]:
    winner = read_json(layout.shard(0).winner, WinnerRecord)
    return [
        v for f in winner.files for v in pq.read_table(Path(winner.dataset_dir) / f.path).column("answer").to_pylist()
    ]


def test_a_retry_after_a_cancelled_attempt_does_not_resume_its_empty_batches(tmp_path: Path) -> None:
    """The cancelled attempt never reached verification, so its empty values were never set aside: every
    attempt resuming them was rejected in turn (a chaos campaign's five retries). Only its clean batches are
    continued; Data Designer generates the other again."""
    layout, inputs = _setup(tmp_path, buffer_size=2)
    first = BatchEngine(empty=frozenset({0}), stop_after=2)
    assert _runner(layout, first).run(inputs, 0, "41", "n1") == EXIT_FAILED
    stopped = layout.shard(0).attempt("attempt-41").output / "shard-00000"
    before = sorted(p.name for p in (stopped / "parquet-files").iterdir())
    assert before == ["batch_00000.parquet", "batch_00001.parquet"]

    retry = BatchEngine()
    assert _runner(layout, retry).run(inputs, 0, "42", "n1") == EXIT_OK
    record = read_json(layout.shard(0).attempt("attempt-42").record, AttemptRecord)
    assert (record.state, record.resumed_from, record.resumed_rows, record.rows) == ("succeeded", "attempt-41", 2, 6)
    assert retry.requests[0].resume is True and retry.generated == [0, 2]  # batch 1 continued, 0 generated again
    answers = _answers(layout)
    assert sorted(answers) == ["a0-0", "a0-1", "a1-0", "a1-1", "a2-0", "a2-1"]
    assert sorted(p.name for p in (stopped / "parquet-files").iterdir()) == before  # the earlier attempt's, as it was


def test_a_rerun_in_the_allocation_continues_only_its_clean_batches_and_keeps_the_rest(tmp_path: Path) -> None:
    layout, inputs = _setup(tmp_path, buffer_size=2)
    assert _runner(layout, BatchEngine(empty=frozenset({1}), stop_after=2)).run(inputs, 0, "51", "n1") == EXIT_FAILED
    rerun = BatchEngine()
    runner = _runner(layout, rerun)
    began = runner.resume(0, "attempt-51")
    runner.rerun(began)
    assert runner.generate(inputs, began, {}, resume_own=True) == EXIT_OK
    assert rerun.requests[0].resume is True and rerun.generated == [1, 2]
    assert "" not in _answers(layout) and len(_answers(layout)) == 6
    output = layout.shard(0).attempt("attempt-51").output
    [kept] = output.glob("shard-00000.stopped-*")  # what the stopped run wrote, nothing deleted
    assert sorted(p.name for p in (kept / "parquet-files").iterdir()) == ["batch_00000.parquet", "batch_00001.parquet"]


def test_batches_within_the_limit_are_continued(tmp_path: Path) -> None:
    layout, inputs = _setup(tmp_path, buffer_size=2, max_empty_outputs=1)
    assert _runner(layout, BatchEngine(empty=frozenset({0}), stop_after=2)).run(inputs, 0, "61", "n1") == EXIT_FAILED
    retry = BatchEngine()
    assert _runner(layout, retry).run(inputs, 0, "62", "n1") == EXIT_OK
    assert retry.generated == [2]
    assert read_json(layout.shard(0).attempt("attempt-62").record, AttemptRecord).resumed_rows == 4


def test_continued_files_leave_out_batches_over_the_limit_and_then_every_fill(tmp_path: Path) -> None:
    dataset = tmp_path / "shard-00000"
    rows = [GOOD, GOOD, {**GOOD, "notes": ""}, GOOD, {**GOOD, "sql": None}, GOOD]  # a dropped column counts too
    _write_dataset(dataset, rows)
    (dataset / "fill-files").mkdir()
    pq.write_table(
        pa.Table.from_pylist([{**GOOD, "topic": "t", "chars": 1}]), dataset / "fill-files" / "fill_0.parquet"
    )
    columns = llm_columns(RECIPE)

    def names(limit: int | None) -> list[str]:
        return [f"{folder}/{name}" for folder, name in continued_files(dataset, EmptyLimit(columns, limit)).files]

    everything = continued_files(dataset, EmptyLimit(columns, None))
    assert (everything.rows, everything.left_out, len(everything.files)) == (7, 0, 7)
    strict = continued_files(dataset, EmptyLimit(columns, 0))
    assert names(0) == ["parquet-files/batch_00000.parquet", "dropped-columns-parquet-files/batch_00000.parquet"]
    assert (strict.rows, strict.left_out) == (2, 2)  # batches 1 and 2 left out; the fill with them
    assert names(1) == names(None)  # one empty value per column is allowed: everything continues


def test_fill_batches_are_not_continued_when_a_batch_of_the_run_is_missing(tmp_path: Path) -> None:
    """A batch whose every record Data Designer dropped leaves no file, and resuming, Data Designer generates it
    again: the fill that made up its records is then not continued, or the shard would hold them twice (chaos seed
    442762: 10 rows in a shard of 9)."""
    dataset = tmp_path / "shard-00000"
    _write_dataset(dataset, [GOOD] * 6)  # batches 0, 1, 2 of 2 records
    (dataset / "fill-files").mkdir()
    pq.write_table(
        pa.Table.from_pylist([{**GOOD, "topic": "t", "chars": 1}]), dataset / "fill-files" / "fill_0.parquet"
    )
    whole = continued_files(dataset, EmptyLimit(llm_columns(RECIPE), None))
    assert ("fill-files", "fill_0.parquet") in whole.files and whole.rows == 7
    for name in ("parquet-files", "dropped-columns-parquet-files"):
        (dataset / name / "batch_00001.parquet").unlink()  # its records dropped: no file
    holed = continued_files(dataset, EmptyLimit(llm_columns(RECIPE), None))
    assert [name for folder, name in holed.files if folder == "parquet-files"] == [
        "batch_00000.parquet",
        "batch_00002.parquet",
    ]
    assert ("fill-files", "fill_0.parquet") not in holed.files and holed.rows == 4
    meta = json.loads((dataset / "metadata.json").read_text())
    (dataset / "metadata.json").write_text(json.dumps({**meta, "target_num_records": 4}))  # the run made 2 batches
    for name in ("parquet-files", "dropped-columns-parquet-files"):
        (dataset / name / "batch_00002.parquet").unlink()
    (dataset / "parquet-files" / "batch_00001.parquet").write_bytes(
        (dataset / "parquet-files" / "batch_00000.parquet").read_bytes()
    )
    assert ("fill-files", "fill_0.parquet") in continued_files(dataset, EmptyLimit(llm_columns(RECIPE), None)).files


def test_a_batch_whose_values_cannot_be_read_is_not_continued(tmp_path: Path) -> None:
    dataset = tmp_path / "shard-00000"
    _write_dataset(dataset, [GOOD, GOOD, GOOD, GOOD])
    damaged = dataset / "parquet-files" / "batch_00000.parquet"
    data = bytearray(damaged.read_bytes())
    data[8:200] = b"\xab" * 192  # the pages, not the footer: its metadata still reads
    damaged.write_bytes(bytes(data))
    assert pq.read_metadata(damaged).num_rows == 2
    source = continued_files(dataset, EmptyLimit(llm_columns(RECIPE), 0))
    assert [name for folder, name in source.files if folder == "parquet-files"] == ["batch_00001.parquet"]
    assert (source.rows, source.left_out) == (2, 0)
