"""Counters and gauges under vLLM's metric names, or SGLang's (``sglang:*``, from its
``python/sglang/srt/metrics/collector.py``), rendered in the Prometheus text format (0.0.4). A replica with
data-parallel ranks reports its totals."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

# vLLM's buckets for vllm:e2e_request_latency_seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Metrics:
    """Mutable server metrics; only touched from the event loop thread, so no locking."""

    model_name: str
    capacity: int = 0
    engine: str = "vllm"
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    successes: Counter[str] = field(default_factory=Counter)
    latency_counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    latency_sum: float = 0.0
    latency_count: int = 0

    def record_success(self, *, finish_reason: str, prompt: int, generated: int, seconds: float) -> None:
        self.successes[finish_reason] += 1
        self.prompt_tokens += prompt
        self.generation_tokens += generated
        self.latency_sum += seconds
        self.latency_count += 1
        for index, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.latency_counts[index] += 1

    def _histogram(self, name: str) -> list[tuple[str, str, float]]:
        buckets: list[tuple[str, str, float]] = [
            (f"{name}_bucket", f'le="{bound!r}"', count)
            for bound, count in zip(LATENCY_BUCKETS, self.latency_counts, strict=True)
        ]
        buckets.append((f"{name}_bucket", 'le="+Inf"', self.latency_count))
        buckets.append((f"{name}_count", "", self.latency_count))
        buckets.append((f"{name}_sum", "", self.latency_sum))
        return buckets

    def render(self) -> str:
        if self.engine == "sglang":
            return self.render_sglang()
        labels = f'engine="0",model_name="{_escape(self.model_name)}"'
        usage = self.running / self.capacity if self.capacity > 0 else 0.0
        lines: list[str] = []
        family = _family(lines, labels)

        family(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("vllm:num_requests_running", "", self.running)],
        )
        family(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("vllm:num_requests_waiting", "", self.waiting)],
        )
        family(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("vllm:kv_cache_usage_perc", "", usage)],
        )
        family(
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            [("vllm:num_preemptions_total", "", 0)],
        )
        family(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            [("vllm:prompt_tokens_total", "", self.prompt_tokens)],
        )
        family(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            [("vllm:generation_tokens_total", "", self.generation_tokens)],
        )
        reasons = sorted({"stop", "length", *self.successes})
        family(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [("vllm:request_success_total", f'finished_reason="{r}"', self.successes[r]) for r in reasons],
        )
        family(
            "vllm:e2e_request_latency_seconds",
            "histogram",
            "Histogram of e2e request latency in seconds.",
            self._histogram("vllm:e2e_request_latency_seconds"),
        )
        return "\n".join(lines) + "\n"

    def render_sglang(self) -> str:
        """SGLang's names (``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector``), label ``model_name``."""
        lines: list[str] = []
        family = _family(lines, f'model_name="{_escape(self.model_name)}"')
        usage = self.running / self.capacity if self.capacity > 0 else 0.0
        gauges = (
            ("sglang:num_running_reqs", "The number of running requests.", self.running),
            ("sglang:num_used_tokens", "The number of used tokens.", 0),
            ("sglang:token_usage", "The token usage.", usage),
            ("sglang:gen_throughput", "The generation throughput (token/s).", 0),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", self.waiting),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", 0),
        )
        for name, help_text, value in gauges:
            family(name, "gauge", help_text, [(name, "", value)])
        counters = (
            ("sglang:prompt_tokens_total", "Number of prefill tokens processed.", self.prompt_tokens),
            ("sglang:generation_tokens_total", "Number of generation tokens processed.", self.generation_tokens),
            ("sglang:num_requests_total", "Number of requests processed.", self.latency_count),
        )
        for name, help_text, value in counters:
            family(name, "counter", help_text, [(name, "", value)])
        family(
            "sglang:e2e_request_latency_seconds",
            "histogram",
            "Histogram of End-to-end request latency in seconds",
            self._histogram("sglang:e2e_request_latency_seconds"),
        )
        return "\n".join(lines) + "\n"


def _family(lines: list[str], labels: str) -> Callable[[str, str, str, list[tuple[str, str, float]]], None]:
    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for sample_name, extra_labels, value in samples:
            all_labels = f"{extra_labels},{labels}" if extra_labels else labels
            lines.append(f"{sample_name}{{{all_labels}}} {float(value)!r}")

    return family


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
