"""The small pool of recipes a scenario draws from, written as Data Designer configs, and the run files.

Recipes are tiny so that scenarios are fast: a text column (``question``), a judge of it (``quality``) and an
expression (``question_length``, dropped in the ``drop`` variants), on a seed dataset (ORDERED or SHUFFLE) or on
seedless samplers (``topic``, ``difficulty`` and a ``record_id`` uuid that tells duplicated records apart).
Where the models run: ``hosted`` (both aliases on the harness's stand-in provider), ``local`` (one deployed alias
served by fake-vllm on fake GPUs) or ``mixed`` (a local writer, a hosted judge: the examples/mixed shape).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tools.chaos.draw import Scenario

HOSTED_PROVIDER = "chaos-hosted"
KEY_ENV = "CHAOS_HOSTED_API_KEY"
HOSTED_MODELS = ("demo/writer-8b", "demo/judge-70b")
LOCAL_MODEL = "qwen3-8b"
TOPICS = ("weather", "cooking", "sports", "music", "travel")
SAMPLER_TOPICS = ("weather", "cooking", "sports")
DIFFICULTIES = ("easy", "hard")
SEED_COLUMNS = ("seed_id", "topic")
SAMPLER_KEYS = ("topic", "difficulty")
UUID_COLUMN = "record_id"


def _model(alias: str, model: str, provider: str, timeout: int | None) -> dict[str, Any]:
    return {
        "alias": alias,
        "inference_parameters": {
            "extra_body": None,
            "generation_type": "chat-completion",
            "max_parallel_requests": 4,
            "max_tokens": 128,
            "temperature": 0.5,
            "timeout": timeout,
            "top_p": None,
        },
        "model": model,
        "provider": provider,
        "skip_health_check": False,
    }


def _category(name: str, values: tuple[str, ...]) -> dict[str, Any]:
    return {
        "column_type": "sampler",
        "conditional_params": {},
        "convert_to": None,
        "drop": False,
        "name": name,
        "params": {"sampler_type": "category", "values": list(values), "weights": None},
        "propagate_skip": True,
        "sampler_type": "category",
        "skip": None,
    }


def recipe(scenario: Scenario) -> dict[str, Any]:
    """The Data Designer config of the scenario's recipe (the same for the run and for the oracle)."""
    timeout = 600 if any(f.kind == "time_limit" for f in scenario.faults) else None
    judge_alias = "writer" if scenario.placement == "local" else "judge"
    if scenario.placement == "hosted":
        models = [
            _model("writer", HOSTED_MODELS[0], HOSTED_PROVIDER, timeout),
            _model("judge", HOSTED_MODELS[1], HOSTED_PROVIDER, timeout),
        ]
    elif scenario.placement == "local":
        models = [_model("writer", LOCAL_MODEL, "local", timeout)]
    else:
        models = [
            _model("writer", LOCAL_MODEL, "local", timeout),
            _model("judge", HOSTED_MODELS[1], HOSTED_PROVIDER, timeout),
        ]
    columns: list[dict[str, Any]] = []
    if scenario.seeding == "seedless":
        columns += [
            _category("topic", SAMPLER_TOPICS),
            _category("difficulty", DIFFICULTIES),
            {
                "column_type": "sampler",
                "conditional_params": {},
                "convert_to": None,
                "drop": False,
                "name": UUID_COLUMN,
                "params": {"sampler_type": "uuid"},
                "propagate_skip": True,
                "sampler_type": "uuid",
                "skip": None,
            },
        ]
        prompt = "Write a {{ difficulty }} question about {{ topic }}."
    else:
        prompt = "Write question number {{ seed_id }} about {{ topic }}."
    columns += [
        {
            "column_type": "llm-text",
            "drop": False,
            "extract_reasoning_content": False,
            "model_alias": "writer",
            "multi_modal_context": None,
            "name": "question",
            "prompt": prompt,
            "propagate_skip": True,
            "skip": None,
            "system_prompt": None,
            "tool_alias": None,
            "with_trace": "none",
        },
        {
            "column_type": "llm-judge",
            "drop": False,
            "extract_reasoning_content": False,
            "model_alias": judge_alias,
            "multi_modal_context": None,
            "name": "quality",
            "prompt": "Rate this question: {{ question }}",
            "propagate_skip": True,
            "scores": [
                {
                    "description": "Is it on topic?",
                    "name": "Relevance",
                    "options": {"1": "off topic", "2": "somewhat", "3": "on topic"},
                }
            ],
            "skip": None,
            "system_prompt": None,
            "tool_alias": None,
            "with_trace": "none",
        },
        {
            "column_type": "expression",
            "drop": scenario.drop,
            "dtype": "int",
            "expr": "{{ question | length }}",
            "name": "question_length",
            "propagate_skip": True,
            "skip": None,
        },
    ]
    seed_config = None
    if scenario.seeding != "seedless":
        seed_config = {
            "sampling_strategy": scenario.seeding,
            "selection_strategy": None,
            "source": {"path": "seed.parquet", "seed_type": "local"},
        }
    return {
        "data_designer": {
            "columns": columns,
            "constraints": None,
            "model_configs": models,
            "processors": None,
            "profilers": None,
            "seed_config": seed_config,
            "tool_configs": [],
        },
        "library_version": "0.9.7",
    }


def seed_rows(count: int) -> dict[str, list[Any]]:
    """The seed dataset's columns: ``seed_id`` 0..count-1 and a ``topic`` per row."""
    return {"seed_id": list(range(count)), "topic": [f"{TOPICS[i % len(TOPICS)]} {i}" for i in range(count)]}


def write_recipe(folder: Path, scenario: Scenario) -> Path:
    """``recipe.yaml`` (and ``seed.parquet`` beside it for seeded recipes) in ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(scenario), sort_keys=False))
    if scenario.seeding != "seedless":
        pq.write_table(pa.table(seed_rows(scenario.seed_rows)), folder / "seed.parquet")  # type: ignore[no-untyped-call]
    return path


SERVER_RESTARTS = 3
"""The runs' ``server.restarts`` (the run file's default): a replica has this many lives and one more per attempt."""


def crash_after(scenario: Scenario, drawn: int) -> int:
    """The requests each life of a crashing replica answers: the drawn number, or more where the run's lives could
    not answer all its local requests in one attempt. Data Designer's async engine interleaves the requests of every
    row group it has left, so lives that answer fewer than all of them may complete no batch at all, and every
    attempt after them starts where the first did: a fault no retry outlasts (campaign seed 442764: 4 a life, 28
    requests, no batch ever saved). The replica still dies whenever the run needs more than that."""
    local = [c for c in recipe(scenario)["data_designer"]["columns"] if c.get("model_alias") == "writer"]
    requests = scenario.records * len(local) if scenario.placement != "hosted" else 0
    return max(drawn, -(-requests // SERVER_RESTARTS))  # one life of the attempt's spare


def run_yaml(scenario: Scenario) -> str:
    """The run file (next to ``recipe.yaml``)."""
    s = scenario
    lines = [
        f"name: chaos-{s.seed}",
        "recipe: recipe.yaml",
        f"num_records: {s.records}",
        f"shards: {s.shards}",
        f"buffer_size: {'null' if s.buffer_size is None else s.buffer_size}",
        f"allocations: {s.allocations}",
        f"client_workers: {s.client_workers}",
        f"retries: {s.retries}",
        f"client_retries: {s.client_retries}",
    ]
    if s.has_deployment:
        env = {"FAKE_VLLM_LATENCY": str(s.latency), "FAKE_VLLM_STARTUP_DELAY": str(int(s.startup_delay))}
        crashing = next((f for f in s.faults if f.kind == "crashing_replica"), None)
        if crashing is not None:  # a replica that keeps dying: restarted in place (server.restarts), then retried
            env["FAKE_VLLM_CRASH_AFTER"] = str(crash_after(s, int(crashing.duration)))
        lines += [
            f"stages: {s.stages}",
            "deployments:",
            "  - model_alias: writer",
            "    model: Qwen/Qwen3-8B",
            f"    served_model_name: {LOCAL_MODEL}",
            f"    replicas: {s.replicas}",
            "    server:",
            "      cpus: 1",
            "      startup_timeout: 120",
            f"      env: {yaml.safe_dump(env, default_flow_style=True).strip()}",
        ]
    lines += [
        "submission:",
        f"  time_limit: '{s.time_limit_minutes}'",
        f"  cpus: {s.cpus}",
        "  memory: 1G",
        "collection:",
        "  memory: 1G",
    ]
    return "\n".join(lines) + "\n"


def providers_yaml(base_url: str) -> str:
    """Data Designer's ``model_providers.yaml``: the hosted provider, its key by variable name only."""
    head = f"providers:\n- name: {HOSTED_PROVIDER}\n  endpoint: {base_url}\n"
    return head + f"  provider_type: openai\n  api_key: {KEY_ENV}\n"


def profile_yaml(workspace: Path, python_env: Path) -> str:
    return (
        f"name: chaos\nworkspace: {workspace}\npython_env: {python_env}\npartition: gpu\ncpu_partition: cpu\n"
        f"gpus_per_node: 4\nvllm_executable: {python_env / 'bin' / 'fake-vllm'}\n"
    )
