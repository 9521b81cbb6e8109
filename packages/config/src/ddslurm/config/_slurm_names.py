"""The names of a Slurm array task and of its batch output: made and read here, nowhere else.

An array task is ``<array job id>_<task index>`` (``4242_3``), as ``squeue`` and ``sacct`` print it and as status
and the report name the allocation an attempt ran in. Every generation array is submitted with
``--output=<run>/logs/``:data:`BATCH_OUTPUT_PATTERN`, so Slurm writes task ``4242_3``'s batch output to
``logs/slurm-4242_3.out`` (:meth:`ArrayTask.batch_output`, :meth:`~ddslurm.config.RunLayout.batch_output`); the
runtime records that path in each attempt it begins (``AttemptRecord.slurm_log``), and status, the report and the
measured facts read the task back from it (:func:`batch_output_task`).

Only these exact forms are an array task's (digits without leading zeros, so that a name read back is the name that
was made): ``slurm-123.out`` is the batch output of job 123 that is no array (sbatch's default ``slurm-%j.out``),
not of a task of array 123, and :func:`batch_output_task` says None for it, as for a range (``4242_[0-3]``), a
throttle, a name with anything around it, or no name at all. Whoever needs an attempt's job then takes its own job
id (:func:`attempt_job`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddslurm.config._records import AttemptRecord

BATCH_OUTPUT_PATTERN = "slurm-%A_%a.out"
"""The ``sbatch --output`` file name of every generation array (``%A``: the array job id, ``%a``: the task index),
in the run's ``logs/``."""

_PREFIX, _SUFFIX = "slurm-", ".out"
_NUMBER = "(?:0|[1-9][0-9]*)"
_ARRAY_TASK = re.compile(f"({_NUMBER})_({_NUMBER})")


@dataclass(frozen=True, slots=True)
class ArrayTask:
    """Task ``task`` of array job ``array_job_id``; ``str()`` gives ``<array>_<task>`` (``4242_3``)."""

    array_job_id: str
    task: int

    def __str__(self) -> str:
        return f"{self.array_job_id}_{self.task}"

    @property
    def batch_output(self) -> str:
        """The name of its batch output file: ``slurm-<array>_<task>.out`` (:data:`BATCH_OUTPUT_PATTERN`)."""
        return f"{_PREFIX}{self}{_SUFFIX}"


def parse_array_task(job: str) -> ArrayTask | None:
    """``4242_3`` → ``ArrayTask("4242", 3)``; None for anything else: a job that is no array task (``4242``), a
    range of tasks (``4242_[0-3]``), other text."""
    m = _ARRAY_TASK.fullmatch(job)
    return ArrayTask(m.group(1), int(m.group(2))) if m else None


def batch_output_task(path: str | os.PathLike[str] | None) -> ArrayTask | None:
    """The array task whose batch output ``path`` is, by its file name (``logs/slurm-4242_3.out`` →
    ``ArrayTask("4242", 3)``); None when it is not an array task's (``slurm-123.out``: job 123, no array; see the
    module's docstring) or there is no path."""
    if path is None:
        return None
    name = PurePath(path).name
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        return None
    return parse_array_task(name[len(_PREFIX) : -len(_SUFFIX)])


def attempt_job(record: AttemptRecord) -> str:
    """The job an attempt ran as, as Slurm names it: the array task that began it (``4242_3``, from its batch
    output), else its own job id. Status and the report both name an attempt's job by this."""
    task = batch_output_task(record.slurm_log)
    return record.job_id if task is None else str(task)
