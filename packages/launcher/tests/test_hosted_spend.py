"""A run's hosted figures summed from its attempts' request records: every request once, spent over every attempt,
kept over the winners' attempts and those they resumed from, dollars from the run's price file only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import (
    AttemptRecord,
    ClusterProfile,
    HostedRequest,
    ModelPrice,
    Plan,
    Prices,
    ProviderSnapshot,
    RunFile,
    RunLayout,
    SnapshotModel,
    SnapshotProvider,
    WinnerRecord,
    budget_key,
    encode,
)
from ddslurm.launcher.runs._hosted_spend import Tally, hosted_spend, read_requests, tally
from ddslurm.planner import PlanInputs, compile_plan

PROVIDER = SnapshotProvider(name="api", endpoint="https://api.example.com/v1", api_key_env="API_KEY")
SNAPSHOT = ProviderSnapshot(
    providers=(PROVIDER,),
    models=(SnapshotModel(alias="writer", model="w", provider="api"), SnapshotModel(alias="judge", model="j",
                                                                                   provider="api")),
)  # fmt: skip
KEY = budget_key(PROVIDER.endpoint, PROVIDER.api_key_env)


def _plan(layout: RunLayout, prices: Prices | None) -> Plan:
    run = RunFile(name="demo", recipe="recipe.yaml", num_records=6, shards=2)
    inputs = PlanInputs(run=run, profile=ClusterProfile(workspace="/ws", python_env="/venv"), snapshot=SNAPSHOT,
                        layout=layout, recipe_sha256="1" * 64, snapshot_sha256="2" * 64, prices=prices)  # fmt: skip
    return compile_plan(inputs)


def _attempt(layout: RunLayout, shard: int, name: str, lines: list[HostedRequest], **record: object) -> None:
    where = layout.stage_shard(shard, None).attempt(name)
    where.dir.mkdir(parents=True)
    fields: dict[str, object] = {"shard": shard, "attempt": name, "job_id": "1", "node": "n1", "state": "failed",
                                 "started_at": "2026-12-04T10:00:00+00:00"}  # fmt: skip
    fields.update(record)
    where.record.write_bytes(encode(AttemptRecord(**fields)))  # type: ignore[arg-type]
    where.hosted_requests.write_bytes(b"".join(encode(line) for line in lines) + b'{"id": "cut sh')


def _request(rid: str, model: str, status: int | None, tokens: tuple[int, int] = (0, 0), at: float = 0) -> list[
        HostedRequest]:  # fmt: skip
    sent = HostedRequest(id=rid, key=KEY, model=model, at=at)
    if status is None:
        return [sent]
    return [sent, HostedRequest(id=rid, key=KEY, model=model, at=at + 1, status=status, input_tokens=tokens[0],
                                output_tokens=tokens[1])]  # fmt: skip


def test_spent_counts_every_attempt_and_kept_the_winners_chain(tmp_path: Path) -> None:
    """Shard 0: attempt a (killed, one request never answered), b resumed from a and won: both kept. Shard 1:
    attempt c failed and was not resumed from, d won afresh: only d kept. Dollars from the price file; the judge
    model has no price there and says so."""
    layout = RunLayout.in_workspace(tmp_path, "run-1")
    prices = Prices(version=1, models={"w": ModelPrice(input=2.0, output=10.0)})
    plan = _plan(layout, prices)
    _attempt(layout, 0, "attempt-a", [*_request("a1", "w", 200, (100, 10), at=60), *_request("a2", "w", 429, at=61),
                                      *_request("a3", "w", None, at=62)])  # fmt: skip
    _attempt(layout, 0, "attempt-b", [*_request("b1", "w", 200, (50, 5), at=130), *_request("b2", "j", 200, (7, 1))],
             state="succeeded", resumed_from="attempt-a")  # fmt: skip
    _attempt(layout, 1, "attempt-c", _request("c1", "w", 500, at=125))
    _attempt(layout, 1, "attempt-d", _request("d1", "w", 200, (20, 2), at=125), state="succeeded")
    for shard, attempt, rows in ((0, "attempt-b", 3), (1, "attempt-d", 3)):
        layout.stage_shard(shard, None).winner.write_bytes(encode(WinnerRecord(
            shard=shard, attempt=attempt, rows=rows, dataset_dir="d", files=(), plan_sha256="0" * 64,
            published_at="2026-12-04T10:00:00+00:00")))  # fmt: skip

    spend = hosted_spend(layout, plan, SNAPSHOT)

    [judge, writer] = spend.models
    assert (writer.model, writer.aliases, writer.provider, writer.key_env) == ("w", ("writer",), "api", "API_KEY")
    assert writer.spent == Tally(requests=6, succeeded=3, limited=1, failed=1, unanswered=1, input_tokens=170,
                                 output_tokens=17)  # fmt: skip
    assert writer.kept == Tally(requests=5, succeeded=3, limited=1, unanswered=1, input_tokens=170, output_tokens=17)
    assert writer.spent_cost == pytest.approx((170 * 2.0 + 17 * 10.0) / 1e6)
    assert (judge.spent.tokens, judge.spent_cost, spend.unpriced) == (8, None, ("j",))
    assert spend.kept_rows == 6 and spend.cost_per_1000_kept_rows == pytest.approx(writer.spent_cost / 6 * 1000)
    assert [(m.start, m.requests, m.limited) for m in spend.minutes] == [(0, 1, 0), (60, 3, 1), (120, 3, 0)]
    assert [(a.shard, a.attempt, a.kept) for a in spend.attempts if a.model == "w"] == [
        (0, "attempt-a", True), (0, "attempt-b", True), (1, "attempt-c", False), (1, "attempt-d", True)
    ]  # fmt: skip


def test_without_a_price_file_there_are_no_dollars(tmp_path: Path) -> None:
    layout = RunLayout.in_workspace(tmp_path, "run-1")
    _attempt(layout, 0, "attempt-a", _request("a1", "w", 200, (1, 1)))
    spend = hosted_spend(layout, _plan(layout, None), SNAPSHOT)
    assert (spend.currency, spend.spent_cost, spend.unpriced, spend.spent.requests) == (None, None, (), 1)


def test_a_record_cut_short_by_a_kill_loses_only_its_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "hosted-requests.jsonl"
    path.write_bytes(b"".join(encode(x) for x in _request("x", "w", 200, (3, 4))) + b'{"id":"y","ke')
    assert tally(read_requests(path)) == {(KEY, "w"): Tally(requests=1, succeeded=1, input_tokens=3, output_tokens=4)}


def test_a_request_the_gate_could_not_deliver_is_not_among_the_providers_requests(tmp_path: Path) -> None:
    """The gate's own 502 (connection refused, or closed before any answer) is counted apart: the provider neither
    received nor billed it; a 504 (the provider's answer late) is a request the provider had, failed."""
    path = tmp_path / "hosted-requests.jsonl"
    lost = HostedRequest(id="x", key=KEY, model="w", at=1, status=502, gate=True)
    late = HostedRequest(id="y", key=KEY, model="w", at=1, status=504, gate=True)
    sent = [HostedRequest(id=r, key=KEY, model="w", at=0) for r in ("x", "y")]
    path.write_bytes(b"".join(encode(x) for x in (*sent, lost, late)))
    assert tally(read_requests(path)) == {(KEY, "w"): Tally(requests=1, failed=1, unreached=1)}


def test_the_reports_gpu_hours_cost_what_the_price_file_says_of_the_generation_partition() -> None:
    from ddslurm.config import PartitionPrice, Resources
    from ddslurm.config.testing import make_plan
    from ddslurm.launcher.report._model import GpuUsage
    from ddslurm.launcher.report._usage import priced

    gpu = GpuUsage(allocated_gpu_hours=1.5, generating_gpu_hours=1.2)
    prices = Prices(version=1, currency="EUR", partitions={"gpu": PartitionPrice(gpu_hour=2.4)})
    plan = make_plan("run-1", (5,), generation=Resources(partition="gpu", time_minutes=60, gres="gpu:1"), prices=prices)
    gpu_priced = priced(gpu, plan)
    assert (gpu_priced.allocated_cost, gpu_priced.currency) == (pytest.approx(1.5 * 2.4), "EUR")
    other = make_plan("run-1", (5,), generation=Resources(partition="a100", time_minutes=60), prices=prices)
    assert priced(gpu, other).allocated_cost is None  # no price for that partition: no money
