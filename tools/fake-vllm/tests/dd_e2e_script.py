"""Run the real Data Designer engine against a fake-vllm endpoint (executed as a subprocess by
test_dd_engine.py, so that the hardening environment is in place before ``data_designer`` is imported).

Usage: python dd_e2e_script.py ENDPOINT MODEL OUT_DIR NUM_RECORDS [API_KEY_ENV_VAR]
Prints one JSON line: {"records": [...], "columns": [...], "remote_hosts": [...]}.

``remote_hosts`` lists every host other than loopback that the process tried to resolve or connect to (an
audit hook). The dataset profiler's tiktoken ``cl100k_base`` download is avoided by replacing DD's tokenizer
getter with a len/4 estimator (not a public API; see data-designer-engine.md section 5): offline, that
download fails fast where DNS fails fast, but blocks where DNS times out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class _ApproxEncoding:
    """Stands in for tiktoken's cl100k_base Encoding: about one token per four characters."""

    def encode(self, text: str, **_kwargs: object) -> list[int]:
        return [0] * (len(text) // 4 + 1)


def _watch_remote_hosts(remote: set[str]) -> None:
    def hook(event: str, args: tuple[object, ...]) -> None:
        host = None
        if event == "socket.getaddrinfo":
            host = args[0]
        elif event == "socket.connect" and isinstance(args[1], tuple):
            host = args[1][0]
        if isinstance(host, bytes):
            host = host.decode()
        if isinstance(host, str) and host not in _LOOPBACK:
            remote.add(host)

    sys.addaudithook(hook)


def main() -> int:
    endpoint, model_name, out_dir, num_records = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    api_key_env = sys.argv[5] if len(sys.argv) > 5 else None
    home = out_dir / "dd-home"
    os.environ["DATA_DESIGNER_HOME"] = str(home)  # §5 hardening: all before the first data_designer import
    os.environ["NEMO_TELEMETRY_ENABLED"] = "false"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["DISABLE_DATA_DESIGNER_PLUGINS"] = "true"

    remote: set[str] = set()
    _watch_remote_hosts(remote)

    import data_designer.config as dd
    import data_designer.engine.utils.token_counting as token_counting
    from data_designer.engine.secret_resolver import EnvironmentResolver
    from data_designer.interface import DataDesigner

    token_counting.get_cl100k_base_tokenizer = _ApproxEncoding

    provider = dd.ModelProvider(name="fake", endpoint=endpoint, provider_type="openai", api_key=api_key_env)
    model = dd.ModelConfig(
        alias="gen",
        model=model_name,
        provider="fake",
        inference_parameters=dd.ChatCompletionInferenceParams(
            temperature=0.7, top_p=0.95, max_tokens=256, max_parallel_requests=8, timeout=30
        ),
    )
    builder = dd.DataDesignerConfigBuilder(model_configs=[model])
    builder.add_column(
        dd.SamplerColumnConfig(
            name="topic",
            sampler_type=dd.SamplerType.CATEGORY,
            params=dd.CategorySamplerParams(values=["astronomy", "cooking", "gardening"]),
        )
    )
    builder.add_column(
        dd.LLMTextColumnConfig(name="answer", model_alias="gen", prompt="Write two sentences about {{ topic }}.")
    )
    builder.add_column(
        dd.LLMJudgeColumnConfig(
            name="quality",
            model_alias="gen",
            prompt="Judge this text about {{ topic }}:\n{{ answer }}",
            scores=[
                dd.Score(
                    name="Relevance",
                    description="Is the text about the topic?",
                    options={1: "off topic", 2: "partly", 3: "on topic"},
                ),
                dd.Score(name="Tone", description="Is the tone friendly?", options={"Poor": "rude", "Good": "kind"}),
            ],
        )
    )
    builder.add_column(dd.ExpressionColumnConfig(name="answer_chars", expr="{{ answer | length }}", dtype="int"))

    designer = DataDesigner(
        artifact_path=out_dir / "artifacts",
        model_providers=[provider],
        secret_resolver=EnvironmentResolver(),
        managed_assets_path=home / "managed-assets",
    )
    designer.set_run_config(dd.RunConfig(otel_metrics_port=None))
    results = designer.create(builder, num_records=num_records, dataset_name="e2e")
    frame = results.load_dataset()
    records = json.loads(frame.to_json(orient="records"))
    print(json.dumps({"records": records, "columns": list(frame.columns), "remote_hosts": sorted(remote)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
