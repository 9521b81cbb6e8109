"""The Python API (``ddslurm.launcher.api``, docs/python-api.md): its names and the fields of its results are
pinned, and each operation works on a fake Slurm with Data Designer answered in this process, as a program
calls it: submit (and its dry run), open, status, wait, cancel, retry, collect; the commands print what it
returns."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.collector.testing import make_published_run
from ddslurm.config import DdslurmError, RunLayout
from ddslurm.launcher import Slurm, api
from ddslurm.launcher.api import Client, CollectFailedError, Run, Submission, WaitTimeout
from ddslurm.launcher.cli import main
from ddslurm.launcher.errors import LauncherError, RunNotFoundError, SubmitError, UsageError
from ddslurm.launcher.testing import (
    FakeSlurm,
    InProcessHost,
    accept_every_recipe,
    write_attempt,
    write_unit_run,
)

KEY = "sk-api-test-0000"

# --- what is stable: the names and the fields, pinned ---

NAMES = [
    "Accepted", "AcceptedShard", "Cancelled", "Client", "CollectFailedError", "CollectResult", "DdslurmError",
    "KeyStatus", "LauncherError", "PartialSubmitError", "Planned", "Reported", "Retried", "RetryPreview",
    "RetryRefusedError", "Run", "RunNotFoundError",
    "RunRef", "RunStatus", "ShardStatus", "SlurmError", "StageProgress", "Submission", "SubmitError", "UsageError",
    "WaitTimeout",
]  # fmt: skip
"""``ddslurm.launcher.api.__all__``: a name added or removed is a change of the stable API (docs/python-api.md)."""

FIELDS: dict[str, tuple[str, ...]] = {
    "Run": ("run_id", "run_dir"),
    "Submission": ("run", "job_ids", "shards", "records", "warnings", "notes", "secret_env_unscanned"),
    "Planned": ("run", "shards", "records", "arrays", "tasks", "script", "warnings", "notes"),
    "Reported": ("page", "report"),
    "RunStatus": (
        "run_id",
        "run_dir",
        "state",
        "shards",
        "records_requested",
        "records_done",
        "counts",
        "cancelled_at",
        "submission_incomplete",
        "unsubmitted_arrays",
        "name",
        "submitted_at",
        "stages",
        "progress",
        "hosted",
    ),
    "ShardStatus": (
        "shard",
        "state",
        "records",
        "rows",
        "rate",
        "job_id",
        "slurm_state",
        "pending_reason",
        "attempt",
        "attempts",
        "attempt_number",
        "reason",
        "message",
        "stage",
        "stage_rows",
    ),
    "StageProgress": ("stage", "rows_done", "records", "shards_done"),
    "KeyStatus": (
        "provider",
        "key_env",
        "requests",
        "limited",
        "failed",
        "unanswered",
        "input_tokens",
        "output_tokens",
        "unreached",
        "cost",
        "currency",
        "requests_per_minute",
        "in_flight",
    ),
    "Cancelled": ("ids", "run", "adopted", "shards", "finished", "pulled"),
    "Retried": ("shards", "job_ids", "planned", "kept", "warnings", "preview"),
    "RetryPreview": ("shard", "attempt", "stage", "resume", "resume_rows", "resume_from", "repeats"),
    "Accepted": ("accepted", "cpu_stage", "job_ids", "queued"),
    "AcceptedShard": ("shard", "rows", "stage"),
    "CollectResult": ("dataset", "rows", "files", "manifest"),
}
"""The public fields of each result type, in order."""

METHODS: dict[str, tuple[str, ...]] = {
    "__init__": ("profile", "env", "data_designer_home", "slurm", "notes", "sleep", "engine_host"),
    "open": ("run",),
    "submit": ("run_file", "profile", "dry_run", "check_endpoints", "accept_overrun"),
    "status": ("run",),
    "follow": ("run",),
    "wait": ("run", "timeout", "on_update"),
    "cancel": ("run", "shards"),
    "retry": ("run", "shards", "fresh", "resume_cancelled", "dry_run", "force"),
    "accept_partial": ("run", "shards"),
    "collect": ("run", "local", "overwrite", "progress"),
    "report": ("run", "output"),
}
"""``Client``'s public methods and their parameters."""


def public_fields(kind: type) -> tuple[str, ...]:
    """A result type's public fields: a dataclass's or a msgspec Struct's, in order."""
    if dataclasses.is_dataclass(kind):
        return tuple(f.name for f in dataclasses.fields(kind) if not f.name.startswith("_"))
    assert issubclass(kind, msgspec.Struct), kind
    return tuple(name for name in kind.__struct_fields__ if not name.startswith("_"))


def test_the_api_exports_exactly_the_pinned_names() -> None:
    assert sorted(api.__all__) == NAMES
    assert [name for name in api.__all__ if getattr(api, name, None) is None] == []


def test_every_result_type_has_the_pinned_public_fields() -> None:
    assert {name: public_fields(getattr(api, name)) for name in FIELDS} == FIELDS


def test_the_client_has_the_pinned_methods_and_parameters() -> None:
    public = {name for name, _ in inspect.getmembers(Client, inspect.isfunction) if not name.startswith("_")}
    assert public | {"__init__"} == set(METHODS)
    shown = {name: tuple(inspect.signature(getattr(Client, name)).parameters)[1:] for name in METHODS}
    assert shown == METHODS


def test_every_error_the_api_exports_is_a_ddslurm_error() -> None:
    errors = [getattr(api, n) for n in api.__all__ if isinstance(getattr(api, n), type)]
    raised = [e for e in errors if issubclass(e, BaseException)]
    assert len(raised) == 10 and all(issubclass(e, DdslurmError) for e in raised)


def test_importing_the_api_loads_no_heavy_module() -> None:
    """``ddslurm.launcher.api`` is what every command of ``ddslurm`` builds on: importing it loads neither pyarrow,
    Data Designer nor the planner (``CollectResult`` is imported when first used)."""
    import subprocess
    import sys

    code = (
        "import json, sys\nimport ddslurm.launcher.api as api\n"
        "heavy = ('pyarrow', 'numpy', 'data_designer', 'ddslurm.planner', 'ddslurm.collector')\n"
        "before = sorted(m for m in heavy if m in sys.modules)\napi.CollectResult\n"
        "print(json.dumps([before, 'ddslurm.collector' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(done.stdout) == [[], True]


# --- the operations, on a fake Slurm ---


@pytest.fixture
def _no_recipe_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data Designer's own validation of the recipe (a subprocess of seconds) is tested elsewhere."""
    accept_every_recipe(monkeypatch)


def _client(profile: Path | None, env: dict[str, str], runner: FakeSlurm, **kwargs: Any) -> Client:
    return Client(
        profile=profile,
        env=env,
        slurm=Slurm(runner, env=env, user="alice"),
        notes=kwargs.pop("notes", io.StringIO()),
        sleep=lambda _: None,
        engine_host=InProcessHost(),
        **kwargs,
    )


@pytest.mark.usefixtures("_no_recipe_check")
def test_submit_takes_data_designer_home_from_the_client_and_returns_the_run(tmp_path: Path) -> None:
    """The same environment without ``DATA_DESIGNER_HOME`` is refused (the recipe's provider is nowhere); given as
    the client's ``data_designer_home`` it submits one array of 3 shards, and the run is there by its handle, its
    directory and its id."""
    run_file, profile, env = write_unit_run(tmp_path, KEY, shards=3)
    home = env.pop("DATA_DESIGNER_HOME")
    with pytest.raises(DdslurmError, match="hosted"):
        _client(profile, env, FakeSlurm()).submit(run_file)

    slurm = FakeSlurm()
    client = _client(profile, env, slurm, data_designer_home=home)
    done = client.submit(run_file)

    assert isinstance(done, Submission)
    assert (done.job_ids, done.shards, done.records) == (("4242",), 3, 10)
    assert done.run.run_dir == tmp_path / "work" / "runs" / done.run.run_id
    assert (done.run.run_dir / "run.json").is_file()
    assert [c[0] for c in slurm.commands("sbatch")] == ["sbatch"]
    assert client.open(done.run) == client.open(done.run.run_id) == client.open(str(done.run.run_dir)) == done.run
    assert KEY not in repr(done)


@pytest.mark.usefixtures("_no_recipe_check")
def test_a_dry_run_plans_the_run_and_writes_and_submits_nothing(tmp_path: Path) -> None:
    run_file, profile, env = write_unit_run(tmp_path, KEY, shards=3)
    slurm = FakeSlurm()
    planned = _client(profile, env, slurm).submit(run_file, dry_run=True)
    assert (planned.shards, planned.records, planned.arrays, planned.tasks) == (3, 10, 1, 3)
    assert planned.script.startswith("#!") and "#SBATCH --array=0-2" in planned.script
    assert not planned.run.run_dir.exists() and not (tmp_path / "work" / "runs").exists()
    assert slurm.commands("sbatch") == []


def test_submit_without_a_profile_is_a_usage_error(tmp_path: Path) -> None:
    run_file, _, env = write_unit_run(tmp_path, KEY)
    with pytest.raises(UsageError, match="submit needs --profile"):
        _client(None, env, FakeSlurm()).submit(run_file)


@pytest.fixture
def submitted(tmp_path: Path, _no_recipe_check: None) -> tuple[Client, Run, FakeSlurm]:
    """A run of 3 shards submitted through the API as array 4242; the client and the fake scheduler it asks."""
    run_file, profile, env = write_unit_run(tmp_path, KEY, shards=3)
    slurm = FakeSlurm()
    client = _client(profile, env, slurm)
    return client, client.submit(run_file).run, slurm


def test_status_is_what_status_json_prints(submitted: tuple[Client, Run, FakeSlurm]) -> None:
    client, run, slurm = submitted
    slurm.squeue_out = "4242_0|RUNNING|None\n4242_[1-2]|PENDING|Priority\n"
    write_attempt(RunLayout(run.run_dir), 0, "4242_0", "running", task="4242_0", progress=2)

    st = client.status(run.run_id)

    assert (st.state, st.records_done) == ("running", 2)
    assert [s.state for s in st.shards] == ["running", "pending", "pending"]
    out = io.StringIO()
    assert main(["status", str(run.run_dir), "--json"], env=client.env, slurm=client.slurm, stdout=out) == 0
    printed, returned = json.loads(out.getvalue()), msgspec.to_builtins(st)
    for shown in (printed, returned):  # the running attempt's rate is of the moment it is read
        shown["shards"][0].pop("rate")
    assert printed == returned


def test_a_run_it_cannot_find_is_run_not_found(submitted: tuple[Client, Run, FakeSlurm], tmp_path: Path) -> None:
    client, _, _ = submitted
    with pytest.raises(RunNotFoundError, match="no run 'nothing-here'"):
        client.status("nothing-here")


def test_wait_gives_up_after_its_timeout_with_the_last_status(submitted: tuple[Client, Run, FakeSlurm]) -> None:
    client, run, slurm = submitted
    slurm.squeue_out = "4242_[0-2]|PENDING|Priority\n"
    seen: list[str] = []
    with pytest.raises(WaitTimeout) as raised:
        client.wait(run, timeout=0, on_update=lambda st: seen.append(st.state))
    assert raised.value.status is not None and raised.value.status.state == "pending" and seen == ["pending"]


def test_wait_returns_the_final_status_and_releases_what_a_succeeded_run_left_queued(tmp_path: Path) -> None:
    """Every shard has its result while a task of the run still waits in the queue (requeued after its shard was
    published): wait returns ``succeeded``, cancels the task, and says so in the client's notes."""
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})], [pa.table({"a": [3]})]])
    _record_array(layout, "4242", shards=(0, 1))
    notes = io.StringIO()
    slurm = FakeSlurm(squeue="4242_1|PENDING|BeginTime\n")
    client = _client(None, {}, slurm, notes=notes)

    final = client.wait(layout.root)

    assert (final.state, final.records_done) == ("succeeded", 3)
    assert [c[1:] for c in slurm.commands("scancel")] == [["4242_1"]]
    assert "note: cancelled 1 queued task(s) of the succeeded run" in notes.getvalue()


def _record_array(layout: RunLayout, job: str, *, shards: tuple[int, ...]) -> None:
    from ddslurm.config import SubmissionRecord, encode, publish_once

    layout.submissions.mkdir(parents=True, exist_ok=True)
    record = SubmissionRecord(array_job_id=job, shards=shards, submitted_at="2026-01-01T00:00:00+00:00", script="-")
    assert publish_once(layout.submissions / f"{job}.json", encode(record))


def test_cancel_cancels_every_array_and_retry_then_needs_resume_cancelled(
    submitted: tuple[Client, Run, FakeSlurm],
) -> None:
    client, run, slurm = submitted
    slurm.squeue_out = "4242_[0-2]|PENDING|Priority\n"

    done = client.cancel(run)

    assert (done.run, done.ids) == (True, ("4242",)) and [c[1:] for c in slurm.commands("scancel")] == [["4242"]]
    assert RunLayout(run.run_dir).cancelled.is_file()
    with pytest.raises(LauncherError, match="--resume-cancelled"):
        client.retry(run)
    slurm.squeue_out, slurm.sacct_out = "", "".join(f"4242_{t}|CANCELLED|0:0|None\n" for t in range(3))
    planned = client.retry(run, [1, 2], resume_cancelled=True, dry_run=True)
    assert planned.shards == (1, 2) and planned.job_ids == () and planned.planned is not None
    assert RunLayout(run.run_dir).cancelled.is_file()  # a dry run changes nothing
    retried = client.retry(run, [1, 2], resume_cancelled=True)
    assert (retried.shards, retried.job_ids) == ((1, 2), ("4243",))


def test_collect_returns_the_dataset(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})], [pa.table({"a": [3]})]])
    progress: list[tuple[int, int]] = []
    collected = _client(None, {}, FakeSlurm()).collect(
        layout.root, local=True, progress=lambda done, total: progress.append((done, total))
    )
    assert (collected.dataset, collected.rows) == (layout.dataset, 3)
    assert pq.read_table(collected.dataset).column("a").to_pylist() == [1, 2, 3]
    assert progress[-1] == (2, 2)


@pytest.mark.parametrize("local", [True, False], ids=["local", "job"])
def test_collect_of_a_run_still_running_raises_what_collect_says(
    submitted: tuple[Client, Run, FakeSlurm], local: bool
) -> None:
    """The error the API raises is the one ``ddslurm collect`` reports, its exit code included; no job is
    submitted for a run that cannot be collected."""
    client, run, slurm = submitted
    slurm.squeue_out = "4242_0|RUNNING|None\n4242_[1-2]|PENDING|Priority\n"

    with pytest.raises(CollectFailedError) as raised:
        client.collect(run, local=local)

    assert raised.value.exit_code == 1
    assert str(raised.value) == (
        f"3 shard(s) have no published result yet: 0, 1, 2; the run is still running: run `ddslurm wait "
        f"{run.run_dir}` first, then collect"
    )
    out, err = io.StringIO(), io.StringIO()
    argv = ["collect", str(run.run_dir), "--json", *(["--local"] if local else [])]
    assert main(argv, env=client.env, slurm=client.slurm, stdout=out, stderr=err) == raised.value.exit_code
    assert json.loads(out.getvalue())["error"]["message"] == str(raised.value)
    assert [c for c in slurm.commands("sbatch") if Path(c[-1]).name.startswith("collect-")] == []


def test_a_refused_submission_raises_the_package_error_and_leaves_nothing(tmp_path: Path) -> None:
    run_file, profile, env = write_unit_run(tmp_path, KEY, shards=3)
    run_file.write_text(run_file.read_text().replace("num_records: 10", "num_records: ten"))
    with pytest.raises(SubmitError):
        _client(profile, env, FakeSlurm()).submit(run_file)
    assert not (tmp_path / "work" / "runs").exists()


def test_a_failed_collection_that_reaches_main_keeps_its_code_and_exit_code() -> None:
    """``ddslurm workflow`` collects through the API's collection: a failure it does not handle is reported as
    ``collect`` reports it (the run directory unreadable: exit 2), not as a generic failure."""
    from ddslurm.launcher.commands._output import error_report

    failed = CollectFailedError(2, "collected 1/2 batch files\nerror: plan.json: unreadable\n")
    report = error_report(failed, "workflow")
    assert (report.code, report.message, report.exit_code) == ("run_unreadable", "plan.json: unreadable", 2)
