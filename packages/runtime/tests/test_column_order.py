"""The dataset's column order rule (``ddslurm.config.final_columns``) against Data Designer's own: a plain
``DataDesigner.create`` in a process of its own, its model calls answered by the vLLM stand-in, each after the same
delay (the rule's premise: every model call takes the same time and nothing else takes any). The recipes leave no
race to Data Designer's timing (no two columns that do not depend on each other are written at the same modelled
time), so its order is the order of every run, under every supported version (``make test-dd-range``)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import final_columns
from ddslurm.runtime import recipe_columns
from ddslurm.runtime.testing import script_answer
from fake_vllm.testing import start_server

pytestmark = [pytest.mark.dd]

CREATE = """
import json, os, sys
os.environ["NEMO_TELEMETRY_ENABLED"] = "false"
import data_designer.config as dd
from data_designer.interface import DataDesigner

endpoint, out = sys.argv[1], []
for job in json.loads(sys.argv[2]):
    designer = DataDesigner(
        artifact_path=job["dir"],
        model_providers=[dd.ModelProvider(name="stand", endpoint=endpoint, provider_type="openai", api_key="KEY")],
    )
    result = designer.create(dd.DataDesignerConfigBuilder.from_config(job["recipe"]), num_records=4, dataset_name="d")
    out.append(list(result.load_dataset().columns))
print(json.dumps(out))
"""

MODELS = [
    {"alias": "m", "model": "demo/writer-8b", "provider": "stand", "skip_health_check": True,
     "inference_parameters": {"max_parallel_requests": 16}}
]  # fmt: skip
SCORES = [{"name": "Fit", "description": "Does it fit?", "options": {"1": "no", "2": "yes"}}]

# Listed out of dependency order; a judge (two model calls deep) before an expression over its input (one); a
# dropped column whose side effects (trace, reasoning) stay; an expression a processor drops by a glob.
SEEDED = {
    "data_designer": {
        "seed_config": {"source": {"seed_type": "local", "path": "items.csv"}},
        "columns": [
            {"name": "grade", "column_type": "llm-judge", "model_alias": "m", "prompt": "Grade {{ draft }}",
             "scores": SCORES},
            {"name": "draft", "column_type": "llm-text", "model_alias": "m", "prompt": "About {{ item }}",
             "with_trace": "last_message", "extract_reasoning_content": True, "drop": True},
            {"name": "length", "column_type": "expression", "expr": "{{ draft | length }}"},
            {"name": "scratch", "column_type": "expression", "expr": "{{ length }} chars"},
            {"name": "shout", "column_type": "expression", "expr": "{{ item | upper }}"},
        ],
        "processors": [{"processor_type": "drop_columns", "name": "tidy", "column_names": ["scr*"]}],
        "model_configs": MODELS,
    }
}  # fmt: skip

# Samplers lead without a seed (one task writes them); then a chain of model columns, listed out of order: a
# structured column over a sampler, a code column over it, an expression over the code (the same model calls deep
# as the code) and a text column over the code (one call deeper).
SAMPLED = {
    "data_designer": {
        "columns": [
            {"name": "summary", "column_type": "llm-text", "model_alias": "m", "prompt": "Sum up {{ code }}"},
            {"name": "facts", "column_type": "llm-structured", "model_alias": "m", "prompt": "Facts on {{ topic }}",
             "output_format": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
            {"name": "topic", "column_type": "sampler", "sampler_type": "category",
             "params": {"values": ["owls", "bats"]}},
            {"name": "level", "column_type": "sampler", "sampler_type": "uniform", "params": {"low": 1, "high": 2}},
            {"name": "code_chars", "column_type": "expression", "expr": "{{ code | length }}"},
            {"name": "code", "column_type": "llm-code", "model_alias": "m", "code_lang": "python",
             "prompt": "Code for {{ facts }} at {{ level }}"},
        ],
        "model_configs": MODELS,
    }
}  # fmt: skip


def _rule(recipe: dict[str, Any], seed: list[str]) -> tuple[str, ...] | None:
    return final_columns(recipe, recipe_columns(recipe), seed)


def test_the_rule_is_data_designers_order_when_model_calls_take_the_time(tmp_path: Path) -> None:
    seed = tmp_path / "items.csv"
    seed.write_text("item_id,item\n0,apple\n1,pear\n2,fig\n3,plum\n")
    seeded = copy.deepcopy(SEEDED)
    seeded["data_designer"]["seed_config"]["source"]["path"] = str(seed)
    jobs = [{"recipe": r, "dir": str(tmp_path / name)} for name, r in (("seeded", seeded), ("sampled", SAMPLED))]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KEY": "k", "DATA_DESIGNER_HOME": str(tmp_path / "h")}
    stand_in = ["--served-model-name", "demo/writer-8b", "--fake-latency", "0.2"]
    with start_server("demo", args=stand_in, api_key="k", log_path=tmp_path / "server.log") as server:
        orders = script_answer(CREATE, server.base_url, json.dumps(jobs), env=env)
    dd_seeded, dd_sampled = (tuple(o) for o in orders)
    assert dd_seeded == ("item_id", "item", "shout", "draft__trace", "draft__reasoning_content", "length", "grade")
    assert _rule(SEEDED, ["item_id", "item"]) == dd_seeded
    assert dd_sampled == ("topic", "level", "facts", "code", "code_chars", "summary")
    assert _rule(SAMPLED, []) == dd_sampled
