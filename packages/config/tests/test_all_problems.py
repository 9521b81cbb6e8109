"""A run file or profile with several mistakes reports every one, each at its file:line:col, in file order."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from ruamel.yaml import YAML

from ddslurm.config import ConfigFileError, ConfigFileErrors, RunFile, load_profile, load_run_file, load_struct

RUN = """\
name: demo
recipe: recipe.yaml
num_record: 10
shards: two
deployments:
  - model_alias: writer
    model: m
    replicass: 2
  - model_alias: judge
submission:
  partition: "gpu nodes"
  cpus: x
  extra_sbatch: ["--output=x", "--exclusive"]
"""


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_every_problem_of_a_run_file_is_reported_at_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, RUN)

    with pytest.raises(ConfigFileErrors) as info:
        load_run_file(path)

    got = [(p.line, p.col, p.field, p.message) for p in info.value.problems]
    assert got == [
        (1, 1, "num_records", "required field is missing"),
        (3, 1, "num_record", "unknown field; did you mean 'num_records'?"),
        (4, 1, "shards", "expected int, got str"),
        (8, 5, "deployments[0].replicass", "unknown field; did you mean 'replicas'?"),
        (9, 5, "deployments[1].model", "required field is missing"),
        (
            11,
            3,
            "submission.partition",
            "'gpu nodes' has whitespace (sbatch would read what follows as another option); it must be one Slurm "
            "name or several separated by commas (letters, digits, '.', '_', '+' and '-', each starting with a "
            "letter or digit)",
        ),
        (12, 3, "submission.cpus", "expected int, got str"),
        (
            13,
            18,
            "submission.extra_sbatch[0]",
            "--output is set by ddslurm (each job's log in the run's logs/ directory); remove it",
        ),
    ]
    # The message is one line per problem, each as a single error would say it; the first is the error's own place.
    assert str(info.value).splitlines() == [str(p) for p in info.value.problems]
    assert str(info.value).splitlines()[1] == f"{path}:3:1: num_record: unknown field; did you mean 'num_records'?"
    first = info.value.problems[0]
    assert (info.value.path, info.value.line, info.value.col, info.value.field) == (path, 1, 1, "num_records")
    assert info.value.message == first.message


def test_one_problem_is_one_plain_error_as_before(tmp_path: Path) -> None:
    path = write(tmp_path, "name: demo\nrecipe: r.yaml\nnum_records: 3\nshards: 0\n")

    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)

    assert type(info.value) is ConfigFileError
    assert info.value.problems == (info.value,)
    assert str(info.value) == f"{path}:4:1: shards: expected int >= 1"


def test_refusals_of_the_whole_file_come_with_its_type_errors(tmp_path: Path) -> None:
    # A bad recipe reference and a bad account are refused by the run file's own checks, which need the other
    # fields converted: a wrong optional field (buffer_size) takes its default for them.
    path = write(
        tmp_path,
        "name: demo\nrecipe: 'r.yaml:make'\nnum_records: 3\nbuffer_size: -1\nsubmission:\n  account: 'a;b'\n",
    )

    with pytest.raises(ConfigFileErrors) as info:
        load_run_file(path)

    assert [(p.line, p.field) for p in info.value.problems] == [
        (2, "recipe"),
        (4, "buffer_size"),
        (6, "submission.account"),
    ]
    assert "a ':make' suffix names the function" in info.value.problems[0].message


def test_a_required_field_in_error_does_not_hide_the_checks_of_the_others(tmp_path: Path) -> None:
    path = write(tmp_path, "name: -bad\nrecipe: r.yaml\nnum_records: 3\nsubmission:\n  qos: 'a b'\n")

    with pytest.raises(ConfigFileErrors) as info:
        load_run_file(path)

    assert [(p.line, p.field) for p in info.value.problems] == [(1, "name"), (5, "submission.qos")]


def test_every_problem_of_a_profile_is_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workspace: '/w s'\npython_env: /e\ngpus_per_nod: 4\npartition: 'a b'\nextra_sbatch: [--chdir=/x]\n",
        "profile.yaml",
    )

    with pytest.raises(ConfigFileErrors) as info:
        load_profile(path)

    assert [(p.line, p.col, p.field) for p in info.value.problems] == [
        (1, 1, "workspace"),
        (3, 1, "gpus_per_nod"),
        (4, 1, "partition"),
        (5, 16, "extra_sbatch[0]"),
    ]
    assert info.value.problems[1].message == "unknown field; did you mean 'gpus_per_node'?"


def test_a_valid_file_loads_as_msgspec_converts_it(tmp_path: Path) -> None:
    text = "name: demo\nrecipe: r.yaml\nnum_records: 3\ndeployments:\n  - {model_alias: a, model: m, replicas: 2}\n"
    path = write(tmp_path, text)

    assert load_run_file(path) == msgspec.convert(YAML(typ="safe").load(text), RunFile)  # an independent reading


class Leaf(msgspec.Struct, forbid_unknown_fields=True):
    size: int


class Tree(msgspec.Struct, forbid_unknown_fields=True):
    leaves: list[Leaf] = msgspec.field(default_factory=list)
    top: Leaf | None = None


def test_structs_in_lists_and_optional_structs_are_walked_too(tmp_path: Path) -> None:
    path = write(tmp_path, "leaves:\n  - size: a\n  - sise: 2\ntop:\n  size: []\n", "x.yaml")

    with pytest.raises(ConfigFileErrors) as info:
        load_struct(path, Tree)

    assert [(p.line, p.field, p.message) for p in info.value.problems] == [
        (2, "leaves[0].size", "expected int, got str"),
        (3, "leaves[1].sise", "unknown field; did you mean 'size'?"),
        (3, "leaves[1].size", "required field is missing"),
        (5, "top.size", "expected int, got array"),
    ]
