"""Issue 39: status and the report read an attempt's array task by the one reader
(:func:`ddslurm.config.batch_output_task`), so they name the same job for the same attempt records: the array task
for ``slurm-<array>_<task>.out``, the attempt's own job id for ``slurm-123.out`` (job 123's output, no array's) and
for any other name. (Status used to read ``slurm-123.out`` as array task ``123``, the report as no array task.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from ddslurm.collector.testing import make_published_run
from ddslurm.config import AttemptRecord, SubmissionRecord, atomic_write, encode, publish_once
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.report import run_report
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.testing import FakeSlurm

# (the name of the winning attempt's batch output, its job id, the job both must name)
ATTEMPTS = [
    ("slurm-44_0.out", "45", "44_0"),
    ("slurm-123.out", "130", "130"),
    ("slurm-44_2.out.1", "46", "46"),
    ("slurm-44_[0-3].out", "47", "47"),
    (None, "48", "48"),
]


def test_status_and_the_report_name_the_same_job_for_each_attempt(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [i]})] for i in range(len(ATTEMPTS))])
    layout.submissions.mkdir()
    submitted = SubmissionRecord(
        array_job_id="44", shards=tuple(range(len(ATTEMPTS))), submitted_at="2026-01-01T00:00:00+00:00", script="-"
    )
    publish_once(layout.submissions / "44.json", encode(submitted))
    for shard, (name, job_id, _) in enumerate(ATTEMPTS):  # the winner of each shard is its attempt-1
        record = AttemptRecord(
            shard=shard, attempt="attempt-1", job_id=job_id, node="n1", state="succeeded",
            started_at="2026-01-01T00:00:01+00:00", ended_at="2026-01-01T00:00:09+00:00", rows=1,
            slurm_log=None if name is None else str(layout.logs / name),
        )  # fmt: skip
        atomic_write(layout.shard(shard).attempt("attempt-1").record, encode(record))

    status = run_status(layout, Slurm(FakeSlurm()))
    report = run_report(layout, Slurm(FakeSlurm()))

    want = [job for _, _, job in ATTEMPTS]
    assert [s.state for s in status.shards] == ["succeeded"] * len(ATTEMPTS)
    assert [s.job_id for s in status.shards] == want
    assert [span.job for span in sorted(report.timeline, key=lambda span: span.shard)] == want
