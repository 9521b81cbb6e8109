"""The dry run's predicted spend: the run's records times what an earlier run of the same recipe measured per record
(requests, tokens), at the run file's prices, and what the jobs cost at most at their time limits; every figure the
bill prints recomputed here from the facts file and the price file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ddslurm.config import ProviderSnapshot, RecipeFact, facts_path, load_profile, update_facts
from ddslurm.launcher.submission._bill import bill_lines, make_bill
from ddslurm.launcher.submission._prepare import prepare
from ddslurm.launcher.testing import accept_recipe, write_unit_run
from ddslurm.planner import plan_arrays

KEY = "sk-bill-spend-test-0123456789"
PRICES = """version: 1
currency: EUR
models:
  m-1: {input: 0.60, output: 2.40}
partitions:
  gpu: {gpu_hour: 2.50, cpu_hour: 0.04}
"""


def _bill_text(run: Path, profile: Path, env: dict[str, str]) -> tuple[list[str], object]:
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    plan = prepared.plan
    arrays = plan_arrays(plan, prepared.layout, [s.index for s in plan.shards], 1001, kind="initial", stamp="s")
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    bill = make_bill(plan, arrays, prepared.aliases, snapshot)
    return bill_lines(bill), bill


def test_the_bill_predicts_a_hosted_aliass_requests_tokens_and_money_from_an_earlier_run_of_the_recipe(
    tmp_path: Path,
) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, num_records=61, shards=7, run_extra="prices: prices.yaml\n")
    (tmp_path / "prices.yaml").write_text(PRICES)
    first, bill = _bill_text(run, profile, env)
    text = "\n".join(first)
    assert "  writer  m-1 (hosted): not predicted: no run of this recipe here has measured it yet" in text
    # 7 CPU-only tasks of 1 CPU x the time limit, on a partition the price file gives no price: no money at most
    assert bill.limit_cost is None  # type: ignore[attr-defined]

    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    workspace = Path(load_profile(profile).workspace)
    earlier = RecipeFact(
        recipe_sha256=prepared.plan.recipe_facts_key(), requests_per_record={"writer": 1.25},
        input_tokens_per_record={"writer": 412.5}, output_tokens_per_record={"writer": 37.25},
        measured_by="run", run_id="earlier", measured_at="t",
    )  # fmt: skip
    workspace.mkdir(parents=True, exist_ok=True)
    update_facts(facts_path(workspace), lambda facts: facts.with_recipe_run(earlier))
    lines, bill = _bill_text(run, profile, env)
    requests, tokens_in, tokens_out = round(61 * 1.25), round(61 * 412.5), round(61 * 37.25)
    cost = (tokens_in * 0.60 + tokens_out * 2.40) / 1_000_000
    line = next(x for x in lines if x.startswith("  writer  m-1 (hosted): "))
    assert line == (
        f"  writer  m-1 (hosted): {requests:,} requests, {tokens_in:,} input and {tokens_out:,} output tokens, "
        f"{cost:.4f} EUR  (1 run)"
    )
    assert f"  total: {cost:.4f} EUR" in lines  # a hosted-only run: no GPU-hours to add
    assert any(x.startswith("predicted spend for 61 records") for x in lines)
    spend = msgspec.to_builtins(bill.spend)  # type: ignore[attr-defined]  # what --json carries
    expected = {"alias": "writer", "model": "m-1", "provider": "hosted", "requests": requests,
                "input_tokens": tokens_in, "output_tokens": tokens_out, "cost": None, "runs": 1}  # fmt: skip
    assert spend["hosted"][0] | {"cost": None} == expected
    assert abs(spend["hosted"][0]["cost"] - cost) < 1e-12


def test_the_time_limit_line_prices_what_the_jobs_hold_at_most(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, num_records=12, shards=3, run_extra="prices: prices.yaml\n")
    (tmp_path / "prices.yaml").write_text(PRICES.replace("  gpu: {", "  cpu: {"))
    lines, bill = _bill_text(run, profile, env)
    [job] = bill.jobs  # type: ignore[attr-defined]
    assert job.resources.partition == "cpu" and job.gpu_hours == 0
    at_most = job.cpu_hours * 0.04
    assert bill.limit_cost == at_most  # type: ignore[attr-defined]
    [line] = [x for x in lines if x.startswith("at the time limit: ")]
    assert f", at most {at_most:.4f} EUR at the price file's partition prices; automatic retries not" in line
