"""Issue 17, launcher side ("exactly the rows, whatever the layout"): the automatic retry chain depends on every
earlier level, a pulling shard's own attempt record speaks once it ended, ``cancel`` finds arrays whose sbatch
timed out, and ``accept-partial`` of a two-stage shard whose GPU stage ended short."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddslurm.config import Plan, RunLayout, SubmissionRecord, SubmitPlanRecord, read_json
from ddslurm.launcher import Slurm
from ddslurm.launcher._console import plan_lines
from ddslurm.launcher._output import array_json
from ddslurm.launcher._slurm import Completed
from ddslurm.launcher._steer import continue_submission
from ddslurm.launcher._submit import (
    PartialSubmitError,
    plan_submission,
    prepare,
    read_limits,
    submit_shards,
    write_run_dir,
)
from ddslurm.launcher.testing import FakeSlurm, write_unit_run

KEY = "sk-exact-rows-test-value-0123"


def _records(layout: RunLayout) -> list[SubmissionRecord]:
    return sorted(
        (read_json(p, SubmissionRecord) for p in layout.submissions.glob("*.json")), key=lambda r: int(r.array_job_id)
    )


def _dependency(script: str) -> str | None:
    found = re.search(r"^#SBATCH --dependency=(\S+)$", script, re.MULTILINE)
    return None if found is None else found.group(1)


def _run(tmp_path: Path, extra: str, shards: int = 3) -> tuple[RunLayout, dict[str, str], Plan]:
    run, profile, env = write_unit_run(tmp_path, KEY, num_records=4 * shards, shards=shards, run_extra=extra)
    now = datetime.now(UTC)
    prepared = prepare(run, profile, env, now, check_recipe=lambda *_: [])
    write_run_dir(prepared)
    return prepared.layout, env, prepared.plan


class _FailsSecondSbatch(FakeSlurm):
    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        if argv[0] == "sbatch" and len(self.commands("sbatch")) == 1:
            self.calls.append(list(argv))
            return Completed(1, "", "sbatch: error: Batch job submission failed")
        return super().__call__(argv, env=env)


# --- item 7: retry level k follows afternotok of every earlier level of its chain ---


def test_each_automatic_retry_level_waits_for_the_failure_of_every_earlier_level(tmp_path: Path) -> None:
    layout, env, plan = _run(tmp_path, "retries: 3\n")
    submit_shards(layout, plan, [0, 1, 2], Slurm(FakeSlurm()), env, datetime.now(UTC))
    records = _records(layout)
    assert [r.kind for r in records] == ["initial", "auto-retry", "auto-retry", "auto-retry"]
    jobs = [r.array_job_id for r in records]
    deps = [_dependency(Path(r.script).read_text()) for r in records]
    # Level 0 succeeding makes Slurm cancel level 1; level 2 must not count that cancellation as a failure.
    assert deps == [
        None,
        f"afternotok:{jobs[0]}",
        f"afternotok:{jobs[1]}:{jobs[0]}",
        f"afternotok:{jobs[2]}:{jobs[1]}:{jobs[0]}",
    ]
    assert all("#SBATCH --kill-on-invalid-dep=yes" in Path(r.script).read_text() for r in records[1:])
    assert [r.after for r in records] == [None, jobs[0], jobs[1], jobs[2]]  # the array each level follows


def test_the_dry_run_and_its_json_show_the_whole_chain(tmp_path: Path) -> None:
    layout, _, plan = _run(tmp_path, "retries: 2\n")
    planned = plan_submission(plan, layout, [0, 1, 2], read_limits(Slurm(FakeSlurm()), plan), stamp="s")
    lines = plan_lines(planned)
    assert lines[1].endswith("(initial)")
    assert lines[2].endswith("(auto-retry)  --dependency=afternotok:<array 0>")
    assert lines[3].endswith("(auto-retry)  --dependency=afternotok:<array 1>:<array 0>")
    assert [array_json(a, plan=planned.arrays)["after_failure_of"] for a in planned.arrays] == [[], [0], [1, 0]]
    assert [array_json(a)["after"] for a in planned.arrays] == [None, 0, 1]


def test_submit_continue_gives_a_later_level_the_job_ids_of_every_earlier_level(tmp_path: Path) -> None:
    layout, env, plan = _run(tmp_path, "retries: 2\n")

    with pytest.raises(PartialSubmitError):  # the second sbatch fails: level 0 is queued, levels 1 and 2 are not
        submit_shards(layout, plan, [0, 1, 2], Slurm(_FailsSecondSbatch()), env, datetime.now(UTC))
    assert read_json(layout.submit_plan, SubmitPlanRecord).arrays[2].after == 1
    later = FakeSlurm()
    later.next_id = 5000
    done = continue_submission(layout, Slurm(later), env)
    records = _records(layout)
    assert len(records) == 3 and len(done.job_ids) == 2
    by_index = {r.plan_index: r for r in records}
    first, second = by_index[0].array_job_id, by_index[1].array_job_id
    assert _dependency(Path(by_index[1].script).read_text()) == f"afternotok:{first}"
    assert _dependency(Path(by_index[2].script).read_text()) == f"afternotok:{second}:{first}"
