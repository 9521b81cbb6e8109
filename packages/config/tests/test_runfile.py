"""Run-file loading: defaults, full files, and exact ``FILE:LINE:COL: field: message`` errors."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ddslurm.config import ConfigFileError, Deployment, RunFile, ServerSpec, Submission, load_run_file

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

MINIMAL = "name: demo\nrecipe: recipe.yaml\nnum_records: 10\n"

UNKNOWN_KEY = "unknown field (check the spelling; see the docs for the accepted keys)"
MISSING = "required field is missing"


def plain(obj: object) -> object:
    """JSON-shaped builtins (tuples become lists), for comparing whole structs with literal dicts."""
    return msgspec.json.decode(msgspec.json.encode(obj))


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_run_file_fills_every_default(tmp_path: Path) -> None:
    run = load_run_file(write(tmp_path, MINIMAL))

    assert plain(run) == {
        "name": "demo",
        "recipe": "recipe.yaml",
        "num_records": 10,
        "shards": 1,
        "resume": "if_possible",
        "buffer_size": None,
        "max_concurrent": None,
        "allocations": "auto",
        "client_workers": "auto",
        "retries": 0,
        "client_retries": 1,
        "provider_wait": 300,
        "max_empty_outputs": 0,
        "gpus": None,
        "deadline": None,
        "stages": "auto",
        "deployments": [],
        "hosted_limits": {},
        "prices": None,
        "submission": {
            "account": None,
            "partition": None,
            "qos": None,
            "time_limit": "01:00:00",
            "memory": None,
            "cpus": 2,
            "constraint": None,
            "reservation": None,
            "extra_sbatch": [],
        },
        "collection": {"partition": None, "memory": None, "time_limit": "00:30:00", "cpus": 1},
        "run_config": {},
    }


def test_full_run_file_keeps_every_value(tmp_path: Path) -> None:
    text = """\
name: full.run-1
recipe: ../recipes/r.yaml
num_records: 1000
shards: 8
resume: never
buffer_size: 50
max_empty_outputs: 3
deployments:
  - model_alias: writer
    model: meta/llama-3.1-8b
    served_model_name: llama
    replicas: 2
    tensor_parallel: 4
    server:
      port: 8100
      extra_args: ["--max-model-len", "8192"]
submission:
  account: acct
  partition: batch
  qos: high
  time_limit: 90
  memory: 16G
  cpus: 4
  constraint: a100
  reservation: resv
  extra_sbatch: ["--exclusive"]
collection:
  partition: cpu
  memory: 1G
  time_limit: "00:10:00"
  cpus: 3
"""
    run = load_run_file(write(tmp_path, text))

    assert run.name == "full.run-1"
    assert run.recipe == "../recipes/r.yaml"
    assert (run.num_records, run.shards, run.resume, run.buffer_size) == (1000, 8, "never", 50)
    assert run.max_empty_outputs == 3
    assert run.deployments == (
        Deployment(
            model_alias="writer",
            model="meta/llama-3.1-8b",
            served_model_name="llama",
            replicas=2,
            tensor_parallel=4,
            server=ServerSpec(port=8100, extra_args=("--max-model-len", "8192")),
        ),
    )
    assert run.submission == Submission(
        account="acct",
        partition="batch",
        qos="high",
        time_limit=90,
        memory="16G",
        cpus=4,
        constraint="a100",
        reservation="resv",
        extra_sbatch=("--exclusive",),
    )
    assert plain(run.collection) == {
        "partition": "cpu",
        "memory": "1G",
        "time_limit": "00:10:00",
        "cpus": 3,
    }


def test_max_empty_outputs_null_turns_the_check_off(tmp_path: Path) -> None:
    assert load_run_file(write(tmp_path, MINIMAL + "max_empty_outputs: null\n")).max_empty_outputs is None
    assert load_run_file(write(tmp_path, MINIMAL + "max_empty_outputs: 0\n")).max_empty_outputs == 0


def test_example_run_file_loads() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "hosted-only" / "run.yaml"
    run = load_run_file(example)
    assert (run.name, run.recipe, run.num_records, run.shards, run.buffer_size) == (
        "hosted-demo",
        "recipe.yaml",
        40,
        2,
        10,
    )
    assert run.submission.time_limit == "00:20:00"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param("12:00:00", "12:00:00", id="unquoted-hh-mm-ss-is-a-string"),
        pytest.param("10:30", "10:30", id="unquoted-mm-ss-is-a-string"),
        pytest.param('"12:00:00"', "12:00:00", id="quoted"),
        pytest.param("2-00:00:00", "2-00:00:00", id="days"),
        pytest.param("90", 90, id="integer-minutes"),
    ],
)
def test_time_limit_scalar_forms(tmp_path: Path, value: str, want: str | int) -> None:
    run = load_run_file(write(tmp_path, f"{MINIMAL}submission:\n  time_limit: {value}\n"))
    assert run.submission.time_limit == want
    assert type(run.submission.time_limit) is type(want)


@pytest.mark.parametrize(
    ("text", "line", "col", "field", "message"),
    [
        pytest.param(
            MINIMAL + "submision:\n  cpus: 2\n",
            4,
            1,
            "submision",
            "unknown field; did you mean 'submission'?",
            id="unknown-top-level-key",
        ),
        pytest.param(MINIMAL + "colour: blue\n", 4, 1, "colour", UNKNOWN_KEY, id="unknown-key-like-no-field"),
        pytest.param(
            MINIMAL + "submission:\n  cpus: 2\n  partiton: a\n",
            6,
            3,
            "submission.partiton",
            "unknown field; did you mean 'partition'?",
            id="unknown-nested-key",
        ),
        pytest.param(
            MINIMAL + "deployments:\n  - model_alias: a\n    model: m\n    replica: 2\n",
            7,
            5,
            "deployments[0].replica",
            "unknown field; did you mean 'replicas'?",
            id="unknown-key-in-list-item",
        ),
        pytest.param(
            "name: demo\nrecipe: r.yaml\nnum_records: five\n",
            3,
            1,
            "num_records",
            "expected int, got str",
            id="wrong-type-str-for-int",
        ),
        pytest.param(
            "name: demo\nrecipe: r.yaml\nnum_records: 2.5\n",
            3,
            1,
            "num_records",
            "expected int, got float",
            id="wrong-type-float-for-int",
        ),
        pytest.param(
            "name: demo\nrecipe: r.yaml\nnum_records: true\n",
            3,
            1,
            "num_records",
            "expected int, got bool",
            id="wrong-type-bool-for-int",
        ),
        pytest.param(
            MINIMAL + "submission:\n  memory: 4G\n  cpus: '2'\n",
            6,
            3,
            "submission.cpus",
            "expected int, got str",
            id="wrong-type-quoted-int",
        ),
        pytest.param(
            MINIMAL + "submission:\n  extra_sbatch: --exclusive\n",
            5,
            3,
            "submission.extra_sbatch",
            "expected array, got str",
            id="wrong-type-scalar-for-list",
        ),
        pytest.param(
            "name: demo\nrecipe:\nnum_records: 3\n", 2, 1, "recipe", "expected str, got null", id="null-for-str"
        ),
        pytest.param(
            "name: demo\nrecipe: r.yaml\nnum_records: 0\n",
            3,
            1,
            "num_records",
            "expected int >= 1",
            id="bad-value-zero-records",
        ),
        pytest.param(MINIMAL + "shards: -1\n", 4, 1, "shards", "expected int >= 1", id="bad-value-negative-shards"),
        pytest.param(
            MINIMAL + "max_empty_outputs: -1\n",
            4,
            1,
            "max_empty_outputs",
            "expected int >= 0",
            id="bad-value-negative-max-empty-outputs",
        ),
        pytest.param(
            MINIMAL + "resume: sometimes\n",
            4,
            1,
            "resume",
            "invalid enum value 'sometimes'",
            id="bad-value-resume-mode",
        ),
        pytest.param(
            "recipe: r.yaml\nname: -bad\nnum_records: 3\n",
            2,
            1,
            "name",
            "expected str matching regex '\\\\A[A-Za-z0-9][A-Za-z0-9._-]*\\\\Z'",
            id="bad-value-name-pattern",
        ),
        pytest.param(
            "name: ''\nrecipe: r.yaml\nnum_records: 3\n",
            1,
            1,
            "name",
            "expected str of length >= 1",
            id="bad-value-empty-name",
        ),
        pytest.param(
            MINIMAL
            + "deployments:\n  - model_alias: a\n    model: m\n  - model_alias: b\n    model: m\n    replicas: 0\n",
            9,
            5,
            "deployments[1].replicas",
            "expected int >= 1",
            id="bad-value-in-second-list-item",
        ),
        pytest.param(
            "name: demo\nnum_records: 3\n", 1, 1, "recipe", MISSING, id="missing-top-level-field-points-at-mapping"
        ),
        pytest.param(
            MINIMAL + "deployments:\n  - model_alias: a\n    model: m\n  - model_alias: b\n",
            7,
            5,
            "deployments[1].model",
            MISSING,
            id="missing-field-points-at-its-list-item",
        ),
        pytest.param("\n\nname: demo\nrecipe: r\n", 3, 1, "num_records", MISSING, id="missing-field-after-blank-lines"),
    ],
)
def test_validation_error_is_file_line_col_field_message(
    tmp_path: Path, text: str, line: int, col: int, field: str, message: str
) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)

    err = info.value
    assert str(err) == f"{path}:{line}:{col}: {field}: {message}"
    assert (err.path, err.line, err.col, err.field, err.message) == (path, line, col, field, message)


@pytest.mark.parametrize(
    ("text", "line", "col", "message"),
    [
        pytest.param("name: demo\nrecipe: [r\nnum_records: 3\n", 3, 12, "expected ',' or ']', but got ':'", id="flow"),
        pytest.param("name: demo\n  recipe: r\n", 2, 9, "mapping values are not allowed here", id="indent"),
        pytest.param(
            "name: demo\nname: other\nrecipe: r\nnum_records: 3\n",
            2,
            1,
            "duplicate key 'name' in the mapping that starts at line 1; keep one (values not shown)",
            id="duplicate-key",
        ),
        pytest.param("name: 'demo\n", 2, 1, "found unexpected end of stream", id="unterminated-quote"),
    ],
)
def test_yaml_syntax_error_names_line_and_column(tmp_path: Path, text: str, line: int, col: int, message: str) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)

    assert str(info.value) == f"{path}:{line}:{col}: {message}"
    assert (info.value.line, info.value.col, info.value.field) == (line, col, "")


@pytest.mark.parametrize(
    ("text", "line", "col", "message"),
    [
        pytest.param("", 1, 1, "file is empty", id="empty"),
        pytest.param("# only a comment\n\n", 1, 1, "file is empty", id="only-comments"),
        pytest.param("- name: demo\n- recipe: r\n", 1, 1, "the top level must be a mapping", id="list"),
        pytest.param("\n\n  - a\n", 3, 3, "the top level must be a mapping", id="indented-list"),
        pytest.param("just a string\n", 1, 1, "the top level must be a mapping", id="scalar"),
    ],
)
def test_empty_or_non_mapping_file(tmp_path: Path, text: str, line: int, col: int, message: str) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)

    assert str(info.value) == f"{path}:{line}:{col}: {message}"


def test_missing_file_is_a_config_file_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"

    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)

    assert str(info.value) == f"{path}: cannot read: No such file or directory"


def test_run_file_is_frozen(tmp_path: Path) -> None:
    run = load_run_file(write(tmp_path, MINIMAL))

    with pytest.raises(AttributeError):
        run.num_records = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        run.submission.cpus = 9  # type: ignore[misc]
    assert run.num_records == 10
    assert run.submission.cpus == 2


def test_run_file_struct_is_keyword_only_and_strict() -> None:
    with pytest.raises(TypeError):
        RunFile("demo", "r.yaml", 3)  # type: ignore[misc]
    with pytest.raises(msgspec.ValidationError, match="unknown field `extra`"):
        msgspec.json.decode(b'{"name":"a","recipe":"r","num_records":1,"extra":1}', type=RunFile)


# --- server.env: no secrets; server.env_from: variables for the server steps, by name -----------------------

DEPLOYMENT = MINIMAL + "deployments:\n  - model_alias: a\n    model: m\n    server:\n      cpus: 1\n"
HF = "hf_" + "AbCdEfGh1234567890" * 2


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        pytest.param(f"HF_TOKEN: {HF}", "name says it holds a credential", id="hf-token"),
        pytest.param("OPENAI_API_KEY: not-a-real-key-but-long", "name says it holds a credential", id="api-key-name"),
        pytest.param("DB_PASSWORD: correct-horse-battery", "name says it holds a credential", id="password-name"),
        pytest.param(f"UPSTREAM: {HF}", "starts like an API key", id="prefixed-value-innocent-name"),
        pytest.param("X: 'sk-proj-0123456789abcdef'", "starts like an API key", id="sk-value"),
        pytest.param("X: 'Bearer abc.def.ghi'", "as in an Authorization header", id="bearer-value"),
        pytest.param("HUB: 'https://user:s3cr3t-pass@hub.example/v1'", "URL with credentials", id="url-userinfo"),
        pytest.param("X: Zq3Vb8Kd9Lm2Np4Rt6Wx1Yz5Ac7Ef0Gh", "generated key", id="random-value"),
        pytest.param("VLLM_API_KEY: anything", "set by ddslurm itself", id="reserved-token-variable"),
    ],
)
def test_server_env_refuses_secrets_without_echoing_them(tmp_path: Path, entry: str, why: str) -> None:
    path = write(tmp_path, DEPLOYMENT + f"      env:\n        {entry}\n")
    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)
    err = info.value
    name, _, value = entry.partition(": ")
    assert (err.line, err.col, err.field) == (7, 5, "deployments[0].server")
    assert str(err).startswith(f"{path}:7:5: deployments[0].server: env.{name}: ")
    assert why in err.message
    assert value.strip("'") not in str(err)


@pytest.mark.parametrize(
    "entry",
    [
        "VLLM_LOGGING_LEVEL: INFO",
        "TOKENIZERS_PARALLELISM: 'false'",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN: '1'",
        "HF_TOKEN_PATH: /scratch/hf/token",
        "HF_HOME: /scratch/hf-cache/hub/models--Qwen--Qwen3-8B-Instruct",
        "SERVED: Meta-Llama-3-70B-Instruct-FP8",
        "MODEL: meta-llama/Llama-3.1-70B-Instruct",
        "FAKE_VLLM_LATENCY: '0.02'",
        "HF_ENDPOINT: https://hf-mirror.example/api",
        "GOOGLE_APPLICATION_CREDENTIALS: /scratch/keys/service-account.json",  # where a key is, not the key
        "DB_PASSWORD_FILE: /run/secrets/db-password",
    ],
)
def test_server_env_keeps_ordinary_settings(tmp_path: Path, entry: str) -> None:
    run = load_run_file(write(tmp_path, DEPLOYMENT + f"      env:\n        {entry}\n"))
    name = entry.partition(":")[0]
    assert name in run.deployments[0].server.env


def test_server_env_from_names_variables_for_the_servers(tmp_path: Path) -> None:
    run = load_run_file(write(tmp_path, DEPLOYMENT + "      env_from: [HF_TOKEN, WANDB_API_KEY]\n"))
    assert run.deployments[0].server.env_from == ("HF_TOKEN", "WANDB_API_KEY")
    assert load_run_file(write(tmp_path, DEPLOYMENT)).deployments[0].server.env_from == ()


@pytest.mark.parametrize(
    ("entry", "field", "message"),
    [
        pytest.param(
            "env_from: [hf-token]",
            "deployments[0].server.env_from[0]",
            "expected str matching regex '\\\\A[A-Za-z_][A-Za-z0-9_]*\\\\Z'",
            id="not-a-variable-name",
        ),
        pytest.param("env_from: HF_TOKEN", "deployments[0].server.env_from", "expected array, got str", id="scalar"),
        pytest.param(
            "env_from: [HF_TOKEN, HF_TOKEN]", "deployments[0].server", "env_from: HF_TOKEN is listed twice", id="twice"
        ),
        pytest.param(
            "env_from: [VLLM_API_KEY]",
            "deployments[0].server",
            "env_from: VLLM_API_KEY is set by ddslurm itself (each attempt's own token)",
            id="reserved",
        ),
        pytest.param(
            "env_from: [X]\n      env: {X: '1'}",
            "deployments[0].server",
            "env_from: X is also set in env; keep one",
            id="also-in-env",
        ),
    ],
)
def test_server_env_from_errors_name_file_line_and_field(tmp_path: Path, entry: str, field: str, message: str) -> None:
    path = write(tmp_path, DEPLOYMENT + f"      {entry}\n")
    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)
    assert (info.value.field, info.value.message) == (field, message)
    assert str(info.value).startswith(f"{path}:")
    assert info.value.line is not None and info.value.col is not None


@pytest.mark.parametrize(
    ("text", "kind", "target", "function"),
    [
        pytest.param("recipe.yaml", "config", "recipe.yaml", None, id="yaml"),
        pytest.param("dir/recipe.json", "config", "dir/recipe.json", None, id="json"),
        pytest.param("build.py", "script", "build.py", "load_config_builder", id="dd-convention"),
        pytest.param("recipes/Build.PY", "script", "recipes/Build.PY", "load_config_builder", id="dd-suffix-case"),
        pytest.param("recipes/build.py:make", "script", "recipes/build.py", "make", id="script-function"),
        pytest.param("pkg.recipes:make", "module", "pkg.recipes", "make", id="module-function"),
        pytest.param("recipes:make", "module", "recipes", "make", id="top-level-module"),
        pytest.param("odd:name.yaml", "config", "odd:name.yaml", None, id="colon-in-a-file-name"),
    ],
)
def test_recipe_references(text: str, kind: str, target: str, function: str | None) -> None:
    from ddslurm.config import parse_recipe_ref

    ref = parse_recipe_ref(text)
    assert (ref.kind, ref.target, ref.function) == (kind, target, function)


def test_a_function_of_a_config_file_is_refused_at_the_recipe_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: demo\nnum_records: 10\nrecipe: recipe.yaml:make\n")
    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)
    assert str(info.value).startswith(f"{path}:3:1: recipe: 'recipe.yaml:make': a ':make' suffix names the function")
    assert load_run_file(write(tmp_path, "name: demo\nnum_records: 10\nrecipe: build.py:make\n")).recipe == (
        "build.py:make"
    )
