"""One attempt of one shard, with a stand-in engine (the real engine is exercised in the end-to-end tests)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    DeploymentPlan,
    Plan,
    Progress,
    ProviderSnapshot,
    ReplicaPlan,
    RunLayout,
    ServingPlan,
    SnapshotModel,
    SnapshotProvider,
    WinnerRecord,
    atomic_write,
    encode,
    read_json,
    read_plan,
    recipe_with_models,
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
)
from ddslurm.runtime._attempt import OUTAGE_PAUSE_CAP_S, outage_pause
from ddslurm.runtime.errors import ProviderUnavailableError
from ddslurm.runtime.testing import PROVIDER, attempt_runner, write_run

SECRET = "sk-attempt-test-secret-value"


LOCAL = SnapshotProvider(name="ddslurm-local-x", endpoint="", api_key_env="DDSLURM_LOCAL_TOKEN", local=True)


def _run(
    tmp_path: Path,
    *,
    shard_records: tuple[int, ...] = (4, 4),
    local: bool = False,
    models: tuple[SnapshotModel, ...] = (
        SnapshotModel(alias="gen", model="m", provider="p", inference_parameters={"temperature": 0.5}),
    ),
    serving: ServingPlan | None = None,
    **plan: Any,
) -> RunLayout:
    providers = (PROVIDER, *((LOCAL,) if local else ()))
    return write_run(
        tmp_path / "run-1", shard_records, providers=providers, models=models, resume="if_possible", serving=serving,
        **plan,
    )  # fmt: skip


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


def _runner(layout: RunLayout, engine: Any, env: dict[str, str] | None = None, **options: Any) -> AttemptRunner:
    return attempt_runner(
        layout, engine, env={"T_KEY": SECRET} if env is None else env, scratch_home=layout.root / "dd", **options
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
    import msgspec

    layout = _run(tmp_path)
    atomic_write(layout.plan, encode(msgspec.structs.replace(read_json(layout.plan, Plan), resume="never")))
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


TOKEN = "the-attempts-own-token-" + "k" * 24


@pytest.mark.parametrize(
    ("engine", "env", "code", "reason"),
    [
        pytest.param(FakeEngine(), {"T_KEY": SECRET, "DDSLURM_LOCAL_TOKEN": TOKEN}, EXIT_OK, None, id="clean"),
        pytest.param(FakeEngine(), {"T_KEY": SECRET}, EXIT_FAILED, "secret_missing", id="no-token"),
        pytest.param(
            FakeEngine(leak=TOKEN),
            {"T_KEY": SECRET, "DDSLURM_LOCAL_TOKEN": TOKEN},
            EXIT_FAILED,
            "output_invalid",
            id="token-in-output",
        ),
    ],
)
def test_the_client_scans_for_the_attempts_token_too(
    tmp_path: Path, engine: FakeEngine, env: dict[str, str], code: int, reason: str | None
) -> None:
    """The local provider's key variable (the attempt's token, which the plan does not list: the submitting shell
    never has it) counts among the client's secrets: required in its environment, and scanned for before the
    shard's result may be published."""
    from ddslurm.runtime._client_step import client_inputs

    layout = _run(tmp_path, local=True)
    inputs = client_inputs(load_inputs(layout))
    assert "DDSLURM_LOCAL_TOKEN" in inputs.plan.secret_env and "T_KEY" in inputs.plan.secret_env
    assert inputs.plan_sha256 == load_inputs(layout).plan_sha256  # the winner still names the run's plan
    assert _runner(layout, engine, env).run(inputs, 0, "9", "n") == code
    record = read_json(layout.shard(0).attempt("attempt-9").record, AttemptRecord)
    assert record.reason == reason
    assert layout.shard(0).winner.exists() == (code == EXIT_OK)
    assert TOKEN not in (record.message or "")


def test_modified_inputs_are_refused(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    layout.snapshot.write_bytes(layout.snapshot.read_bytes().replace(b"T_KEY", b"X_KEY"))
    with pytest.raises(InputsError, match="sha256 differs"):
        load_inputs(layout)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda root: (root / "d" / "b.txt").write_text("BETA"), "b.txt: sha256 differs"),
        (lambda root: (root / "d" / "new.txt").write_text("x"), "new.txt: not part of the run's seed dataset"),
        (lambda root: (root / "a.txt").unlink(), "cannot read the run's seed file"),
    ],
    ids=["changed", "added", "removed"],
)
def test_seed_files_are_checked_against_the_plans_manifest(tmp_path: Path, tamper: Any, message: str) -> None:
    from ddslurm.config import FileEntry, SeedPlan, read_plan, sha256_file
    from ddslurm.runtime._inputs import check_seed

    root = tmp_path / "seed"
    (root / "d").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "d" / "b.txt").write_text("beta")
    files = tuple(
        FileEntry(path=rel, size=(root / rel).stat().st_size, sha256=sha256_file(root / rel))
        for rel in ("a.txt", "d/b.txt")
    )
    seed = SeedPlan(
        seed_type="file_contents", kind="directory", root=str(root), path=str(root), files=files, rows=2, pool_size=2
    )
    check_seed(seed)  # untouched: fine
    layout = _run(tmp_path / "run")
    atomic_write(layout.plan, encode(msgspec.structs.replace(read_plan(layout.plan), seed=seed)))
    tamper(root)
    with pytest.raises(InputsError, match=message):
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
    out = recipe_with_models(recipe, snapshot, None)
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


def test_the_client_log_says_which_max_parallel_requests_each_alias_runs_with(tmp_path: Path) -> None:
    """The local alias gets the plan's replicas x capacity, the hosted one its recipe's value; the engine gets the
    plan's deployments, and ``attempt.generating`` records the decision."""
    deployment = DeploymentPlan(
        alias="x",
        model="m",
        served_model_name="m",
        tensor_parallel=1,
        replicas=(ReplicaPlan(index=0, gpus=1, cpus=1), ReplicaPlan(index=1, gpus=1, cpus=1)),
        startup_timeout=30,
        proxy=True,
        capacity=8,
        max_parallel_requests=16,
    )
    serving = ServingPlan(deployments=(deployment,), gpus=2)
    models = (
        SnapshotModel(alias="x", model="m", provider=LOCAL.name, source="deployment"),
        SnapshotModel(alias="gen", model="m", provider="p", inference_parameters={"max_parallel_requests": 4}),
    )
    layout = _run(tmp_path, local=True, models=models, serving=serving)
    engine = FakeEngine()
    assert _runner(layout, engine).run(load_inputs(layout), 0, "101", "n1") == EXIT_OK
    assert engine.requests[0].serving == serving
    events = [json.loads(line) for line in layout.shard(0).attempt("attempt-101").client_log.read_text().splitlines()]
    generating = next(e for e in events if e["event"] == "attempt.generating")
    assert generating["max_parallel_requests"] == {"x": 16, "gen": 4}
    assert generating["sized_aliases"] == ["x"]


def test_each_shard_reads_the_seed_block_the_plan_gives_it() -> None:
    from ddslurm.config import ShardSpec, partition_seed

    recipe = {"data_designer": {"seed_config": {"source": {"path": "x"}, "selection_strategy": None}}}
    spec = ShardSpec(index=2, first_record=14, num_records=7, seed_start=14, seed_end=19)
    out = partition_seed(recipe, spec)
    assert out["data_designer"]["seed_config"]["selection_strategy"] == {"start": 14, "end": 19}
    assert recipe["data_designer"]["seed_config"]["selection_strategy"] is None  # the input is not changed
    assert partition_seed(recipe, ShardSpec(index=0, first_record=0, num_records=3)) is recipe  # no seed block
    assert partition_seed({"data_designer": {}}, spec) == {"data_designer": {}}  # no seed config


class ResumingEngine(FakeEngine):
    """Writes one batch per ``buffer_size`` records; on resume keeps the batches already on disk."""

    def __init__(self, *, stop_after: int | None = None) -> None:
        super().__init__()
        self.stop_after = stop_after

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        dataset = request.artifact_path / request.dataset_name
        files = dataset / "parquet-files"
        if request.resume:
            assert (dataset / "metadata.json").is_file()
        else:
            files.mkdir(parents=True)
            (dataset / "metadata.json").write_text(json.dumps({"buffer_size": request.buffer_size}))
        n = -(-request.num_records // request.buffer_size)
        for b in range(n):
            path = files / f"batch_{b:05d}.parquet"
            if path.exists():
                continue
            if self.stop_after is not None and b >= self.stop_after:
                raise EngineError("endpoint went away", retryable=True)
            rows = min(request.buffer_size, request.num_records - b * request.buffer_size)
            pq.write_table(pa.table({"x": [f"{request.dataset_name}-{b}-{i}" for i in range(rows)]}), path)
            if request.on_batch_complete:
                request.on_batch_complete(path)
        total = sum(pq.read_metadata(f).num_rows for f in files.glob("*.parquet"))
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": total}))
        return EngineResult(dataset_dir=dataset, rows=total, requested=request.num_records)


def test_a_new_attempt_resumes_from_the_best_earlier_attempt_without_duplicates(tmp_path: Path) -> None:
    layout = _run(tmp_path, shard_records=(8,))
    inputs = load_inputs(layout)
    first = ResumingEngine(stop_after=2)
    assert _runner(layout, first).run(inputs, 0, "1", "n") == EXIT_FAILED
    progress = json.loads(layout.shard(0).attempt("attempt-1").progress.read_text())
    assert (progress["rows"], progress["batches"]) == (4, 2)

    second = ResumingEngine()
    assert _runner(layout, second).run(inputs, 0, "2", "n") == EXIT_OK
    assert second.requests[0].resume is True
    record = read_json(layout.shard(0).attempt("attempt-2").record, AttemptRecord)
    assert (record.resumed_from, record.resumed_rows, record.rows) == ("attempt-1", 4, 8)
    winner = read_json(layout.shard(0).winner, WinnerRecord)
    values = [v for f in winner.files for v in pq.read_table(Path(winner.dataset_dir) / f.path).column("x").to_pylist()]
    assert len(values) == len(set(values)) == 8
    # the earlier attempt's files are still there, unchanged (hard links, never moved)
    assert len(list((layout.shard(0).attempt("attempt-1").output / "shard-00000" / "parquet-files").iterdir())) == 2


def test_resume_never_starts_fresh(tmp_path: Path) -> None:
    import msgspec

    layout = _run(tmp_path, shard_records=(8,))
    plan = read_json(layout.plan, Plan)
    atomic_write(layout.plan, encode(msgspec.structs.replace(plan, resume="never")))
    inputs = load_inputs(layout)
    _runner(layout, ResumingEngine(stop_after=2)).run(inputs, 0, "1", "n")
    fresh = ResumingEngine()
    assert _runner(layout, fresh).run(inputs, 0, "2", "n") == EXIT_OK
    assert fresh.requests[0].resume is False


@pytest.mark.parametrize("kind", ["non-empty-dir", "symlink", "file"])
def test_existing_dataset_path_is_left_byte_for_byte_untouched(tmp_path: Path, kind: str) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    runner = _runner(layout, FakeEngine())
    began = runner.begin(inputs, 0, "5", "n")
    assert began is not None
    target = began.layout.output / "shard-00000"
    target.parent.mkdir()
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data.txt").write_bytes(b"keep me")
    if kind == "non-empty-dir":
        target.mkdir()
        (target / "data.txt").write_bytes(b"keep me")
    elif kind == "symlink":
        target.symlink_to(outside, target_is_directory=True)
    else:
        target.write_bytes(b"keep me")
    before = sorted(
        (str(p), p.is_symlink(), p.read_bytes() if p.is_file() else b"")
        for p in tmp_path.rglob("*")
        if "precious" in str(p) or "shard-00000" in p.name or p.parent == target
    )
    engine = FakeEngine()
    assert runner.generate(inputs, began, {}) == EXIT_FAILED
    assert engine.requests == []
    record = read_json(began.layout.record, AttemptRecord)
    assert record.reason == "output_exists" and "left untouched" in (record.message or "")
    after = sorted(
        (str(p), p.is_symlink(), p.read_bytes() if p.is_file() else b"")
        for p in tmp_path.rglob("*")
        if "precious" in str(p) or "shard-00000" in p.name or p.parent == target
    )
    assert after == before


def test_partial_attempt_leaves_a_candidate_for_accept_partial(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    assert _runner(layout, FakeEngine(rows=3)).run(load_inputs(layout), 0, "7", "n") == EXIT_PARTIAL
    candidate = read_json(layout.shard(0).attempt("attempt-7").candidate, WinnerRecord)
    assert candidate.partial and candidate.rows == 3 and not layout.shard(0).winner.exists()


def test_a_rerun_with_nothing_to_resume_starts_afresh_and_keeps_what_was_left(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    runner = _runner(layout, FakeEngine())
    began = runner.begin(inputs, 0, "6", "n")
    assert began is not None
    target = began.layout.output / "shard-00000"
    target.mkdir(parents=True)
    (target / "builder_config.json").write_text("{}")  # what a run killed during start-up leaves
    runner.rerun(began)
    assert runner.generate(inputs, began, {}, resume_own=True) == EXIT_OK
    assert read_json(layout.shard(0).winner, WinnerRecord).dataset_dir == str(target)
    kept = list(began.layout.output.glob("shard-00000.stopped-*"))
    assert len(kept) == 1 and (kept[0] / "builder_config.json").read_text() == "{}"


class DroppingEngine:
    """Drops records like Data Designer under a flaky provider: call i yields ``num_records - drops[i]`` rows.
    A resumed dataset whose batches are all there is complete (Data Designer generates nothing)."""

    def __init__(self, *drops: int) -> None:
        self.drops = list(drops)
        self.requests: list[EngineRequest] = []

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        dataset = request.artifact_path / request.dataset_name
        if request.resume and (dataset / "metadata.json").is_file():
            rows = json.loads((dataset / "metadata.json").read_text())["actual_num_records"]
            return EngineResult(dataset_dir=dataset, rows=rows, requested=request.num_records)
        rows = request.num_records - (self.drops.pop(0) if self.drops else 0)
        (dataset / "parquet-files").mkdir(parents=True)
        pq.write_table(pa.table({"x": [len(self.requests)] * rows}), dataset / "parquet-files" / "batch_00000.parquet")
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": rows}))
        return EngineResult(dataset_dir=dataset, rows=rows, requested=request.num_records)


def test_dropped_records_are_generated_again_once_in_the_same_step(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    engine = DroppingEngine(1, 0)
    assert _runner(layout, engine).run(load_inputs(layout), 0, "7", "n") == EXIT_OK
    assert [r.num_records for r in engine.requests] == [4, 1]  # the shard, then exactly the one dropped record
    winner = read_json(layout.shard(0).winner, WinnerRecord)
    assert winner.rows == 4 and not winner.partial
    assert [f.path for f in winner.files] == [
        "parquet-files/batch_00000.parquet",
        "fill-files/fill_00000_00000.parquet",
    ]
    dataset = Path(winner.dataset_dir)
    assert sum(pq.read_table(dataset / f.path).num_rows for f in winner.files) == 4


def test_retry_of_a_partial_shard_generates_only_what_is_still_missing(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    first = DroppingEngine(2, 1)  # the provider stays flaky: the fill brings one of the two back
    assert _runner(layout, first).run(inputs, 0, "7", "n") == EXIT_PARTIAL
    record = read_json(layout.shard(0).attempt("attempt-7").record, AttemptRecord)
    assert (record.state, record.rows) == ("partial", 3)
    healed = DroppingEngine()
    assert _runner(layout, healed).run(inputs, 0, "8", "n") == EXIT_OK
    # Data Designer finds the resumed dataset complete; only the one missing record is generated.
    assert [(r.resume, r.num_records) for r in healed.requests] == [(True, 4), (False, 1)]
    winner = read_json(layout.shard(0).winner, WinnerRecord)
    assert winner.attempt == "attempt-8" and winner.rows == 4
    assert len([f for f in winner.files if f.path.startswith("fill-files/")]) == 2
    assert read_json(layout.shard(0).attempt("attempt-8").record, AttemptRecord).resumed_from == "attempt-7"


def test_retry_fresh_starts_the_shard_from_nothing(tmp_path: Path) -> None:
    from ddslurm.config import FreshRecord

    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    assert _runner(layout, DroppingEngine(2, 2)).run(inputs, 0, "7", "n") == EXIT_PARTIAL
    atomic_write(layout.shard(0).fresh, encode(FreshRecord(excluded=("attempt-7",), at="2026-01-01T00:00:00+00:00")))
    engine = DroppingEngine()
    assert _runner(layout, engine).run(inputs, 0, "8", "n") == EXIT_OK
    assert [(r.resume, r.num_records) for r in engine.requests] == [(False, 4)]  # nothing resumed, nothing filled
    record = read_json(layout.shard(0).attempt("attempt-8").record, AttemptRecord)
    assert record.resumed_from is None and record.rows == 4
    assert (layout.shard(0).attempt("attempt-7").output / "shard-00000" / "parquet-files").is_dir()  # kept


@pytest.mark.parametrize(("kind", "starts"), [("auto-retry", False), ("retry", True)])
def test_automatic_retry_does_not_repeat_a_refused_recipe(tmp_path: Path, kind: str, starts: bool) -> None:
    """A recipe Data Designer refuses fails every attempt of the run: the automatic retry array's task records
    `not_retried` and generates nothing; a retry the user asks for still runs."""
    from ddslurm.config import SubmissionRecord
    from ddslurm.runtime.errors import RecipeError

    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    assert _runner(layout, FakeEngine(fail=RecipeError("column 'q' refers to 'nope'"))).run(inputs, 0, "7", "n") == 1
    layout.submissions.mkdir(parents=True, exist_ok=True)
    atomic_write(
        layout.submissions / "900.json",
        encode(SubmissionRecord(array_job_id="900", shards=(0,), submitted_at="-", script="-", kind=kind)),  # type: ignore[arg-type]
    )
    engine = FakeEngine()
    runner = _runner(layout, engine, {"T_KEY": SECRET, "SLURM_ARRAY_JOB_ID": "900"})
    assert runner.run(inputs, 0, "901", "n") == EXIT_OK  # exit 0 also ends the chain of retry arrays
    record = read_json(layout.shard(0).attempt("attempt-901").record, AttemptRecord)
    if starts:
        assert record.state == "succeeded" and len(engine.requests) == 1
    else:
        assert (record.state, record.reason) == ("failed", "not_retried") and engine.requests == []
        assert "recipe_invalid" in (record.message or "") and "nope" in (record.message or "")


class CellEngine(FakeEngine):
    """Reports finished cells before it writes its one batch, and looks at the progress file meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Progress] = []

    def __call__(self, request: EngineRequest) -> EngineResult:
        assert request.on_cell is not None
        request.on_cell()
        progress = (request.artifact_path.parent / "progress.json").read_bytes()
        self.seen.append(msgspec.json.decode(progress, type=Progress))
        return super().__call__(request)


def test_progress_moves_within_a_batch_and_resets_when_the_batch_is_written(tmp_path: Path) -> None:
    layout = _run(tmp_path, shard_records=(4,))
    engine = CellEngine()
    assert _runner(layout, engine).run(load_inputs(layout), 0, "111", "n1") == EXIT_OK
    [during] = engine.seen
    assert (during.rows, during.in_batch) == (0, 1)  # one cell of the recipe's one column: one record underway
    after = read_json(layout.shard(0).attempt("attempt-111").progress, Progress)
    assert (after.rows, after.in_batch) == (4, 0)


def test_the_inputs_are_refused_from_a_run_tree_others_can_change_or_with_another_plan(tmp_path: Path) -> None:
    """Issue 18: another user renamed a queued run aside and put a plan of theirs in its place; the job read it
    (the digests were checked against the plan of that same directory) and received the victim's API key."""
    layout = _run(tmp_path)
    submitted = load_inputs(layout).plan_sha256
    assert load_inputs(layout, plan_sha256=submitted).plan.run_id == "run-1"
    swapped = msgspec.structs.replace(read_plan(layout.plan), secret_env=("T_KEY", "OTHER_KEY"))
    atomic_write(layout.plan, encode(swapped))
    with pytest.raises(InputsError, match="replaced after submission"):
        load_inputs(layout, plan_sha256=submitted)
    layout.root.chmod(0o755)
    with pytest.raises(InputsError, match="lets other users in"):
        load_inputs(layout)
    layout.root.chmod(0o700)
    layout.root.parent.chmod(0o777)
    with pytest.raises(InputsError, match="rename or replace"):
        load_inputs(layout)


class OutageEngine(FakeEngine):
    """A provider unavailable for the first ``down`` runs of Data Designer (its start-up health check fails)."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    def __call__(self, request: EngineRequest) -> EngineResult:
        if len(self.requests) < self.down:
            self.requests.append(request)
            raise ProviderUnavailableError("provider 'p' is unavailable: ModelRateLimitError: 429", provider="p")
        return super().__call__(request)


def test_an_outage_shorter_than_provider_wait_is_waited_out_inside_the_attempt(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    engine, pauses = OutageEngine(down=3), []
    runner = _runner(layout, engine, sleep=pauses.append, jitter=lambda: 0.5)
    assert runner.run(load_inputs(layout), 0, "301", "n1") == EXIT_OK
    assert pauses == [1.0, 2.0, 4.0] and len(engine.requests) == 4  # doubling, the jitter's factor 1 here
    record = read_json(layout.shard(0).attempt("attempt-301").record, AttemptRecord)
    assert (record.state, record.client_runs) == ("succeeded", 1)  # further tries of one client run
    events = [json.loads(line) for line in layout.shard(0).attempt("attempt-301").client_log.read_text().splitlines()]
    assert [e["pause_s"] for e in events if e["event"] == "provider.unavailable"] == [1.0, 2.0, 4.0]


def test_an_outage_longer_than_provider_wait_fails_the_attempt_saying_how_long_it_waited(tmp_path: Path) -> None:
    layout = _run(tmp_path, provider_wait_s=10)
    engine, pauses = OutageEngine(down=100), []
    runner = _runner(layout, engine, sleep=pauses.append, jitter=lambda: 0.5)
    assert runner.run(load_inputs(layout), 0, "302", "n1") == EXIT_FAILED
    assert pauses == [1.0, 2.0, 4.0]  # the next pause, 8 s, would pass the 10 s
    record = read_json(layout.shard(0).attempt("attempt-302").record, AttemptRecord)
    assert (record.state, record.reason, record.retryable) == ("failed", "provider_unavailable", True)
    assert "waited out for 7 s over 4 tries; the run file's provider_wait is 10 s" in (record.message or "")
    assert not layout.shard(0).winner.exists()


def test_outage_pauses_double_to_a_cap_and_spread_by_half_either_way() -> None:
    assert [outage_pause(n, 0.5) for n in range(7)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        OUTAGE_PAUSE_CAP_S,
        OUTAGE_PAUSE_CAP_S,
    ]
    assert outage_pause(0, 0.0) == 0.5 and outage_pause(20, 0.999) < OUTAGE_PAUSE_CAP_S * 1.5


def test_a_spares_attempt_says_when_its_wait_ended_and_a_rerun_keeps_that_moment(tmp_path: Path) -> None:
    """Issue 40: a spare client's attempt is begun ``spare`` without ``generating_at`` (``status`` shows its shard
    ``waiting``, the report its wait); its client's first run records when it began generating, a rerun inside the
    allocation keeps that moment, and an ordinary worker's attempt is no spare."""
    layout = _run(tmp_path)
    inputs = load_inputs(layout)
    ticks = iter(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC) for second in range(60))
    runner = _runner(layout, FakeEngine(fail=EngineError("boom", retryable=True)), clock=lambda: next(ticks))
    began = runner.begin(inputs, 0, "8", "n", spare=True)
    worker = runner.begin(inputs, 1, "8", "n")
    assert began is not None and worker is not None
    waiting = read_json(began.layout.record, AttemptRecord)
    assert (waiting.spare, waiting.generating_at, waiting.state) == (True, None, "running")
    assert not read_json(worker.layout.record, AttemptRecord).spare
    assert runner.generate(inputs, began, {}) == EXIT_FAILED
    first = read_json(began.layout.record, AttemptRecord)
    assert first.spare and first.client_runs == 1 and first.generating_at is not None
    assert first.started_at < first.generating_at < (first.ended_at or "")
    runner.rerun(began)
    again = _runner(layout, FakeEngine(), clock=lambda: next(ticks))
    assert again.generate(inputs, began, {}, resume_own=True) == EXIT_OK
    done = read_json(began.layout.record, AttemptRecord)
    assert (done.state, done.client_runs, done.generating_at) == ("succeeded", 2, first.generating_at)
