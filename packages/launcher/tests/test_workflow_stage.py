"""A Data Designer workflow's stages as runs: each stage's records by Data Designer's rule, the run file's
``num_records`` refused at its line when the first stage makes another number, and the next stage's run submitted
once however often ``ddslurm workflow`` asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import RunLayout, WorkflowStage, load_run_file, read_json
from ddslurm.config import WorkflowNext as Next
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.runs import _workflow
from ddslurm.launcher.runs._workflow import next_stage, stage_submitter
from ddslurm.launcher.submission._recipe import LoadedWorkflow, StageRequest
from ddslurm.launcher.submission._workflow_stage import stage_run

STAGES = (WorkflowStage(name="draft", num_records=7), WorkflowStage(name="improve"), WorkflowStage(name="more"))


def _files(tmp_path: Path, records: int) -> tuple[Path, Path]:
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"name: wf\nrecipe: build.py\nnum_records: {records}\nshards: 3\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text("name: p\n")
    return run_file, profile


def _request(tmp_path: Path, index: int, rows: int) -> StageRequest:
    previous = RunLayout(tmp_path / "runs" / f"stage-{index}")
    return StageRequest(index=index, previous=previous, rows=rows, stages=tuple(s.name for s in STAGES))


def test_each_stage_makes_its_own_records_or_those_of_the_stage_before(tmp_path: Path) -> None:
    run_file, profile = _files(tmp_path, 7)
    run = load_run_file(run_file)
    first, place = stage_run(run, run_file, profile, LoadedWorkflow("qa", STAGES, 0), None)
    assert (first.num_records, first.name, place.index, place.previous_run) == (7, "wf", 0, None)
    assert place.label() == "stage 1/3 'draft' of workflow 'qa'" and not place.last
    assert (place.run_file, place.profile) == (str(run_file.resolve()), str(profile.resolve()))
    second, place = stage_run(run, run_file, profile, LoadedWorkflow("qa", STAGES, 1), _request(tmp_path, 1, 5))
    assert (second.num_records, second.name, place.previous_run) == (5, "wf-2", str(tmp_path / "runs" / "stage-1"))
    own = (*STAGES[:2], WorkflowStage(name="more", num_records=11))
    third, place = stage_run(run, run_file, profile, LoadedWorkflow("qa", own, 2), _request(tmp_path, 2, 5))
    assert (third.num_records, third.name, place.last) == (11, "wf-3", True)


@pytest.mark.parametrize(("stage", "says"), [(STAGES[0], "its num_records"), (WorkflowStage(name="draft"), "default")])
def test_a_run_file_whose_num_records_is_not_the_first_stages_is_refused_at_its_line(
    tmp_path: Path, stage: WorkflowStage, says: str
) -> None:
    run_file, profile = _files(tmp_path, 9)
    with pytest.raises(SubmitError) as refused:
        stage_run(load_run_file(run_file), run_file, profile, LoadedWorkflow("qa", (stage, *STAGES[1:]), 0), None)
    records = stage.num_records or 10
    said = str(refused.value)
    assert said.startswith(f"{run_file}:3:1: num_records: 9, but the recipe is a Data Designer workflow "), said
    assert f"first stage 'draft' makes {records} records" in said and says in said
    assert f"set num_records: {records}" in said


def test_the_next_stage_is_submitted_once_and_then_followed(tmp_path: Path) -> None:
    run_file, profile = _files(tmp_path, 7)
    run = load_run_file(run_file)
    _, place = stage_run(run, run_file, profile, LoadedWorkflow("qa", STAGES, 0), None)
    layout = RunLayout(tmp_path / "runs" / "first")
    layout.root.mkdir(parents=True, mode=0o700)
    asked: list[StageRequest] = []

    def submit_stage(run_path: Path, profile_path: Path, request: StageRequest) -> RunLayout:
        assert (run_path, profile_path) == (run_file.resolve(), profile.resolve())
        asked.append(request)
        return RunLayout(tmp_path / "runs" / f"next-{len(asked)}")

    first = next_stage(layout, place, 7, submit_stage)
    again = next_stage(layout, place, 7, submit_stage)
    assert first.root == again.root == tmp_path / "runs" / "next-1"
    assert [(r.index, r.previous.root, r.rows, r.stages) for r in asked] == [
        (1, layout.root, 7, ("draft", "improve", "more"))
    ]
    assert read_json(layout.workflow_next, Next).run_dir == str(first.root)


@pytest.mark.parametrize("accept", [False, True])
def test_a_later_stage_is_submitted_with_the_workflows_overrun_confirmation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accept: bool
) -> None:
    """``ddslurm workflow --accept-overrun`` confirms a later stage's overrun as ``submit --accept-overrun`` does;
    without it the stage's submit refuses an overrun as any submit does."""
    seen: list[dict[str, object]] = []

    class Done:
        layout = RunLayout(tmp_path / "runs" / "next")

    def submit(*args: object, **kwargs: object) -> Done:
        seen.append(kwargs)
        return Done()

    monkeypatch.setattr(_workflow, "submit", submit)
    request = _request(tmp_path, 1, 7)
    submitted = stage_submitter(object(), {}, accept_overrun=accept)  # type: ignore[arg-type]
    assert submitted(tmp_path / "run.yaml", tmp_path / "profile.yaml", request).root == Done.layout.root
    assert [(k["accept_overrun"], k["stage"]) for k in seen] == [(accept, request)]
