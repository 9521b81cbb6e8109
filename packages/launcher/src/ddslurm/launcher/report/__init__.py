"""``ddslurm report``: the numbers of a run (:func:`run_report`, pure reading of the run directory plus one
``sacct``; :func:`report_json` for ``--json``) and a self-contained HTML page of them (:func:`render_html`, charts
by plotly with its JavaScript inlined, so the page opens offline on a login node).

Modules, one job each: ``_read`` (the run directory, the logs and ``sacct`` read into raw facts),
``_client_out`` (Data Designer's output of an attempt scraped for model usage), ``_numbers`` (the numbers made of
the facts: the run's totals, predicted beside measured, failures), ``_timeline`` (the attempts' phases and records
over time), ``_usage`` (usage per model, GPU time and its money, hosted keys), ``_columns`` (the dataset and its
columns), ``_model`` (the numbers as typed structs) and ``_html`` (the page; the only importer of plotly).

Where each number comes from:

- the timeline: submission records (queued; a CPU-stage array's wait for the GPU stage), attempt records (started,
  ended), the controller's events in the array task's batch output (``serving.ready``), the client's
  ``batch.complete`` events (``client.log``) and the winner's ``published_at``;
- records over time, of every stage: the ``batch.complete`` events (each says the attempt's rows so far), else
  progress files; rates are rows over the union of the attempts' generating spans;
- model usage: Data Designer's ``Model usage summary`` that each generation step prints into ``client.out``
  (per model name; the model-config lines above it name the alias and provider), summed over every attempt; its
  tokens/s over the union of the generating spans of the attempts that used it;
- GPU-hours: ``sacct`` (elapsed x GPUs of the allocation) against, per allocation, the sum over its replicas of
  the union of the spans in which the replica had a request in flight (``busy-<alias>-<i>.jsonl``) x the replica's
  GPUs (else its attempts' generating spans x its GPUs);
- failures: attempt records grouped by reason;
- columns: the dataset's Parquet statistics and Data Designer's per-shard analysis (``metadata.json``).
"""

from ddslurm.launcher.report._client_out import parse_client_out
from ddslurm.launcher.report._html import render_html
from ddslurm.launcher.report._model import RunReport, report_json
from ddslurm.launcher.report._numbers import numbers, run_report
from ddslurm.launcher.report._read import RunFacts, read_run

__all__ = [
    "RunFacts",
    "RunReport",
    "numbers",
    "parse_client_out",
    "read_run",
    "render_html",
    "report_json",
    "run_report",
]
