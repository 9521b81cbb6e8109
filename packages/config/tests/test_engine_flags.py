"""``server.extra_args`` refuses the engine flags ddslurm sets itself (parallel sizes, multi-node rendezvous, where
the server listens, the model), for the deployment's engine, at the item's line, naming the field to use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddslurm.config import ConfigFileError, load_run_file

MINIMAL = "name: demo\nrecipe: recipe.yaml\nnum_records: 10\n"


def _run_file(tmp_path: Path, engine: str, args: list[str]) -> Path:
    items = "".join(f"        - {json.dumps(a)}\n" for a in args)
    text = f"{MINIMAL}deployments:\n  - model_alias: a\n    model: m\n    engine: {engine}\n    server:\n"
    path = tmp_path / "run.yaml"
    path.write_text(text + "      extra_args:\n" + items, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("engine", "args", "index", "why"),
    [
        pytest.param("vllm", ["--tensor-parallel-size", "2"], 0, "set tensor_parallel instead", id="vllm-tp"),
        pytest.param("vllm", ["--max-num-seqs", "8", "-tp", "2"], 2, "set tensor_parallel instead", id="vllm-tp-short"),
        pytest.param("vllm", ["-tp=2"], 0, "set tensor_parallel instead", id="vllm-tp-inline"),
        pytest.param("vllm", ["--tensor_parallel_size=2"], 0, "(--tensor-parallel-size)", id="vllm-underscores"),
        pytest.param("vllm", ["--tensor-parallel", "2"], 0, "(--tensor-parallel-size)", id="vllm-abbreviated"),
        pytest.param("vllm", ["-pp", "2"], 0, "set pipeline_parallel instead", id="vllm-pp"),
        pytest.param("vllm", ["--pipeline-parallel-size=2"], 0, "set pipeline_parallel", id="vllm-pp-long"),
        pytest.param("vllm", ["-dp", "2"], 0, "set data_parallel instead", id="vllm-dp"),
        pytest.param("vllm", ["--data-parallel-size-local", "2"], 0, "spans nodes", id="vllm-dp-local"),
        pytest.param("vllm", ["-dpl", "2"], 0, "spans nodes", id="vllm-dpl"),
        pytest.param("vllm", ["--data-parallel-start-rank", "2"], 0, "spans nodes", id="vllm-dp-start"),
        pytest.param("vllm", ["-dpr", "2"], 0, "spans nodes", id="vllm-dpr"),
        pytest.param("vllm", ["--data-parallel-address=h"], 0, "spans nodes", id="vllm-dp-address"),
        pytest.param("vllm", ["-dpa", "h"], 0, "spans nodes", id="vllm-dpa"),
        pytest.param("vllm", ["--data-parallel-rpc-port", "1"], 0, "spans nodes", id="vllm-dp-rpc"),
        pytest.param("vllm", ["-dpp", "1"], 0, "spans nodes", id="vllm-dpp"),
        pytest.param("vllm", ["--enable-expert-parallel"], 0, "set expert_parallel instead", id="vllm-ep"),
        pytest.param("vllm", ["-ep"], 0, "set expert_parallel instead", id="vllm-ep-short"),
        pytest.param("vllm", ["--nnodes", "2"], 0, "spans nodes", id="vllm-nnodes"),
        pytest.param("vllm", ["-n", "2"], 0, "spans nodes", id="vllm-n"),
        pytest.param("vllm", ["--node-rank", "1"], 0, "spans nodes", id="vllm-node-rank"),
        pytest.param("vllm", ["-r", "1"], 0, "spans nodes", id="vllm-r"),
        pytest.param("vllm", ["--master-addr", "h"], 0, "spans nodes", id="vllm-master-addr"),
        pytest.param("vllm", ["--master-port", "1"], 0, "spans nodes", id="vllm-master-port"),
        pytest.param("vllm", ["--headless"], 0, "spans nodes", id="vllm-headless"),
        pytest.param("vllm", ["--uds", "/tmp/s"], 0, "where each replica listens", id="vllm-uds"),
        pytest.param("vllm", ["--host", "0.0.0.0"], 0, "set server.port for fixed ports", id="vllm-host"),
        pytest.param("vllm", ["--port=8000"], 0, "where each replica listens", id="vllm-port"),
        pytest.param("vllm", ["--served-model-name", "x"], 0, "set served_model_name instead", id="vllm-name"),
        pytest.param("sglang", ["--tp-size", "2"], 0, "set tensor_parallel instead", id="sglang-tp"),
        pytest.param("sglang", ["--tp", "2"], 0, "--tp (--tp-size)", id="sglang-tp-abbreviated"),
        pytest.param("sglang", ["--tensor-parallel-size=2"], 0, "set tensor_parallel", id="sglang-tp-long"),
        pytest.param("sglang", ["--pp-size", "2"], 0, "set pipeline_parallel instead", id="sglang-pp"),
        pytest.param("sglang", ["--dp-size", "2"], 0, "set data_parallel instead", id="sglang-dp"),
        pytest.param("sglang", ["--dp", "2"], 0, "set data_parallel instead", id="sglang-dp-abbreviated"),
        pytest.param("sglang", ["--ep-size", "2"], 0, "set expert_parallel instead", id="sglang-ep"),
        pytest.param("sglang", ["--nnodes", "2"], 0, "spans nodes", id="sglang-nnodes"),
        pytest.param("sglang", ["--node-rank", "1"], 0, "spans nodes", id="sglang-node-rank"),
        pytest.param("sglang", ["--dist-init-addr", "h:1"], 0, "spans nodes", id="sglang-dist-init"),
        pytest.param("sglang", ["--host", "0.0.0.0"], 0, "where each replica listens", id="sglang-host"),
        pytest.param("sglang", ["--port", "30000"], 0, "where each replica listens", id="sglang-port"),
        pytest.param("sglang", ["--model-path", "x"], 0, "set model instead", id="sglang-model-path"),
        pytest.param("sglang", ["--model", "x"], 0, "set model instead", id="sglang-model"),
        pytest.param("sglang", ["--served-model-name", "x"], 0, "set served_model_name instead", id="sglang-name"),
        pytest.param("sglang", ["--api-key", "x"], 0, "set by ddslurm itself", id="sglang-api-key"),
    ],
)
def test_flags_ddslurm_sets_are_refused_at_their_item(
    tmp_path: Path, engine: str, args: list[str], index: int, why: str
) -> None:
    with pytest.raises(ConfigFileError) as info:
        load_run_file(_run_file(tmp_path, engine, args))
    err = info.value
    assert err.field == f"deployments[0].server.extra_args[{index}]"
    assert err.line == 10 + index
    assert why in err.message, err.message


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        pytest.param("vllm", ["--max-num-seqs", "64", "--max-model-len=8192"], id="vllm-ordinary"),
        pytest.param("vllm", ["--dp-size", "2"], id="vllm-sglangs-flag-is-not-refused-for-vllm"),
        pytest.param("vllm", ["--model-impl", "transformers"], id="vllm-model-impl"),
        pytest.param("vllm", ["--enable-eplb", "--all2all-backend", "naive"], id="vllm-ep-tuning"),
        pytest.param("sglang", ["--max-running-requests", "64", "--mem-fraction-static", "0.8"], id="sglang-ordinary"),
        pytest.param("sglang", ["-tp", "2"], id="sglang-vllms-short-flag-is-not-sglangs"),
        pytest.param("sglang", ["--enable-dp-attention", "--dist-timeout", "600"], id="sglang-dp-attention"),
    ],
)
def test_other_engine_flags_are_kept(tmp_path: Path, engine: str, args: list[str]) -> None:
    run = load_run_file(_run_file(tmp_path, engine, args))
    assert run.deployments[0].server.extra_args == tuple(args)
