"""The line SGLang logs at INFO when it starts: its whole parsed arguments, the API key in clear among them.

Real SGLang (``sglang.srt.entrypoints.engine._launch_subprocesses``, every release up to the late-2026 main)
logs ``logger.info(f"{server_args=}")``: the dataclass ``repr`` of ``ServerArgs``, ``api_key='…'`` included, on
every node rank (sgl-project/sglang#37457, open; newer mains log ``server_args.resolved_dict()``, the same key).
The stand-in always does it in SGLang mode, as every SGLang does: a test that scans the server log for the token
sees what a real run would leave there.
"""

from __future__ import annotations

from fake_vllm.settings import Settings


def server_args_line(settings: Settings) -> str:
    """``server_args=ServerArgs(model_path='…', …, api_key='…', …)``, the fields in SGLang's order (a subset: the
    ones the stand-in models), each as its ``repr``."""
    group = settings.group
    fields: list[tuple[str, object]] = [
        ("model_path", settings.model),
        ("tokenizer_path", settings.model),
        ("host", settings.host),
        ("port", settings.port),
        ("served_model_name", settings.primary_name),
        ("api_key", settings.api_keys[0] if settings.api_keys else None),
        ("tp_size", settings.tensor_parallel_size),
        ("pp_size", settings.pipeline_parallel_size),
        ("dp_size", settings.data_parallel_size),
        ("ep_size", settings.expert_parallel_size),
        ("max_running_requests", settings.max_num_seqs),
        ("enable_metrics", settings.enable_metrics),
        ("dist_init_addr", None if group is None else group.rendezvous),
        ("nnodes", 1 if group is None else group.nodes),
        ("node_rank", 0 if group is None else group.rank),
    ]
    return "server_args=ServerArgs(" + ", ".join(f"{name}={value!r}" for name, value in fields) + ")"
