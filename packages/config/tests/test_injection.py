"""Values that reach Slurm or the batch script are validated as the values they are, at ``FILE:LINE:COL``.

A newline in a partition name became a shell command of the batch script, a space an extra sbatch option, and
``name: "inj\\n"`` passed a ``^...$`` pattern; here each is refused where the file says it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddslurm.config import ClusterProfile, ConfigFileError, load_profile, load_run_file

MINIMAL = "name: demo\nrecipe: recipe.yaml\nnum_records: 10\n"
PROFILE = "workspace: /srv/ws\npython_env: /srv/env\n"
HF = "hf_" + "AbCdEfGh1234567890" * 2


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, *, profile: bool = False) -> ConfigFileError:
    with pytest.raises(ConfigFileError) as info:
        load_profile(path) if profile else load_run_file(path)
    return info.value


def q(value: str) -> str:
    """``value`` as a YAML scalar (JSON is YAML): newlines and tabs survive as escapes."""
    return json.dumps(value)


# --- patterns anchored at the true end ---------------------------------------------------------------------------


def test_a_name_with_a_trailing_newline_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "run.yaml", 'recipe: r.yaml\nname: "inj\\n"\nnum_records: 3\n')
    err = refused(path)
    assert (err.line, err.col, err.field) == (2, 1, "name")


def test_an_env_from_name_with_a_trailing_newline_is_refused_at_its_item(tmp_path: Path) -> None:
    text = MINIMAL + 'deployments:\n  - model_alias: a\n    model: m\n    server:\n      env_from: ["HF_TOKEN\\n"]\n'
    err = refused(write(tmp_path / "run.yaml", text))
    assert err.field == "deployments[0].server.env_from[0]"
    assert (err.line, err.col) == (8, 18)


# --- scheduler names in the run file -----------------------------------------------------------------------------

BAD_NAMES = [
    pytest.param("gpu\ntouch /tmp/pwned", "newline", id="newline-command"),
    pytest.param("gpu\n", "newline", id="trailing-newline"),
    pytest.param("gpu --hold", "whitespace", id="space-option"),
    pytest.param("gpu\t", "whitespace", id="tab"),
    pytest.param("gpu;id", "';'", id="semicolon"),
    pytest.param("gpu'x", '"\'"', id="quote"),
    pytest.param("gpu#x", "'#'", id="comment"),
    pytest.param("gpu\x1b[0m", "control", id="escape-sequence"),
    pytest.param("", "empty", id="empty"),
]


@pytest.mark.parametrize("field", ["partition", "account", "qos", "reservation", "constraint"])
@pytest.mark.parametrize(("value", "why"), BAD_NAMES)
def test_submission_scheduler_names_are_refused_at_their_field(
    tmp_path: Path, field: str, value: str, why: str
) -> None:
    path = write(tmp_path / "run.yaml", MINIMAL + f"submission:\n  cpus: 2\n  {field}: {q(value)}\n")
    err = refused(path)
    assert (err.line, err.col, err.field) == (6, 3, f"submission.{field}")
    assert why in err.message
    assert str(err).startswith(f"{path}:6:3: submission.{field}: ")


@pytest.mark.parametrize(("value", "why"), BAD_NAMES)
def test_collection_partition_is_refused_at_its_field(tmp_path: Path, value: str, why: str) -> None:
    path = write(tmp_path / "run.yaml", MINIMAL + f"collection:\n  partition: {q(value)}\n")
    err = refused(path)
    assert (err.line, err.col, err.field) == (5, 3, "collection.partition")
    assert why in err.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("submission.memory", "16G\n", id="submission-memory-newline"),
        pytest.param("submission.memory", "16G --hold", id="submission-memory-space"),
        pytest.param("collection.memory", "4G\nid", id="collection-memory"),
    ],
)
def test_memory_sizes_are_refused_at_their_field(tmp_path: Path, field: str, value: str) -> None:
    section, key = field.split(".")
    path = write(tmp_path / "run.yaml", MINIMAL + f"{section}:\n  {key}: {q(value)}\n")
    err = refused(path)
    assert (err.line, err.col, err.field) == (5, 3, field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partition", "gpu"),
        ("partition", "gpu,gpu-large"),
        ("account", "proj_a-1"),
        ("account", "my.account+x"),
        ("qos", "high"),
        ("reservation", "maint.2026"),
        ("reservation", "r1,r2"),
        ("constraint", "intel&gpu"),
        ("constraint", "intel|amd"),
        ("constraint", "[rack1|rack2|rack3]"),
        ("constraint", "[rack1*2&rack2*4]"),
        ("constraint", "[(knl&snc4&flat)*4&haswell*1]"),
        ("constraint", "gpu:a100,nvlink"),
        ("memory", "16G"),
        ("memory", "500"),
        ("memory", "1.5T"),
    ],
)
def test_what_slurm_accepts_is_kept(tmp_path: Path, field: str, value: str) -> None:
    run = load_run_file(write(tmp_path / "run.yaml", MINIMAL + f"submission:\n  {field}: {q(value)}\n"))
    assert getattr(run.submission, field) == value


# --- extra_sbatch: one long option per item, none that ddslurm owns ---------------------------------------------


@pytest.mark.parametrize(
    ("item", "why"),
    [
        pytest.param("--exclusive\ntouch /tmp/pwned", "newline", id="newline-command"),
        pytest.param("--exclusive --hold", "whitespace", id="two-options"),
        pytest.param("--comment=a b", "whitespace", id="space-in-value"),
        pytest.param("--comment=a#b", "'#'", id="comment-in-value"),
        pytest.param("--comment='x'", '"\'"', id="quoted-value"),
        pytest.param("--comment=a\\b", "'\\\\'", id="backslash"),
        pytest.param("-w", "one long sbatch option", id="short-option"),
        pytest.param("exclusive", "one long sbatch option", id="no-dashes"),
        pytest.param("--", "one long sbatch option", id="bare-dashes"),
        pytest.param("--output=/tmp/x-%j.out", "--output", id="output"),
        pytest.param("--out=/tmp/x", "--output", id="abbreviated-output"),
        pytest.param("--error=/tmp/x", "--error", id="error"),
        pytest.param("--hold", "--hold", id="hold"),
        pytest.param("--export=ALL", "--export", id="export"),
        pytest.param("--export-file=/tmp/env", "--export-file", id="export-file"),
        pytest.param("--get-user-env", "--get-user-env", id="get-user-env"),
        pytest.param("--chdir=/", "--chdir", id="chdir"),
        pytest.param("--array=0-99", "--array", id="array"),
        pytest.param("--wrap=id", "--wrap", id="wrap"),
        pytest.param("--partition=other", "submission.partition", id="owned-partition"),
        pytest.param("--time=9999", "submission.time_limit", id="owned-time"),
        pytest.param("--dependency=afterok:1", "--dependency", id="dependency"),
        pytest.param("--wait", "--wait", id="wait"),
        pytest.param("--clusters=other", "--clusters", id="clusters"),
    ],
)
def test_extra_sbatch_items_are_refused_at_their_item(tmp_path: Path, item: str, why: str) -> None:
    path = write(tmp_path / "run.yaml", MINIMAL + f"submission:\n  extra_sbatch:\n    - --exclusive\n    - {q(item)}\n")
    err = refused(path)
    assert (err.line, err.col, err.field) == (7, 7, "submission.extra_sbatch[1]")
    assert why in err.message


@pytest.mark.parametrize(
    "item",
    [
        "--exclusive",
        "--begin=now+1hour",
        "--nodelist=node[1-3]",
        "--exclude=n1,n2",
        "--mail-type=END,FAIL",
        "--mail-user=someone@example.org",
        "--comment=ddslurm",
        "--gres-flags=enforce-binding",
        "--time-min=30",
        "--licenses=matlab:1",
        "--requeue",
    ],
)
def test_ordinary_extra_sbatch_options_are_kept(tmp_path: Path, item: str) -> None:
    run = load_run_file(write(tmp_path / "run.yaml", MINIMAL + f"submission:\n  extra_sbatch: [{q(item)}]\n"))
    assert run.submission.extra_sbatch == (item,)


# --- server.extra_args: no credentials ---------------------------------------------------------------------------

SERVER = MINIMAL + "deployments:\n  - model_alias: a\n    model: m\n    server:\n      extra_args:\n"


@pytest.mark.parametrize(
    ("args", "index", "why"),
    [
        pytest.param(["--hf-token", HF], 1, "env_from", id="hf-token-value"),
        pytest.param([f"--hf-token={HF}"], 0, "env_from", id="hf-token-inline"),
        pytest.param(["--max-num-seqs", "8", "--token", "not-a-real-token-but-long"], 3, "env_from", id="token"),
        pytest.param(["--db-password=correct-horse-battery"], 0, "env_from", id="password-inline"),
        pytest.param(["--client-secret", "correct-horse-battery"], 1, "env_from", id="secret"),
        pytest.param(["--upstream", "sk-proj-0123456789abcdef"], 1, "starts like an API key", id="key-like-value"),
        pytest.param(["--hub=https://user:s3cr3t-pass@hub.example/v1"], 0, "URL with credentials", id="url"),
        pytest.param(["--api-key", "abc"], 0, "set by ddslurm itself", id="api-key"),
        pytest.param(["--api-key=abc"], 0, "set by ddslurm itself", id="api-key-inline"),
        pytest.param(["--api_key", "abc"], 0, "set by ddslurm itself", id="api-key-underscore"),
        pytest.param(["--api-key"], 0, "set by ddslurm itself", id="api-key-bare"),
    ],
)
def test_server_extra_args_refuse_credentials_without_echoing_them(
    tmp_path: Path, args: list[str], index: int, why: str
) -> None:
    items = "".join(f"        - {q(a)}\n" for a in args)
    path = write(tmp_path / "run.yaml", SERVER + items)
    err = refused(path)
    assert err.field == f"deployments[0].server.extra_args[{index}]"
    assert (err.line, err.col) == (9 + index, 11)
    assert why in err.message
    for secret in (HF, "not-a-real-token-but-long", "correct-horse-battery", "sk-proj-0123456789abcdef", "s3cr3t"):
        assert secret not in str(err)


@pytest.mark.parametrize(
    "args",
    [
        ["--max-num-seqs", "128"],
        ["--hf-token"],
        ["--ssl-keyfile", "/etc/ssl/private/server-key.pem"],
        ["--tokenizer", "meta-llama/Llama-3.1-8B-Instruct"],
        ["--return-tokens-as-token-ids", "--allow-credentials"],
        ["--revision", "2c2b3f7d0e1a4b5c6d7e8f9a0b1c2d3e4f5a6b7c"],
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        ["--max-num-batched-tokens=8192"],
    ],
)
def test_ordinary_server_extra_args_are_kept(tmp_path: Path, args: list[str]) -> None:
    items = "".join(f"        - {q(a)}\n" for a in args)
    run = load_run_file(write(tmp_path / "run.yaml", SERVER + items))
    assert run.deployments[0].server.extra_args == tuple(args)


# --- the cluster profile -----------------------------------------------------------------------------------------

BAD_PATHS = [
    pytest.param("/srv/my ws", "whitespace", id="space"),
    pytest.param("/srv/ws\ntouch /tmp/pwned", "newline", id="newline"),
    pytest.param("/srv/ws\t", "whitespace", id="tab"),
    pytest.param("/srv/ws'x", '"\'"', id="single-quote"),
    pytest.param('/srv/ws"x', "'\"'", id="double-quote"),
    pytest.param("/srv/ws%j", "'%'", id="percent"),
    pytest.param("/srv/$HOME", "'$'", id="dollar"),
    pytest.param("/srv/`id`", "backquote", id="backquote"),
    pytest.param("/srv/ws#1", "'#'", id="hash"),
    pytest.param("/srv/ws\\x", "'\\\\'", id="backslash"),
    pytest.param("/srv/ws\x07", "control", id="control"),
    pytest.param("rel ws", "whitespace", id="relative-with-space"),
]


@pytest.mark.parametrize("field", ["workspace", "python_env"])
@pytest.mark.parametrize(("value", "why"), BAD_PATHS)
def test_profile_paths_sbatch_cannot_take_are_refused_at_their_field(
    tmp_path: Path, field: str, value: str, why: str
) -> None:
    values = {"workspace": "/srv/ws", "python_env": "/srv/env", field: value}
    text = f"name: site\nworkspace: {q(values['workspace'])}\npython_env: {q(values['python_env'])}\n"
    path = write(tmp_path / "profile.yaml", text)
    err = refused(path, profile=True)
    line = 2 if field == "workspace" else 3
    assert (err.line, err.col, err.field) == (line, 1, field)
    assert why in err.message
    assert str(err).startswith(f"{path}:{line}:1: {field}: ")


@pytest.mark.parametrize("field", ["account", "partition", "cpu_partition"])
@pytest.mark.parametrize(("value", "why"), BAD_NAMES)
def test_profile_scheduler_names_are_refused_at_their_field(tmp_path: Path, field: str, value: str, why: str) -> None:
    path = write(tmp_path / "profile.yaml", PROFILE + f"{field}: {q(value)}\n")
    err = refused(path, profile=True)
    assert (err.line, err.col, err.field) == (3, 1, field)
    assert why in err.message


def test_profile_memory_per_gpu_is_refused_at_its_field(tmp_path: Path) -> None:
    err = refused(write(tmp_path / "profile.yaml", PROFILE + 'memory_per_gpu: "64G\\nid"\n'), profile=True)
    assert (err.line, err.col, err.field) == (3, 1, "memory_per_gpu")


@pytest.mark.parametrize(
    ("item", "why"),
    [
        pytest.param("--exclusive\ntouch /tmp/pwned", "newline", id="newline"),
        pytest.param("--qos=a --hold", "whitespace", id="space"),
        pytest.param("--output=/tmp/x", "--output", id="output"),
        pytest.param("--account=x", "account", id="owned-account"),
    ],
)
def test_profile_extra_sbatch_items_are_refused_at_their_item(tmp_path: Path, item: str, why: str) -> None:
    path = write(tmp_path / "profile.yaml", PROFILE + f"extra_sbatch:\n  - --comment=ok\n  - {q(item)}\n")
    err = refused(path, profile=True)
    assert (err.line, err.col, err.field) == (5, 5, "extra_sbatch[1]")
    assert why in err.message


def test_a_profile_with_ordinary_values_loads(tmp_path: Path) -> None:
    text = (
        "workspace: /srv/ddslurm-work/team_a.1\npython_env: ../envs/py3.12+cu\naccount: proj-a\npartition: gpu,gpu2\n"
        "cpu_partition: cpu\nmemory_per_gpu: 64G\nextra_sbatch: [--comment=ddslurm, --exclusive]\n"
    )
    profile = load_profile(write(tmp_path / "profile.yaml", text))
    assert profile.workspace == "/srv/ddslurm-work/team_a.1"
    assert profile.extra_sbatch == ("--comment=ddslurm", "--exclusive")


def test_a_profile_built_in_python_is_checked_too() -> None:
    with pytest.raises(ValueError, match="whitespace"):
        ClusterProfile(workspace="/srv/my ws", python_env="/srv/env")


@pytest.mark.parametrize("folder", ["my dir", "100%"])
def test_a_relative_workspace_in_a_folder_sbatch_cannot_take_is_refused_at_its_line(
    tmp_path: Path, folder: str
) -> None:
    """The relative path is judged once made absolute: a space or '%' of the profile's own folder got past as a
    bare validation error (no file, line or field)."""
    (tmp_path / folder).mkdir()
    error = refused(write(tmp_path / folder / "profile.yaml", "python_env: /srv/env\nworkspace: ws\n"), profile=True)
    assert (error.line, error.field) == (2, "workspace") and folder in str(error)
