"""The real engines' command-line flags: every flag name of ``vllm serve`` and of SGLang's ``launch_server``, and
how many values it takes, so that the stand-in refuses an unknown flag exactly as the engine's argparse does
(``error: unrecognized arguments: ...``, exit status 2) and accepts every real one.

Where they were taken from (public repositories, read through the project's source index):

- vLLM, ``vllm-project/vllm``: ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``) at commit
  99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b, ``vllm/entrypoints/openai/cli_args.py`` (``FrontendArgs`` and
  ``make_arg_parser``) at 789340fbad95a900ca3c467c9cee33b3d905fd61, ``vllm/entrypoints/cli/serve.py`` at
  78265ccd8aadf98d0e9d33c13b6cd2f0053b165e, and ``AsyncEngineArgs.add_cli_args`` (``--enable-log-requests``,
  the deprecated ``--disable-log-requests``). The multi-node flags ``--master-addr``, ``--master-port``,
  ``--nnodes``/``-n`` and ``--node-rank``/``-r`` are those of later ``arg_utils.py`` versions (the ParallelConfig
  group right after ``--pipeline-parallel-size``), which ``serve.py`` at 78265cc already reads. Boolean config
  fields use ``argparse.BooleanOptionalAction`` there (``--x`` and ``--no-x``): ``BOOL`` below.
- SGLang, ``sgl-project/sglang``: ``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``), the
  mid-2025 version (v0.4.7 era: the one with ``--enable-flashinfer-moe``, ``--pdlb-url``,
  ``--weight-loader-disable-mmap``). ``prepare_server_args`` builds a plain ``argparse.ArgumentParser()``, so
  SGLang, unlike vLLM, accepts unambiguous prefixes (``--tp`` for ``--tp-size``, ``--dp`` for ``--dp-size``).

A flag's arity: ``0`` (a switch), ``1`` (one value), ``"?"`` (an optional value), ``"+"`` (one or more), ``"*"``
(any number), or ``BOOL`` (a switch with a ``--no-`` twin).
"""

from __future__ import annotations

from typing import Final, Literal

Arity = Literal[0, 1, "?", "+", "*", "bool"]
BOOL: Final = "bool"

# (option strings, arity), in the order of the engine's source.
VLLM_SERVE_FLAGS: Final[tuple[tuple[tuple[str, ...], Arity], ...]] = (
    # make_arg_parser (cli_args.py)
    (("--headless",), 0),
    (("--api-server-count", "-asc"), 1),
    (("--config",), 1),
    # FrontendArgs (cli_args.py)
    (("--host",), 1),
    (("--port",), 1),
    (("--uds",), 1),
    (("--uvicorn-log-level",), 1),
    (("--disable-uvicorn-access-log",), BOOL),
    (("--allow-credentials",), BOOL),
    (("--allowed-origins",), 1),
    (("--allowed-methods",), 1),
    (("--allowed-headers",), 1),
    (("--api-key",), "+"),
    (("--lora-modules",), "+"),
    (("--chat-template",), 1),
    (("--chat-template-content-format",), 1),
    (("--trust-request-chat-template",), BOOL),
    (("--response-role",), 1),
    (("--ssl-keyfile",), 1),
    (("--ssl-certfile",), 1),
    (("--ssl-ca-certs",), 1),
    (("--enable-ssl-refresh",), BOOL),
    (("--ssl-cert-reqs",), 1),
    (("--root-path",), 1),
    (("--middleware",), 1),
    (("--return-tokens-as-token-ids",), BOOL),
    (("--disable-frontend-multiprocessing",), BOOL),
    (("--enable-request-id-headers",), BOOL),
    (("--enable-auto-tool-choice",), BOOL),
    (("--exclude-tools-when-tool-choice-none",), BOOL),
    (("--tool-call-parser",), 1),
    (("--tool-parser-plugin",), 1),
    (("--tool-server",), 1),
    (("--log-config-file",), 1),
    (("--max-log-len",), 1),
    (("--disable-fastapi-docs",), BOOL),
    (("--enable-prompt-tokens-details",), BOOL),
    (("--enable-server-load-tracking",), BOOL),
    (("--enable-force-include-usage",), BOOL),
    (("--enable-tokenizer-info-endpoint",), BOOL),
    (("--enable-log-outputs",), BOOL),
    (("--h11-max-incomplete-event-size",), 1),
    (("--h11-max-header-count",), 1),
    (("--log-error-stack",), BOOL),
    (("--tokens-only",), BOOL),
    # EngineArgs: ModelConfig
    (("--model",), 1),
    (("--runner",), 1),
    (("--convert",), 1),
    (("--task",), 1),
    (("--tokenizer",), 1),
    (("--tokenizer-mode",), 1),
    (("--trust-remote-code",), BOOL),
    (("--dtype",), 1),
    (("--seed",), 1),
    (("--hf-config-path",), 1),
    (("--allowed-local-media-path",), 1),
    (("--allowed-media-domains",), "+"),
    (("--revision",), 1),
    (("--code-revision",), 1),
    (("--rope-scaling",), 1),
    (("--rope-theta",), 1),
    (("--tokenizer-revision",), 1),
    (("--max-model-len",), 1),
    (("--quantization", "-q"), 1),
    (("--enforce-eager",), BOOL),
    (("--max-logprobs",), 1),
    (("--logprobs-mode",), 1),
    (("--disable-sliding-window",), BOOL),
    (("--disable-cascade-attn",), BOOL),
    (("--skip-tokenizer-init",), BOOL),
    (("--enable-prompt-embeds",), BOOL),
    (("--served-model-name",), "+"),
    (("--config-format",), 1),
    (("--hf-token",), "?"),
    (("--hf-overrides",), 1),
    (("--pooler-config",), 1),
    (("--override-pooler-config",), 1),
    (("--logits-processor-pattern",), 1),
    (("--generation-config",), 1),
    (("--override-generation-config",), 1),
    (("--enable-sleep-mode",), BOOL),
    (("--model-impl",), 1),
    (("--override-attention-dtype",), 1),
    (("--logits-processors",), "+"),
    (("--io-processor-plugin",), 1),
    # LoadConfig
    (("--load-format",), 1),
    (("--download-dir",), 1),
    (("--safetensors-load-strategy",), 1),
    (("--model-loader-extra-config",), 1),
    (("--ignore-patterns",), "+"),
    (("--use-tqdm-on-load",), BOOL),
    (("--pt-load-map-location",), 1),
    # StructuredOutputsConfig (and the deprecated guided-decoding flags, each with a value)
    (("--reasoning-parser",), 1),
    (("--guided-decoding-backend",), 1),
    (("--guided-decoding-disable-fallback",), 1),
    (("--guided-decoding-disable-any-whitespace",), 1),
    (("--guided-decoding-disable-additional-properties",), 1),
    # ParallelConfig
    (("--distributed-executor-backend",), 1),
    (("--pipeline-parallel-size", "-pp"), 1),
    (("--master-addr",), 1),
    (("--master-port",), 1),
    (("--nnodes", "-n"), 1),
    (("--node-rank", "-r"), 1),
    (("--tensor-parallel-size", "-tp"), 1),
    (("--decode-context-parallel-size", "-dcp"), 1),
    (("--data-parallel-size", "-dp"), 1),
    (("--data-parallel-rank", "-dpn"), 1),
    (("--data-parallel-start-rank", "-dpr"), 1),
    (("--data-parallel-size-local", "-dpl"), 1),
    (("--data-parallel-address", "-dpa"), 1),
    (("--data-parallel-rpc-port", "-dpp"), 1),
    (("--data-parallel-backend", "-dpb"), 1),
    (("--data-parallel-hybrid-lb",), BOOL),
    (("--enable-expert-parallel",), BOOL),
    (("--all2all-backend",), 1),
    (("--enable-dbo",), BOOL),
    (("--dbo-decode-token-threshold",), 1),
    (("--dbo-prefill-token-threshold",), 1),
    (("--disable-nccl-for-dp-synchronization",), BOOL),
    (("--enable-eplb",), BOOL),
    (("--eplb-config",), 1),
    (("--expert-placement-strategy",), 1),
    (("--num-redundant-experts",), 1),
    (("--eplb-window-size",), 1),
    (("--eplb-step-interval",), 1),
    (("--eplb-log-balancedness",), BOOL),
    (("--max-parallel-loading-workers",), 1),
    (("--ray-workers-use-nsight",), BOOL),
    (("--disable-custom-all-reduce",), BOOL),
    (("--worker-cls",), 1),
    (("--worker-extension-cls",), 1),
    (("--enable-multimodal-encoder-data-parallel",), 0),
    # CacheConfig
    (("--block-size",), 1),
    (("--gpu-memory-utilization",), 1),
    (("--kv-cache-memory-bytes",), 1),
    (("--swap-space",), 1),
    (("--kv-cache-dtype",), 1),
    (("--num-gpu-blocks-override",), 1),
    (("--enable-prefix-caching",), BOOL),
    (("--prefix-caching-hash-algo",), 1),
    (("--cpu-offload-gb",), 1),
    (("--calculate-kv-scales",), BOOL),
    (("--kv-sharing-fast-prefill",), BOOL),
    (("--mamba-cache-dtype",), 1),
    (("--mamba-ssm-cache-dtype",), 1),
    (("--mamba-block-size",), 1),
    # MultiModalConfig
    (("--limit-mm-per-prompt",), 1),
    (("--enable-mm-embeds",), BOOL),
    (("--media-io-kwargs",), 1),
    (("--mm-processor-kwargs",), 1),
    (("--mm-processor-cache-gb",), 1),
    (("--disable-mm-preprocessor-cache",), 0),
    (("--mm-processor-cache-type",), 1),
    (("--mm-shm-cache-max-object-size-mb",), 1),
    (("--mm-encoder-tp-mode",), 1),
    (("--mm-encoder-attn-backend",), 1),
    (("--interleave-mm-strings",), BOOL),
    (("--skip-mm-profiling",), BOOL),
    (("--video-pruning-rate",), 1),
    # LoRAConfig
    (("--enable-lora",), BOOL),
    (("--max-loras",), 1),
    (("--max-lora-rank",), 1),
    (("--lora-extra-vocab-size",), 1),
    (("--lora-dtype",), 1),
    (("--max-cpu-loras",), 1),
    (("--fully-sharded-loras",), BOOL),
    (("--default-mm-loras",), 1),
    # ObservabilityConfig
    (("--show-hidden-metrics-for-version",), 1),
    (("--otlp-traces-endpoint",), 1),
    (("--collect-detailed-traces",), "+"),
    # SchedulerConfig
    (("--max-num-batched-tokens",), 1),
    (("--max-num-seqs",), 1),
    (("--max-num-partial-prefills",), 1),
    (("--max-long-partial-prefills",), 1),
    (("--long-prefill-token-threshold",), 1),
    (("--num-lookahead-slots",), 1),
    (("--scheduling-policy",), 1),
    (("--enable-chunked-prefill",), BOOL),
    (("--disable-chunked-mm-input",), BOOL),
    (("--scheduler-cls",), 1),
    (("--disable-hybrid-kv-cache-manager",), BOOL),
    (("--async-scheduling",), BOOL),
    # CompilationConfig
    (("--cudagraph-capture-sizes",), "+"),
    (("--cuda-graph-sizes",), "+"),
    (("--max-cudagraph-capture-size",), 1),
    # VllmConfig
    (("--speculative-config",), 1),
    (("--kv-transfer-config",), 1),
    (("--kv-events-config",), 1),
    (("--compilation-config", "-O"), 1),
    (("--additional-config",), 1),
    (("--structured-outputs-config",), 1),
    # Other EngineArgs, then AsyncEngineArgs
    (("--disable-log-stats",), 0),
    (("--aggregate-engine-logging",), 0),
    (("--enable-log-requests",), BOOL),
    (("--disable-log-requests",), 0),
)

SGLANG_FLAGS: Final[tuple[tuple[tuple[str, ...], Arity], ...]] = (
    # Model and port args
    (("--model-path", "--model"), 1),
    (("--tokenizer-path",), 1),
    (("--host",), 1),
    (("--port",), 1),
    (("--tokenizer-mode",), 1),
    (("--skip-tokenizer-init",), 0),
    (("--skip-server-warmup",), 0),
    (("--load-format",), 1),
    (("--model-loader-extra-config",), 1),
    (("--trust-remote-code",), 0),
    (("--dtype",), 1),
    (("--kv-cache-dtype",), 1),
    (("--quantization",), 1),
    (("--quantization-param-path",), 1),
    (("--context-length",), 1),
    (("--device",), 1),
    (("--served-model-name",), 1),
    (("--chat-template",), 1),
    (("--completion-template",), 1),
    (("--is-embedding",), 0),
    (("--enable-multimodal",), 0),
    (("--revision",), 1),
    (("--impl",), 1),
    # Memory and scheduling
    (("--mem-fraction-static",), 1),
    (("--max-running-requests",), 1),
    (("--max-total-tokens",), 1),
    (("--chunked-prefill-size",), 1),
    (("--max-prefill-tokens",), 1),
    (("--schedule-policy",), 1),
    (("--schedule-conservativeness",), 1),
    (("--cpu-offload-gb",), 1),
    (("--page-size",), 1),
    (("--hybrid-kvcache-ratio",), "?"),
    # Other runtime options
    (("--tensor-parallel-size", "--tp-size"), 1),
    (("--pipeline-parallel-size", "--pp-size"), 1),
    (("--max-micro-batch-size",), 1),
    (("--stream-interval",), 1),
    (("--stream-output",), 0),
    (("--random-seed",), 1),
    (("--constrained-json-whitespace-pattern",), 1),
    (("--watchdog-timeout",), 1),
    (("--dist-timeout",), 1),
    (("--download-dir",), 1),
    (("--base-gpu-id",), 1),
    (("--gpu-id-step",), 1),
    (("--sleep-on-idle",), 0),
    # Logging
    (("--log-level",), 1),
    (("--log-level-http",), 1),
    (("--log-requests",), 0),
    (("--log-requests-level",), 1),
    (("--crash-dump-folder",), 1),
    (("--show-time-cost",), 0),
    (("--enable-metrics",), 0),
    (("--bucket-time-to-first-token",), "+"),
    (("--bucket-inter-token-latency",), "+"),
    (("--bucket-e2e-request-latency",), "+"),
    (("--collect-tokens-histogram",), 0),
    (("--kv-events-config",), 1),
    (("--decode-log-interval",), 1),
    (("--enable-request-time-stats-logging",), 0),
    # API related
    (("--api-key",), 1),
    (("--file-storage-path",), 1),
    (("--enable-cache-report",), 0),
    (("--reasoning-parser",), 1),
    (("--tool-call-parser",), 1),
    # Data parallelism
    (("--data-parallel-size", "--dp-size"), 1),
    (("--load-balance-method",), 1),
    # Multi-node distributed serving
    (("--dist-init-addr", "--nccl-init-addr"), 1),
    (("--nnodes",), 1),
    (("--node-rank",), 1),
    # Model override args
    (("--json-model-override-args",), 1),
    (("--preferred-sampling-params",), 1),
    # LoRA
    (("--lora-paths",), "*"),
    (("--max-loras-per-batch",), 1),
    (("--lora-backend",), 1),
    # Kernel backend
    (("--attention-backend",), 1),
    (("--sampling-backend",), 1),
    (("--grammar-backend",), 1),
    # Speculative decoding
    (("--speculative-algorithm",), 1),
    (("--speculative-draft-model-path",), 1),
    (("--speculative-num-steps",), 1),
    (("--speculative-eagle-topk",), 1),
    (("--speculative-num-draft-tokens",), 1),
    (("--speculative-accept-threshold-single",), 1),
    (("--speculative-accept-threshold-acc",), 1),
    (("--speculative-token-map",), 1),
    (("--mm-attention-backend",), 1),
    # Expert parallelism
    (("--expert-parallel-size", "--ep-size"), 1),
    (("--enable-ep-moe",), 0),
    (("--enable-flashinfer-moe",), 0),
    (("--enable-deepep-moe",), 0),
    (("--deepep-mode",), 1),
    (("--ep-num-redundant-experts",), 1),
    (("--ep-dispatch-algorithm",), 1),
    (("--init-expert-location",), 1),
    (("--enable-eplb",), 0),
    (("--eplb-algorithm",), 1),
    (("--eplb-rebalance-num-iterations",), 1),
    (("--eplb-rebalance-layers-per-chunk",), 1),
    (("--expert-distribution-recorder-mode",), 1),
    (("--expert-distribution-recorder-buffer-size",), 1),
    (("--enable-expert-distribution-metrics",), 0),
    (("--deepep-config",), 1),
    (("--moe-dense-tp-size",), 1),
    # Double sparsity
    (("--enable-double-sparsity",), 0),
    (("--ds-channel-config-path",), 1),
    (("--ds-heavy-channel-num",), 1),
    (("--ds-heavy-token-num",), 1),
    (("--ds-heavy-channel-type",), 1),
    (("--ds-sparse-decode-threshold",), 1),
    # Optimization/debug options
    (("--disable-radix-cache",), 0),
    (("--cuda-graph-max-bs",), 1),
    (("--cuda-graph-bs",), "+"),
    (("--disable-cuda-graph",), 0),
    (("--disable-cuda-graph-padding",), 0),
    (("--enable-profile-cuda-graph",), 0),
    (("--enable-nccl-nvls",), 0),
    (("--enable-tokenizer-batch-encode",), 0),
    (("--disable-outlines-disk-cache",), 0),
    (("--disable-custom-all-reduce",), 0),
    (("--enable-mscclpp",), 0),
    (("--disable-overlap-schedule",), 0),
    (("--disable-overlap-cg-plan",), 0),
    (("--enable-mixed-chunk",), 0),
    (("--enable-dp-attention",), 0),
    (("--enable-dp-lm-head",), 0),
    (("--enable-two-batch-overlap",), 0),
    (("--enable-torch-compile",), 0),
    (("--torch-compile-max-bs",), 1),
    (("--torchao-config",), 1),
    (("--enable-nan-detection",), 0),
    (("--enable-p2p-check",), 0),
    (("--triton-attention-reduce-in-fp32",), 0),
    (("--triton-attention-num-kv-splits",), 1),
    (("--num-continuous-decode-steps",), 1),
    (("--delete-ckpt-after-loading",), 0),
    (("--enable-memory-saver",), 0),
    (("--allow-auto-truncate",), 0),
    (("--enable-custom-logit-processor",), 0),
    (("--enable-hierarchical-cache",), 0),
    (("--hicache-ratio",), 1),
    (("--hicache-size",), 1),
    (("--hicache-write-policy",), 1),
    (("--flashinfer-mla-disable-ragged",), 0),
    (("--disable-shared-experts-fusion",), 0),
    (("--disable-chunked-prefix-cache",), 0),
    (("--disable-fast-image-processor",), 0),
    (("--enable-return-hidden-states",), 0),
    (("--warmups",), 1),
    # Debug tensor dumps
    (("--debug-tensor-dump-output-folder",), 1),
    (("--debug-tensor-dump-input-file",), 1),
    (("--debug-tensor-dump-inject",), 1),
    (("--debug-tensor-dump-prefill-only",), 0),
    # Disaggregation
    (("--disaggregation-mode",), 1),
    (("--disaggregation-transfer-backend",), 1),
    (("--disaggregation-bootstrap-port",), 1),
    (("--disaggregation-decode-tp",), 1),
    (("--disaggregation-decode-dp",), 1),
    (("--disaggregation-prefill-pp",), 1),
    (("--disaggregation-ib-device",), 1),
    (("--num-reserved-decode-tokens",), 1),
    (("--pdlb-url",), 1),
    (("--custom-weight-loader",), "*"),
    (("--weight-loader-disable-mmap",), 0),
)

VLLM_VERSION: Final = "0.11.1"
"""The vLLM release the flags above are (the first with ``--nnodes``, ``--master-addr``): what the stand-in says it
is (``fake-vllm --version``) unless ``FAKE_VLLM_AS_VLLM`` names another."""

SGLANG_VERSION: Final = "0.4.7"
"""The SGLang release the flags above are: what the stand-in's ``sglang.__version__`` says unless
``FAKE_VLLM_AS_SGLANG`` names another."""

INTRODUCED: Final[dict[str, dict[str, str]]] = {
    # First release whose source has the flag (the releases' source distributions on PyPI: vLLM's
    # vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py and vllm/entrypoints/cli/serve.py;
    # SGLang's python/sglang/srt/server_args.py).
    "vllm": {
        "--headless": "0.9.0",
        "--data-parallel-size-local": "0.9.0",
        "--data-parallel-address": "0.9.0",
        "--data-parallel-rpc-port": "0.9.0",
        "--api-server-count": "0.9.1",
        "--data-parallel-start-rank": "0.10.0",
        "--uds": "0.10.1",
        "--master-addr": "0.11.1",
        "--master-port": "0.11.1",
        "--nnodes": "0.11.1",
        "--node-rank": "0.11.1",
    },
    "sglang": {
        "--dist-init-addr": "0.3.3",
        "--enable-metrics": "0.3.5.post1",
        "--expert-parallel-size": "0.4.0.post1",
        "--pipeline-parallel-size": "0.4.6.post2",
    },
}
"""By engine and first option string: the release that brought a flag the oldest supported one lacks. A stand-in
acting as an older release (``FAKE_VLLM_AS_VLLM``, ``FAKE_VLLM_AS_SGLANG``) has no such flag: argparse refuses it
as that release would (``error: unrecognized arguments: ...``, exit status 2)."""


def release_key(version: str) -> tuple[tuple[int, ...], int]:
    """A release's order, enough for the versions above and the ones a test acts as (``0.10.1``, ``0.4.6.post1``,
    ``0.11.1+fakevllm.0.1.0``): its numbers without trailing zeros, then its post-release (-1: none)."""
    public = version.strip().lstrip("v").partition("+")[0]
    head, sep, post = public.partition(".post")
    numbers = [int(n) for n in head.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers), (int(post or 0) if sep else -1)


def has_flag(engine: str, flag: str, version: str) -> bool:
    """Whether the ``engine`` release ``version`` has ``flag`` (its first option string)."""
    since = INTRODUCED.get(engine, {}).get(flag)
    return since is None or release_key(version) >= release_key(since)
