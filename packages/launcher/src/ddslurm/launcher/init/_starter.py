"""What ``ddslurm init`` writes that depends on where it runs: the embedded cluster, and the starter recipes.

On the local Slurm cluster this repository embeds (``tools/local-slurm``: the configuration file the controller
read begins with that tool's mark), deployments are served by the vLLM stand-in of the environment init runs in,
and a starter's hosted model is the same stand-in, started by the user on a free loopback port with a key made up
in their shell. Elsewhere vLLM is ``vllm`` on the nodes and the hosted model is NVIDIA's API catalogue.

``--example hosted`` is a builder script (``build.py``, Data Designer's ``load_config_builder()`` convention) with
one hosted alias; ``--example mixed`` adds a model the run serves itself (a deployment on the job's GPUs) and makes
the hosted model its judge. Both come with a Data Designer home (``dd-home/model_providers.yaml``) that names the
key's environment variable, never a key.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from dataclasses import dataclass
from pathlib import Path

from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import InitError, SlurmError
from ddslurm.launcher.init._example import Example
from ddslurm.providers import PROVIDERS_FILE
from ddslurm.runtime import PortUnavailableError, draw_port, listening_ports

LOCAL_SLURM_MARK = "# Written by tools/local-slurm"
"""The first line of the slurm.conf ``tools/local-slurm`` writes."""
STAND_IN = "fake-vllm"
"""The vLLM stand-in's command (``tools/fake-vllm``), in the environment init runs in."""
BUILD_SCRIPT = "build.py"
DD_HOME = "dd-home"
PROVIDER = "hosted"
"""The provider name the starter's hosted alias uses, in ``dd-home/model_providers.yaml``."""
HOSTED_MODEL = "nvidia/nemotron-3-nano-30b-a3b"
"""The hosted model the starter asks for (on the embedded cluster, the stand-in answers as this model)."""
STAND_IN_KEY_ENV = "STAND_IN_API_KEY"
NVIDIA_ENDPOINT = "https://integrate.api.nvidia.com/v1"
NVIDIA_KEY_ENV = "NVIDIA_API_KEY"
STARTER_FILES = (BUILD_SCRIPT, f"{DD_HOME}/{PROVIDERS_FILE}")
"""The files a starter adds beside the run file."""
LOCAL_ALIAS = "generator"
LOCAL_MODEL = "Qwen/Qwen3-8B"
LOCAL_SERVED_NAME = "qwen3-8b"


def on_embedded_cluster(slurm: Slurm) -> bool:
    """Whether the cluster is the one ``tools/local-slurm`` runs on this machine: the configuration file its
    controller read (``scontrol show config``: ``SLURM_CONF``) begins with that tool's mark."""
    conf = ""
    with contextlib.suppress(SlurmError):
        conf = slurm.config().slurm_conf
    if not conf:
        return False
    try:
        with Path(conf).open(encoding="utf-8", errors="replace") as handle:
            return handle.readline().startswith(LOCAL_SLURM_MARK)
    except OSError:
        return False


def stand_in_executable(python_env: Path) -> Path | None:
    """The vLLM stand-in of ``python_env`` (``<python_env>/bin/fake-vllm``), None when it has none."""
    path = python_env / "bin" / STAND_IN
    return path if path.is_file() else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` nothing listens on now, drawn at random where ddslurm's own servers listen
    (:func:`ddslurm.runtime.listening_ports`: outside the kernel's ephemeral range). The kernel's choice (a bind to
    port 0) comes from the range every outgoing connection takes its source port from: by the time the user starts
    the stand-in there, one of them can hold it, the stand-in cannot listen, and the run's hosted requests reach
    whatever does (a test saw a run fail on HTTP 502 that way). :class:`InitError` when none is free."""
    ports = listening_ports()
    try:
        return draw_port(lambda port: port_problem(port, host) is None, ports=ports)
    except PortUnavailableError:
        raise InitError(
            f"no free port for the stand-in: every port of {host} from {ports.start} to {ports.stop - 1} (outside "
            "the kernel's ephemeral range) is taken; give one with --port"
        ) from None


def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why a server could not listen on ``port`` of ``host`` now (not a TCP port, taken, or below 1024 for a user
    without the privilege), None when it could: the port is bound once, as the stand-in binds it
    (``SO_REUSEADDR``: a port whose last connections are closing is not taken), and let go."""
    if not 1 <= port <= 65535:
        return f"{port} is not a TCP port (1 to 65535)"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} of {host} is taken (something listens on it)"
            if exc.errno == errno.EACCES:
                return f"port {port} of {host} needs privileges this user lacks (a port below 1024)"
            return f"port {port} of {host} cannot be listened on: {exc.strerror or exc}"
    return None


@dataclass(frozen=True, slots=True)
class HostedProvider:
    """The provider of the starter's hosted alias: the stand-in on ``port`` (embedded cluster; ``given``: the
    user's ``--port``, else a free one), else NVIDIA's."""

    endpoint: str
    api_key_env: str
    port: int | None = None
    given: bool = False

    @property
    def stand_in(self) -> bool:
        return self.port is not None


def hosted_provider(embedded: bool, port: int | None) -> HostedProvider:
    """The starter's provider: on the embedded cluster the stand-in on ``port`` (a free one when None); elsewhere
    NVIDIA's API catalogue, which has no port to choose (:class:`InitError` when one is given)."""
    if embedded:
        chosen = port if port is not None else free_port()
        return HostedProvider(f"http://127.0.0.1:{chosen}/v1", STAND_IN_KEY_ENV, chosen, given=port is not None)
    if port is not None:
        raise InitError(
            f"--port {port}: this is not the embedded cluster (tools/local-slurm), where init starts no stand-in: the "
            f"starter's hosted provider is NVIDIA's API catalogue ({NVIDIA_ENDPOINT}); leave --port out"
        )
    return HostedProvider(NVIDIA_ENDPOINT, NVIDIA_KEY_ENV)


@dataclass(frozen=True, slots=True)
class Starter:
    """A starter recipe: its builder script, its Data Designer home and the deployments its run file needs."""

    example: Example
    hosted: HostedProvider

    @property
    def deploys(self) -> bool:
        return self.example is Example.mixed

    def files(self) -> dict[str, str]:
        """Paths relative to the run file's directory (:data:`STARTER_FILES`), and their texts."""
        return dict(zip(STARTER_FILES, (self.build_script(), self.providers_yaml()), strict=True))

    def build_script(self) -> str:
        header = [
            f'"""Starter recipe written by `ddslurm init --example {self.example}`: a Data Designer builder script.',
            "",
            "ddslurm runs load_config_builder() once on the submit host (as `data-designer create build.py` would) and",
            "the compute nodes generate what it returns. Edit the columns, then `ddslurm submit --dry-run` again.",
        ]
        if self.deploys:
            header += [
                f'"{LOCAL_ALIAS}" is served by the run itself (run.yaml: deployments, vLLM on the job\'s GPUs); '
                f'"judge" is a',
                f'hosted model: provider "{PROVIDER}" in {DD_HOME}/{PROVIDERS_FILE} (DATA_DESIGNER_HOME).',
            ]
        else:
            header += [
                f'"writer" is a hosted model: provider "{PROVIDER}" in {DD_HOME}/{PROVIDERS_FILE} (DATA_DESIGNER_HOME).'
            ]
        lines = [*header, '"""', "", "import data_designer.config as dd", "", ""]
        lines += ["def load_config_builder() -> dd.DataDesignerConfigBuilder:", "    models = ["]
        if self.deploys:
            lines += _model(LOCAL_ALIAS, LOCAL_SERVED_NAME, "local", "# served by run.yaml's deployment", 256)
            lines += _model("judge", HOSTED_MODEL, PROVIDER, "# hosted", 128)
        else:
            lines += _model("writer", HOSTED_MODEL, PROVIDER, "# hosted", 256)
        writer = LOCAL_ALIAS if self.deploys else "writer"
        lines += [
            "    ]",
            "    builder = dd.DataDesignerConfigBuilder(model_configs=models)",
            "    builder.add_column(",
            "        dd.SamplerColumnConfig(",
            '            name="topic",',
            '            sampler_type="category",',
            '            params=dd.CategorySamplerParams(values=["weather", "bread", "trains", "gardens"]),',
            "        )",
            "    )",
            "    builder.add_column(",
            "        dd.LLMTextColumnConfig(",
            '            name="question",',
            f'            model_alias="{writer}",',
            '            prompt="Write one question a curious newcomer might ask about {{ topic }}.",',
            "        )",
            "    )",
        ]
        if self.deploys:
            lines += [
                "    builder.add_column(",
                "        dd.LLMJudgeColumnConfig(",
                '            name="quality",',
                '            model_alias="judge",',
                '            prompt="Topic: {{ topic }}\\nQuestion: {{ question }}\\nJudge the question.",',
                "            scores=[",
                "                dd.Score(",
                '                    name="Clarity",',
                '                    description="Is the question clear and about the topic?",',
                '                    options={1: "unclear", 2: "fair", 3: "clear"},',
                "                )",
                "            ],",
                "        )",
                "    )",
            ]
        lines += [
            '    builder.add_column(dd.ExpressionColumnConfig(name="question_chars", expr="{{ question | length }}", '
            'dtype="int"))',
            "    return builder",
            "",
        ]
        return "\n".join(lines)

    def providers_yaml(self) -> str:
        h = self.hosted
        if h.stand_in:
            about = [
                f'# "{PROVIDER}" is the vLLM stand-in on this machine (port {h.port}), started as init printed,',
                f"# requiring the key in {h.api_key_env}. On a real cluster: a provider such as {NVIDIA_ENDPOINT}.",
            ]
        else:
            about = [
                f'# "{PROVIDER}" is NVIDIA\'s API catalogue (build.nvidia.com, key in {h.api_key_env}). For another',
                "# OpenAI-compatible provider, change endpoint and api_key here and the model in build.py.",
            ]
        return "\n".join(
            [
                "# Data Designer's own provider settings for this run, written by ddslurm init: the file Data Designer",
                "# reads from ~/.data-designer, here read with DATA_DESIGNER_HOME=<this directory>.",
                *about,
                "# api_key is the NAME of an environment variable, never the key itself.",
                "providers:",
                f"- name: {PROVIDER}",
                f"  endpoint: {h.endpoint}",
                "  provider_type: openai",
                f"  api_key: {h.api_key_env}",
                "",
            ]
        )

    def deployment_lines(self, gpus_per_node: int) -> list[str]:
        """The run file's ``deployments`` (the mixed starter's local generator), with a comment on every field."""
        if not self.deploys:
            return [
                f"# vLLM servers started inside each job. build.py's alias resolves to a hosted provider "
                f"({DD_HOME}/{PROVIDERS_FILE}),",
                "# so the run asks for CPUs only. A deployment serves an alias on the job's GPUs (docs/serving.md).",
                "deployments: []",
            ]
        return [
            "# vLLM servers started inside each job, one entry per model alias of build.py to serve on the job's GPUs",
            "# (the other aliases resolve to hosted providers).",
            "deployments:",
            f"  - model_alias: {LOCAL_ALIAS}           # the alias build.py's question column uses",
            f"    model: {LOCAL_MODEL}             # what vLLM loads: a hub id, or a path the nodes can read",
            f"    served_model_name: {LOCAL_SERVED_NAME}      # the model name build.py asks for",
            "    replicas: 1                      # server processes behind the alias's one endpoint",
            f"    tensor_parallel: 1               # GPUs per replica; replicas x tensor_parallel <= {gpus_per_node}",
            "    # pipeline_parallel: 1           # replicas bigger than a node: x tensor_parallel, on whole nodes",
            "    server:",
            '      extra_args: ["--max-model-len", "8192"]',
            "      # env_from: [HF_TOKEN]           # variables of your shell the servers get, by name (gated models)",
        ]


def _model(alias: str, model: str, provider: str, comment: str, max_tokens: int) -> list[str]:
    return [
        f"        dd.ModelConfig(  {comment}",
        f'            alias="{alias}",',
        f'            model="{model}",',
        f'            provider="{provider}",',
        f"            inference_parameters=dd.ChatCompletionInferenceParams(max_parallel_requests=8, "
        f"max_tokens={max_tokens}),",
        "        ),",
    ]
