"""Every Data Designer column type, sampler family, processor and profiler, sharded (and staged where stages
apply), against the real engine: the table of docs/recipes.md, row by row.

The sharded side is ddslurm's own path: ``prepare`` plans the run (shards, seed blocks, stages) and writes its
inputs, and each shard is one attempt of the runtime's ``AttemptRunner`` with the real engine (``run_engine``),
verified and published as on a node; a two-stage run's GPU stage, then its CPU stage reading the GPU winner. The
oracle is a plain ``DataDesigner.create`` of the whole recipe (with the model configs the run resolved). Both
talk to the vLLM stand-in, whose replies are a pure function of the request, so every model column is compared
value for value; samplers draw at random in every run (Data Designer's own row groups draw independently too),
so sampler columns are compared by type and support, and the shards must not repeat one another's draws.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import ProviderSnapshot, WinnerRecord, read_json
from ddslurm.launcher import SubmitError, prepare, write_run_dir
from ddslurm.launcher.testing import InProcessHost

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

pytestmark = pytest.mark.dd

ROWS = 10  # seed rows
RECORDS = 8  # over 3 shards: 3, 3, 2

# For every run on stdin ({"run_dir", "endpoints": {provider: url}}): each shard's attempts through the runtime's
# AttemptRunner (each stage's, in order), then the oracle, a plain DataDesigner.create of the run's recipe (its
# model configs the snapshot's) over the same providers. Prints one {"codes", "oracle"} per run: the attempts'
# exit codes and the oracle's dataset directory.
ENGINE = r"""
import json, os, sys, tempfile
from pathlib import Path
from ddslurm.runtime._engine import engine_environment, _estimate_tokens_offline
home = Path(tempfile.mkdtemp()) / "dd-home"
os.environ.update(engine_environment(home))
from ddslurm.runtime._engine import preload_engine
preload_engine()  # as the client step imports it (frozen): no collection of the runs walks its classes
import data_designer.config as dd
from data_designer.interface import DataDesigner
from ddslurm.config import RunLayout, recipe_with_models
from ddslurm.runtime import load_inputs
from ddslurm.runtime._engine import provider_key_env, run_engine
from ddslurm.runtime._client_step import client_inputs
from ddslurm.runtime._inputs import stage_inputs
from ddslurm.runtime.testing import attempt_runner
_estimate_tokens_offline()
out = []
for run in json.load(sys.stdin):
    layout, endpoints, codes = RunLayout(Path(run["run_dir"])), run["endpoints"], []
    inputs = load_inputs(layout)
    for stage in ([None] if len(inputs.plan.stages) < 2 else [0, 1]):
        staged = client_inputs(stage_inputs(inputs, stage))
        runner = attempt_runner(layout, run_engine, env=os.environ, scratch_home=home, stage=stage)
        for shard in range(len(staged.plan.shards)):
            codes.append(runner.run(staged, shard, f"job{stage}-{shard}", "local", endpoints))
    providers = [dd.ModelProvider(name=p.name, endpoint=endpoints.get(p.name, p.endpoint), provider_type="openai",
                                  api_key=provider_key_env(p)) for p in inputs.snapshot.providers]
    designer = DataDesigner(artifact_path=layout.root / "oracle", model_providers=providers,
                            managed_assets_path=home / "managed-assets")
    designer.set_run_config(dd.RunConfig(buffer_size=inputs.plan.buffer_size, otel_metrics_port=None))
    builder = dd.DataDesignerConfigBuilder.from_config(recipe_with_models(inputs.recipe, inputs.snapshot, None))
    result = designer.create(builder, num_records=sum(s.num_records for s in inputs.plan.shards), dataset_name="oracle")
    out.append({"codes": codes, "oracle": str(result.artifact_storage.base_dataset_path)})
print(json.dumps(out))
"""

HOSTED_MODELS = """\
  model_configs:
  - {alias: writer, model: demo/writer-8b, provider: demo-hosted, inference_parameters: {max_tokens: 48}}
  - {alias: judge, model: demo/judge-70b, provider: demo-hosted, inference_parameters: {max_tokens: 48}}
"""

# Seed columns, expressions, every LLM column type, both code validators (of expressions, some valid, some not),
# every sampler family (below), a drop_columns processor and a profiler.
HOSTED_RECIPE = (
    """\
data_designer:
  seed_config:
    source: {seed_type: local, path: items.csv}
  columns:
  - {name: label, column_type: expression, expr: '{{ item | upper }}'}
  - {name: blurb, column_type: llm-text, model_alias: writer, prompt: 'Describe {{ item }}.'}
  - {name: snippet, column_type: llm-code, model_alias: writer, code_lang: python, prompt: 'Python for {{ item }}.'}
  - name: query
    column_type: llm-code
    model_alias: writer
    code_lang: 'sql:sqlite'
    prompt: 'SQL over items(item_id, {{ item | replace(" ", "_") }}, kind) and kinds(kind_id, name).'
  - name: py_src
    column_type: expression
    expr: '{% if item_id % 2 %}x = {{ item_id }}{% else %}def broken({% endif %}'
  - name: sql_src
    column_type: expression
    expr: '{% if item_id % 2 %}SELECT {{ item_id }} AS n;{% else %}SELECT FROM WHERE;{% endif %}'

  - name: facts
    column_type: llm-structured
    model_alias: writer
    prompt: 'Facts about {{ label }}.'
    output_format:
      type: object
      properties: {name: {type: string}, count: {type: integer}}
      required: [name, count]
  - name: grade
    column_type: llm-judge
    model_alias: judge
    prompt: 'Grade {{ blurb }}'
    scores: [{name: Clarity, description: Is it clear?, options: {'1': unclear, '2': clear}}]
  - name: snippet_ok
    column_type: validation
    target_columns: [py_src]
    validator_type: code
    validator_params: {code_lang: python}
  - name: query_ok
    column_type: validation
    target_columns: [sql_src]
    validator_type: code
    validator_params: {code_lang: 'sql:sqlite'}
  - {name: scratch, column_type: expression, expr: 'row {{ item_id }}'}
  processors:
  - {processor_type: drop_columns, name: tidy, column_names: [scratch]}
  profilers:
  - {model_alias: judge, summary_score_sample_size: 2}
"""
    + HOSTED_MODELS
)

# Every sampler family Data Designer generates offline (``person`` reads managed datasets the nodes do not have).
SAMPLERS: dict[str, dict[str, Any]] = {
    "category": {"values": ["a", "b", "c"]},
    "subcategory": {"category": "category", "values": {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1", "c2"]}},
    "uniform": {"low": 1.0, "high": 2.0},
    "gaussian": {"mean": 0.0, "stddev": 1.0},
    "bernoulli": {"p": 0.5},
    "bernoulli_mixture": {"p": 0.5, "dist_name": "uniform", "dist_params": {"loc": 10.0, "scale": 10.0}},
    "binomial": {"n": 100, "p": 0.5},
    "poisson": {"mean": 50.0},
    "scipy": {"dist_name": "expon", "dist_params": {"scale": 2.0}},
    "datetime": {"start": "2024-01-01", "end": "2024-12-31", "unit": "s"},
    "timedelta": {"dt_min": 1, "dt_max": 100, "reference_column_name": "datetime", "unit": "h"},
    "uuid": {},
    "person_from_faker": {"locale": "en_US"},
}
SAMPLER_COLUMNS = "".join(
    f"  - {json.dumps({'name': n, 'column_type': 'sampler', 'sampler_type': n, 'params': p})}\n"
    for n, p in SAMPLERS.items()
)
"""One column per family (named after it), beside the seed: the hosted recipe's too."""

# A local generator and a local embedder (two deployments), a hosted judge: stages: auto splits it.
STAGED_RECIPE = """\
data_designer:
  seed_config:
    source: {seed_type: local, path: items.csv}
  columns:
  - {name: draft, column_type: llm-text, model_alias: generator, prompt: 'Draft {{ item }}.'}
  - {name: draft_vector, column_type: embedding, model_alias: embedder, target_column: draft}
  - name: verdict
    column_type: llm-judge
    model_alias: judge
    prompt: 'Judge {{ draft }} about {{ item }}'
    scores: [{name: Fit, description: Does it fit?, options: {'1': no, '2': yes}}]
  - {name: blurb, column_type: llm-text, model_alias: writer, prompt: 'Improve {{ draft }}.'}
  - {name: chars, column_type: expression, dtype: int, expr: '{{ blurb | length }}'}
  model_configs:
  - {alias: generator, model: local-8b, provider: local, inference_parameters: {max_tokens: 48}}
  - alias: embedder
    model: local-embed
    provider: local
    inference_parameters: {generation_type: embedding}
  - {alias: judge, model: demo/judge-70b, provider: demo-hosted, inference_parameters: {max_tokens: 48}}
  - {alias: writer, model: demo/writer-8b, provider: demo-hosted, inference_parameters: {max_tokens: 48}}
"""
DEPLOYMENTS = "deployments:\n" + "".join(
    f"  - {{model_alias: {alias}, model: org/{name}, served_model_name: {name}, replicas: 1, tensor_parallel: 1}}\n"
    for alias, name in (("generator", "local-8b"), ("embedder", "local-embed"))
)


@pytest.fixture(scope="module")
def local_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stand-in that serves both deployments (it needs no key: the client sends the attempt's token)."""
    from fake_vllm.testing import start_server

    log = tmp_path_factory.mktemp("local") / "server.log"
    with start_server("local-8b", args=["--served-model-name", "local-8b", "local-embed"], log_path=log) as s:
        yield s.base_url


def _seed_csv(root: Path) -> list[dict[str, str]]:
    rows = [{"item_id": str(i), "item": f"item number {i}"} for i in range(ROWS)]
    with (root / "items.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["item_id", "item"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


def _prepared(make_run_files: Any, name: str, recipe: str, extra_run: str = "") -> Any:
    files = make_run_files(name, num_records=RECORDS, shards=3, buffer_size=2, extra_run=extra_run)
    _seed_csv(files.root)
    (files.root / "recipe.yaml").write_text(recipe)
    prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    return files, prepared


def _run(jobs: list[dict[str, Any]], env: dict[str, str]) -> list[dict[str, Any]]:
    env = {k: v for k, v in env.items() if not k.startswith(("DATA_DESIGNER", "SLURM"))}
    env["DDSLURM_LOCAL_TOKEN"] = "local-token-of-the-allocation"  # what a controller gives its clients
    done = subprocess.run(
        [sys.executable, "-c", ENGINE], input=json.dumps(jobs), capture_output=True, text=True, env=env, timeout=400
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _sharded(prepared: Any) -> list[pa.Table]:
    """Each shard's published rows, in shard order (a two-stage run's: its CPU stage's)."""
    tables = []
    for i in range(len(prepared.plan.shards)):
        winner = read_json(prepared.layout.shard(i).winner, WinnerRecord)
        assert not winner.partial and winner.rows == prepared.plan.shards[i].num_records
        batches = [pq.read_table(Path(winner.dataset_dir) / f.path) for f in winner.files]
        tables.append(_concat(batches))
    return tables


def _ordered(table: pa.Table) -> pa.Table:
    """``table``'s columns in name order (Data Designer writes each batch's in the order its cells finished)."""
    return table.select(sorted(table.column_names))


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Batches (or shards) as one table, as collection merges them: columns by name, types unified (a batch whose
    validator found nothing to say has ``list<null>`` messages)."""
    return pa.concat_tables([_ordered(t) for t in tables], promote_options="permissive")


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return _ordered(table).to_pylist()


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, hosted_endpoint: Any, local_endpoint: str
) -> dict[str, tuple[Any, list[pa.Table], pa.Table]]:
    """The two recipes, planned and generated shard by shard, and their oracles (one engine process): name ->
    (the prepared run, each shard's rows, the oracle's rows)."""
    from conftest import write_run_files

    root = tmp_path_factory.mktemp("types")

    def make(name: str, **kwargs: Any) -> Any:
        return write_run_files(root / name, hosted_endpoint, **kwargs)

    made = {
        "hosted": _prepared(make, "hosted", HOSTED_RECIPE.replace("  columns:\n", "  columns:\n" + SAMPLER_COLUMNS, 1)),
        "staged": _prepared(make, "staged", STAGED_RECIPE, DEPLOYMENTS),
    }
    jobs = []
    for _, prepared in made.values():
        snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
        local = {p.name: local_endpoint for p in snapshot.providers if p.local}
        jobs.append({"run_dir": str(prepared.layout.root), "endpoints": local})
    results = _run(jobs, made["hosted"][0].env)
    out = {}
    for (name, (_, prepared)), result in zip(made.items(), results, strict=True):
        assert result["codes"] == [0] * len(result["codes"]), (name, result)
        oracle = _concat([pq.read_table(f) for f in sorted(Path(result["oracle"]).glob("parquet-files/*.parquet"))])
        out[name] = (prepared, _sharded(prepared), oracle)
    return out


HOSTED_COLUMNS = {
    "seed-dataset": ("item_id", "item"),
    "expression": ("label",),
    "llm-text": ("blurb",),
    "llm-code": ("snippet", "query"),
    "llm-structured": ("facts",),
    "llm-judge": ("grade",),
    "validation": ("py_src", "snippet_ok", "sql_src", "query_ok"),
}


@pytest.mark.parametrize("column_type", list(HOSTED_COLUMNS))
def test_sharded_columns_match_the_oracle(runs: Any, column_type: str) -> None:
    prepared, shards, oracle = runs["hosted"]
    assert [s.num_records for s in prepared.plan.shards] == [3, 3, 2] and not prepared.plan.stages
    names = list(HOSTED_COLUMNS[column_type])
    sharded = _concat(shards)  # one schema: the shards' types agree
    assert sharded.select(names).schema == oracle.select(names).schema
    assert _rows(sharded.select(names)) == _rows(oracle.select(names))
    values = [json.dumps(r, sort_keys=True, default=str) for r in _rows(oracle.select(names))]
    assert len(set(values)) > 1  # the stand-in's replies differ per prompt: the comparison is not vacuous
    if column_type == "validation":  # the validators ran: some of each column's code is valid, some not
        for name in ("snippet_ok", "query_ok"):
            assert {v["is_valid"] for v in oracle.column(name).to_pylist()} == {True, False}, name


def test_drop_columns_processor_drops_in_every_shard(runs: Any) -> None:
    _, shards, oracle = runs["hosted"]
    assert "scratch" not in oracle.column_names
    assert all(set(s.column_names) == set(oracle.column_names) for s in shards)
    drawn = list(SAMPLERS)  # at random in every run
    assert _rows(_concat(shards).drop_columns(drawn)) == _rows(oracle.drop_columns(drawn))  # every other column


def test_profilers_analyse_each_shard(runs: Any) -> None:
    """Data Designer profiles each shard's own rows after its last batch (its statistics in the shard's
    metadata.json); collection merges the rows, not the analyses."""
    prepared, shards, _ = runs["hosted"]
    for i, rows in enumerate(shards):
        winner = read_json(prepared.layout.shard(i).winner, WinnerRecord)
        metadata = json.loads((Path(winner.dataset_dir) / "metadata.json").read_text())
        stats = {s["column_name"]: s for s in metadata["column_statistics"]}
        assert {"blurb", "grade"} <= set(stats)
        assert stats["blurb"]["num_records"] == rows.num_rows


@pytest.mark.parametrize("name", ["hosted", "staged"])
def test_the_collected_dataset_is_the_oracles(runs: Any, name: str) -> None:
    """Collection merges the shards' rows into the dataset a plain run makes, and nothing else: no analysis."""
    from ddslurm.collector import collect

    prepared, _, oracle = runs[name]
    result = collect(prepared.layout)
    dataset = pq.read_table(result.dataset)
    drawn = [n for n in SAMPLERS if n in oracle.column_names]  # at random in every run
    assert _rows(dataset.drop_columns(drawn)) == _rows(oracle.drop_columns(drawn))
    assert {p.name for p in Path(result.dataset).iterdir()} == {"_manifest.json", "part-00000.parquet"}
    # hosted-only and two-stage alike: in the plan's one column order (every column type, samplers, processors)
    assert prepared.plan.column_order is not None and tuple(dataset.column_names) == prepared.plan.column_order


def _in_support(family: str, values: list[Any], row: list[dict[str, Any]]) -> bool:
    params = SAMPLERS[family]
    checks: dict[str, Any] = {
        "category": lambda v, r: v in params["values"],
        "subcategory": lambda v, r: v in params["values"][r["category"]],
        "uniform": lambda v, r: 1.0 <= v <= 2.0,
        "gaussian": lambda v, r: isinstance(v, float),
        "bernoulli": lambda v, r: v in (0, 1),
        "bernoulli_mixture": lambda v, r: v == 0 or 10.0 <= v <= 20.0,
        "binomial": lambda v, r: 0 <= v <= 100,
        "poisson": lambda v, r: v >= 0,
        "scipy": lambda v, r: v >= 0,
        "datetime": lambda v, r: str(v).startswith("2024-"),
        "timedelta": lambda v, r: v is not None,
        "uuid": lambda v, r: len(str(v)) == 32,
        "person_from_faker": lambda v, r: bool(v["first_name"]),
    }
    return all(checks[family](v, r) for v, r in zip(values, row, strict=True))


@pytest.mark.parametrize("family", list(SAMPLERS))
def test_sampler_families_shard(runs: Any, family: str) -> None:
    """Each shard draws its own values (as each of Data Designer's row groups does): the oracle's types and
    support, and no shard repeats another's draws."""
    _, shards, oracle = runs["hosted"]
    sharded = _concat(shards)
    assert sharded.schema.field(family).type == oracle.schema.field(family).type
    values = sharded.column(family).to_pylist()
    assert len(values) == RECORDS and _in_support(family, values, sharded.to_pylist())
    if family in {"uniform", "gaussian", "scipy", "datetime", "uuid", "person_from_faker"}:  # continuous
        assert len({json.dumps(v, sort_keys=True, default=str) for v in values}) == RECORDS


STAGED_COLUMNS = {"llm-text": ("draft", "blurb"), "embedding": ("draft_vector",), "llm-judge": ("verdict",)}


@pytest.mark.parametrize("column_type", list(STAGED_COLUMNS))
def test_staged_columns_match_the_oracle(runs: Any, column_type: str) -> None:
    prepared, shards, oracle = runs["staged"]
    gpu, cpu = prepared.plan.stages
    assert (gpu.columns, cpu.columns) == (("draft", "draft_vector"), ("verdict", "blurb", "chars"))
    names = list(STAGED_COLUMNS[column_type])
    sharded = _concat(shards)
    assert set(sharded.column_names) == set(oracle.column_names)
    assert _rows(sharded.select(names)) == _rows(oracle.select(names))
    if column_type == "embedding":
        vectors = oracle.column("draft_vector").to_pylist()
        assert len({json.dumps(v) for v in vectors}) == RECORDS
        assert all(v["dimension"] == len(v["embeddings"][0]) == 16 for v in vectors)  # the stand-in's vectors
    assert _rows(sharded) == _rows(oracle)  # every column, row for row


def _refused(make_run_files: Any, name: str, recipe: str, entry: str) -> str:
    """What submit says of ``recipe``, which it must refuse at the line of ``entry``, before writing anything."""
    files = make_run_files(name, num_records=RECORDS, shards=3)
    _seed_csv(files.root)
    (files.root / "recipe.yaml").write_text(recipe)
    with pytest.raises(SubmitError) as refused:
        prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
    line = recipe.splitlines().index(entry) + 1
    message = str(refused.value)
    assert message.startswith(f"{files.root / 'recipe.yaml'}:{line}:"), message
    assert not files.workspace.exists() or not any(files.workspace.rglob("run.json"))
    return message


def test_image_columns_are_refused_at_submit(make_run_files: Any) -> None:
    entry = "  - {name: picture, column_type: image, model_alias: writer, prompt: 'Draw {{ item }}.'}"
    recipe = HOSTED_RECIPE.replace("  - {name: blurb,", entry + "\n  - {name: blurb,", 1)
    message = _refused(make_run_files, "image", recipe, entry)
    assert "columns[1].column_type ('picture')" in message and "images/<column>/" in message


def test_person_samplers_are_refused_at_submit(make_run_files: Any) -> None:
    entry = "  - {name: who, column_type: sampler, sampler_type: person, params: {locale: en_US}}"
    recipe = HOSTED_RECIPE.replace("  columns:\n", "  columns:\n" + entry + "\n", 1)
    message = _refused(make_run_files, "person", recipe, entry)
    assert "columns[0].sampler_type ('who')" in message and "person_from_faker" in message


def test_schema_transform_processors_are_refused_at_submit(make_run_files: Any) -> None:
    entry = "  - {processor_type: schema_transform, name: chat, template: {text: '{{ blurb }}'}}"
    recipe = HOSTED_RECIPE.replace("  processors:\n", "  processors:\n" + entry + "\n", 1)
    message = _refused(make_run_files, "transform", recipe, entry)
    assert "processors[0].processor_type ('chat')" in message and "processors-files/<name>/" in message
