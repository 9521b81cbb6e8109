"""The workspace's facts in the launcher: measured from a finished run (the report's fixture runs), recorded once
per run into the workspace, read at submit with the partition's GPU type."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from packages.launcher.tests.test_report import SACCT, STAGED_SACCT, _epoch, _event, make_report_run, make_staged_run
from packages.launcher.tests.test_stages_submit import RECIPE as STAGE_RECIPE
from packages.launcher.tests.test_stages_submit import _files as stage_files

from ddslurm.config import (
    ClientUsage,
    Facts,
    FactUse,
    LayoutChoice,
    ModelFact,
    ModelShape,
    PartitionNodes,
    Prediction,
    ProviderSnapshot,
    RecipeFact,
    RunLayout,
    atomic_write,
    encode,
    facts_path,
    load_profile,
    read_facts,
    read_plan,
    write_facts,
)
from ddslurm.launcher.cli import main
from ddslurm.launcher.cluster._slurm import Completed, Slurm
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.facts._measure import measure_run
from ddslurm.launcher.facts._workspace import PartitionGpuNodes, partition_gpu_type, partition_nodes, record_facts
from ddslurm.launcher.report import render_html, report_json, run_report
from ddslurm.launcher.submission._bill import bill_lines, make_bill
from ddslurm.launcher.submission._prepare import prepare
from ddslurm.launcher.testing import FakeSlurm, accept_recipe
from ddslurm.planner import PlanInputs

BUSY = {0: [("50:21", "50:58"), ("50:59", "51:14")]}  # replica 0 busy 37 + 15 s


def staged_in_workspace(tmp_path: Path, *, capacity: int = 8, gpu_type: str = "h100") -> tuple[Path, RunLayout]:
    """The report's two-stage run (2 shards of 4 records; GPU stage in allocation 300_0, CPU stage in 302_0), in a
    workspace's ``runs/``, its servers started at 50:11 (ready at 50:20), its replica's capacity ``capacity``."""
    workspace = tmp_path / "ws"
    (workspace / "runs").mkdir(parents=True)
    layout = make_staged_run(workspace / "runs", BUSY)
    plan = read_plan(layout.plan)
    assert plan.serving is not None
    deps = tuple(msgspec.structs.replace(d, capacity=capacity) for d in plan.serving.deployments)
    serving = msgspec.structs.replace(plan.serving, deployments=deps)
    atomic_write(layout.plan, encode(msgspec.structs.replace(plan, serving=serving, gpu_type=gpu_type)))
    (layout.logs / "slurm-300_0.out").write_text(
        _event("server.started", "50:11", step="server-writer-0") + _event("serving.ready", "50:20")
    )
    return workspace, layout


def test_a_finished_run_measures_its_model_and_recipe(tmp_path: Path) -> None:
    _, layout = staged_in_workspace(tmp_path)
    gpu_attempt = layout.stage_shard(0, 0).attempt("attempt-301")
    atomic_write(gpu_attempt.client_usage, encode(ClientUsage(cpu_s=3.5, setup_cpu_s=1.5, wall_s=60.0)))
    models, recipe = measure_run(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))

    [model] = models
    assert model.shape == ModelShape(engine="vllm", model="/models/writer", tensor_parallel=2, gpu_type="h100")
    assert model.load_s == (_epoch("50:20") - _epoch("50:11"))  # serving.ready - the first server.started
    # 8 requests (4 per GPU-stage attempt) over the replica's busy seconds: throughput while busy
    assert model.requests_per_s == round(8 / (37 + 15), 4)
    assert (model.capacity, model.measured_by, model.run_id) == (8, "run", layout.run_id)

    assert recipe is not None and recipe.recipe_sha256 == read_plan(layout.plan).recipe_sha256
    assert recipe.requests_per_record == {"writer": 8 / 8, "judge": 8 / 8}
    # sacct's 80 s - the 9 s load - the generating span (50:20 to 51:15, both workers' union)
    assert recipe.allocation_overhead_s == 80 - 9 - 55
    # 8 CPU-stage rows over its 20 generating seconds, two workers at once (51:40-51:50 and 51:41-52:00)
    assert recipe.cpu_stage_records_per_s == round(8 / 20 / 2, 4)
    # only the attempt that wrote its usage counts: 2 CPU-seconds over its 4 requests to the deployed writer (the
    # 1.5 it had spent importing before its generation began are no request's)
    assert recipe.client_cpu_s_per_request == (3.5 - 1.5) / 4


def test_without_client_usage_or_busy_logs(tmp_path: Path) -> None:
    _, layout = staged_in_workspace(tmp_path)
    for replica in BUSY:
        for log in layout.allocation("301").glob(f"busy-writer-{replica}.jsonl"):
            log.unlink()
    models, recipe = measure_run(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    assert recipe is not None and recipe.client_cpu_s_per_request is None
    # no busy log: the replica counted busy over the allocation's generating span (55 s)
    assert [m.requests_per_s for m in models] == [round(8 / 55, 4)]


def test_record_facts_merges_once_per_run_and_only_for_a_succeeded_run(tmp_path: Path) -> None:
    workspace, layout = staged_in_workspace(tmp_path)
    other = ModelFact(
        shape=ModelShape(model="/models/other"), load_s=30, requests_per_s=2, capacity=4, measured_by="tune",
        run_id="tune-1", measured_at="2025-01-01T00:00:00+00:00",
    )  # fmt: skip
    write_facts(facts_path(workspace), Facts(models=(other,)))
    slurm = Slurm(FakeSlurm(sacct=STAGED_SACCT))
    first = datetime(2026, 1, 1, tzinfo=UTC)
    done = record_facts(workspace, layout, slurm, now=first)
    assert done.skipped is None
    facts = read_facts(facts_path(workspace))
    assert facts.models[0] == other  # another shape's fact kept
    [writer] = [m for m in facts.models if m.shape.model == "/models/writer"]
    assert (writer.run_id, writer.measured_at) == (layout.run_id, "2026-01-01T00:00:00+00:00")
    assert [r.run_id for r in facts.recipes] == [layout.run_id]

    again = record_facts(workspace, layout, slurm, now=datetime(2026, 2, 1, tzinfo=UTC))
    assert again.skipped is not None and "recorded already" in again.skipped
    assert read_facts(facts_path(workspace)) == facts  # not even measured_at changed

    # a run that has not succeeded records nothing
    workspace2, layout2 = staged_in_workspace(tmp_path / "b")
    layout2.shard(1).winner.unlink()
    skipped = record_facts(workspace2, layout2, slurm)
    assert skipped.skipped is not None and "not succeeded" in skipped.skipped
    assert not facts_path(workspace2).exists()


def test_report_records_the_facts_and_a_failure_to_measure_only_warns(tmp_path: Path) -> None:
    workspace, layout = staged_in_workspace(tmp_path)
    out, err, fake = io.StringIO(), io.StringIO(), FakeSlurm(sacct=STAGED_SACCT)
    code = main(["report", str(layout.root), "--json"], slurm=Slurm(fake), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert [m.run_id for m in read_facts(facts_path(workspace)).models] == [layout.run_id]
    assert len(fake.commands("sacct")) == 1  # the page and the facts from one reading of the run

    workspace2, layout2 = staged_in_workspace(tmp_path / "b")
    facts_path(workspace2).write_text("{not json")
    err = io.StringIO()
    code = main(
        ["report", str(layout2.root)], slurm=Slurm(FakeSlurm(sacct=STAGED_SACCT)), stdout=io.StringIO(), stderr=err
    )
    assert code == 0
    assert f"warning: the run's facts were not recorded in {facts_path(workspace2)}" in err.getvalue()
    assert facts_path(workspace2).read_text() == "{not json"  # bad input changes nothing


SINFO = (
    "n1|gpu*|16|64000|gpu:h100:4(S:0-1)|up|1:00:00\n"
    "n2|gpu*|16|64000|gpu:h100:4|up|1:00:00\n"
    "n3|mixed|16|64000|gpu:a100:4|up|1:00:00\n"
    "n4|mixed|16|64000|gpu:h100:4|up|1:00:00\n"
    "n5|cpu|16|64000|(null)|up|1:00:00\n"
    "n6|plain|16|64000|gpu:2|up|1:00:00\n"
)


class SinfoSlurm(FakeSlurm):
    def __init__(self, text: str, rc: int = 0) -> None:
        super().__init__()
        self.text, self.rc = text, rc

    def __call__(self, argv, *, env=None):  # type: ignore[no-untyped-def]
        if argv[0] == "sinfo":
            self.calls.append(list(argv))
            return Completed(self.rc, self.text if self.rc == 0 else "", "sinfo: error")
        return super().__call__(argv, env=env)


@pytest.mark.parametrize(
    ("partition", "expected"),
    [("gpu", "h100"), (None, "h100"), ("mixed", ""), ("cpu", ""), ("plain", ""), ("absent", "")],
)
def test_the_partitions_gpu_type(partition: str | None, expected: str) -> None:
    assert partition_gpu_type(Slurm(SinfoSlurm(SINFO)))(partition) == expected


def test_the_gpu_type_and_the_layouts_bounds_come_from_one_sinfo() -> None:
    runner = SinfoSlurm(SINFO)
    nodes = PartitionGpuNodes(Slurm(runner))
    assert partition_gpu_type(nodes)("gpu") == "h100"
    assert partition_nodes(nodes)("gpu") == PartitionNodes(partition="gpu", nodes=2, cpus=16, gpus=4, memory_mb=64000)
    assert len(runner.calls) == 1


def test_the_gpu_type_is_unknown_when_sinfo_fails() -> None:
    assert partition_gpu_type(Slurm(SinfoSlurm("", rc=1)))("gpu") == ""


def test_the_partitions_gpu_nodes_bound_the_layouts() -> None:
    sinfo = SINFO + "n7|gpu|8|32000|gpu:h100:2|up|1:00:00\n" + "n8|gpu|64|32000|(null)|up|1:00:00\n"
    nodes_of = partition_nodes(Slurm(SinfoSlurm(sinfo)))
    # gpu: n1, n2 (16 CPUs, 4 GPUs, 64000 MB) and n7 (8 CPUs, 2 GPUs, 32000 MB); n8 has no GPU: no GPU
    # allocation runs there
    assert nodes_of("gpu") == PartitionNodes(partition="gpu", nodes=3, cpus=8, gpus=2, memory_mb=32000)
    assert nodes_of(None) == nodes_of("gpu")  # the default partition
    assert nodes_of("cpu") is None and nodes_of("absent") is None
    assert partition_nodes(Slurm(SinfoSlurm("", rc=1)))("gpu") is None  # never fatal: nothing ruled out


def test_prepare_gives_the_planner_the_workspace_facts_and_the_partitions_gpu_type(
    tmp_path: Path, planner_inputs: list[PlanInputs]
) -> None:
    run, profile, env = stage_files(tmp_path)
    workspace = Path(load_profile(profile).workspace)
    workspace.mkdir(parents=True)
    known = Facts(
        models=(
            ModelFact(
                shape=ModelShape(model="m-2", gpu_type="h100"), load_s=12.5, requests_per_s=3.0, capacity=16,
                measured_by="run", run_id="earlier", measured_at="2025-01-01T00:00:00+00:00",
            ),
        )
    )  # fmt: skip
    write_facts(facts_path(workspace), known)
    seen = planner_inputs
    asked: list[str | None] = []

    def gpu_type_of(partition: str | None) -> str:
        asked.append(partition)
        return "h100"

    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe, gpu_type_of=gpu_type_of)
    [inputs] = seen
    assert inputs.facts == known and inputs.gpu_type == "h100" and prepared.plan.gpu_type == "h100"
    assert asked == ["gpu"]  # the profile's partition (the run file names none)
    assert prepared.layout.root.parent.parent == workspace

    def broken(partition: str | None) -> str:
        raise RuntimeError("sinfo is gone")

    seen.clear()
    prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe, gpu_type_of=broken)
    assert seen[0].gpu_type == ""  # never fatal


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"version": 1, "models": "nope"}', "$.models"),
        (  # a rate of 0 was a ZeroDivisionError in the planner (issue 35)
            '{"version": 1, "recipes": [{"recipe_sha256": "x", "requests_per_record": {}, "measured_by": "run", '
            '"run_id": "r", "measured_at": "t", "cpu_stage_records_per_s": 0}]}',
            "$.recipes[0].cpu_stage_records_per_s",
        ),
    ],
)
def test_a_damaged_facts_file_is_refused_naming_it_and_the_field(tmp_path: Path, text: str, field: str) -> None:
    run, profile, env = stage_files(tmp_path)
    workspace = Path(load_profile(profile).workspace)
    workspace.mkdir(parents=True)
    facts_path(workspace).write_text(text)
    with pytest.raises(SubmitError) as refused:
        prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    message = str(refused.value)
    assert str(facts_path(workspace)) in message and "cannot be read" in message and field in message, message
    assert facts_path(workspace).read_text() == text
    assert not (workspace / "runs").exists()


def _choice(allocations: int, replicas: tuple[int, ...], wall_s: float, gpu_hours: float, busy: float) -> LayoutChoice:
    return LayoutChoice(
        allocations=allocations, replicas=replicas, client_workers=2, two_stage=allocations > 2,
        gpus_at_once=allocations * sum(replicas), wall_s=wall_s, gpu_hours=gpu_hours, gpu_busy=busy,
    )  # fmt: skip


PREDICTION = Prediction(
    chosen=_choice(4, (2, 1), 1530.0, 1.7, 0.914),
    runners_up=(_choice(2, (2, 1), 2900.0, 1.61, 0.95), _choice(8, (1, 1), 800.0, 2.2, 0.71)),
    facts=(
        FactUse(name="load_s", subject="gen:vllm:m-2:tp1-pp1-dp1:h100", value=60.0, origin="default"),
        FactUse(name="requests_per_s", subject="gen:vllm:m-2:tp1-pp1-dp1:h100", value=3.25, origin="run",
                run_id="unit-20260101-000000-abcdef"),
    ),
    budget_gpus=12,
    rule="the fewest GPU-hours within 12 GPUs",
)  # fmt: skip


def test_the_dry_run_bill_shows_the_chosen_layout_the_runners_up_and_the_facts(tmp_path: Path) -> None:
    run, profile, env = stage_files(tmp_path)
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    plan = msgspec.structs.replace(prepared.plan, prediction=PREDICTION)
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    bill = make_bill(plan, [], prepared.aliases, snapshot)
    assert bill.prediction == PREDICTION
    lines = bill_lines(bill)
    start = lines.index("Layout (at most 12 GPUs at once):")
    header, *rows = [line.split() for line in lines[start + 1 : start + 5]]
    assert header[:2] == ["layout", "allocations"]
    for row, choice in zip(rows, (PREDICTION.chosen, *PREDICTION.runners_up), strict=True):
        cells = row[2:] if row[0] == "runner-up" else row[1:]
        assert cells[0] == str(choice.allocations)
        assert cells[1] == "/".join(map(str, choice.replicas))
        assert cells[2:5] == [str(choice.client_workers), "2" if choice.two_stage else "1", str(choice.gpus_at_once)]
        minutes, seconds = choice.wall_s / 60, choice.wall_s
        assert " ".join(cells[5:7]) == (f"{seconds:.0f} s" if seconds < 120 else f"{minutes:.1f} min")
        assert cells[7:] == [f"{choice.gpu_hours:.2f}", f"{choice.gpu_busy:.2f}"]
    assert f"  how: {PREDICTION.rule}" in lines
    used = [line.split() for line in lines[lines.index("  facts used:") + 2 :]]
    assert used == [
        ["load_s", "gen:vllm:m-2:tp1-pp1-dp1:h100", "60", "default"],
        ["requests_per_s", "gen:vllm:m-2:tp1-pp1-dp1:h100", "3.25", "run", "unit-20260101-000000-abcdef"],
    ]
    # --json carries the prediction as the plan has it
    assert msgspec.to_builtins(bill)["prediction"] == msgspec.to_builtins(PREDICTION)
    # no prediction: no section
    assert not any(
        line.startswith("Layout") for line in bill_lines(make_bill(prepared.plan, [], prepared.aliases, snapshot))
    )


def test_the_report_puts_the_prediction_beside_the_measurement(tmp_path: Path) -> None:
    _, layout = staged_in_workspace(tmp_path)
    plain = run_report(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    assert plain.predicted is None and "Predicted and measured" not in render_html(plain)  # no prediction: omitted

    plan = read_plan(layout.plan)
    atomic_write(layout.plan, encode(msgspec.structs.replace(plan, prediction=PREDICTION)))
    report = run_report(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    assert report.predicted is not None
    # recomputed from the fixture: the GPU stage's first attempt started at 50:10, the last winner (CPU stage) was
    # published at 52:10; sacct: 80 s x 2 GPUs; the replica busy 37 + 15 s on 2 GPUs
    wall = _epoch("52:10") - _epoch("50:10")
    allocated = round(80 * 2 / 3600, 6)
    busy = round((37 + 15) * 2 / 3600 / allocated, 4)
    chosen = PREDICTION.chosen
    expected = [
        ("wall time (s)", chosen.wall_s, wall, round(wall / chosen.wall_s, 3)),
        ("GPU-hours", chosen.gpu_hours, allocated, round(allocated / chosen.gpu_hours, 3)),
        ("GPU-busy", chosen.gpu_busy, busy, round(busy / chosen.gpu_busy, 3)),
    ]
    assert [(c.what, c.predicted, c.measured, c.ratio) for c in report.predicted.rows] == expected
    assert report_json(report)["predicted"]["rows"][0]["measured"] == wall
    page = render_html(report)
    assert "<h2>Predicted and measured</h2>" in page
    for _, predicted, measured, ratio in expected:
        assert f"<td class=n>{predicted:,.3f}</td><td class=n>{measured:,.3f}</td><td class=n>{ratio:,.3f}</td>" in page

    out = io.StringIO()
    code = main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=STAGED_SACCT)), stdout=out)
    assert code == 0
    for what, predicted, measured, ratio in expected:
        assert f"    {what}: {predicted:g} / {measured:g} ({ratio:g})\n" in out.getvalue()


def test_wait_records_the_facts_of_a_run_that_ends_succeeded(tmp_path: Path) -> None:
    workspace, layout = staged_in_workspace(tmp_path)
    err = io.StringIO()
    code = main(
        ["wait", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=STAGED_SACCT)), stdout=io.StringIO(), stderr=err
    )
    assert code == 0, err.getvalue()
    assert [r.run_id for r in read_facts(facts_path(workspace)).recipes] == [layout.run_id]


def test_a_successful_collection_records_the_facts(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "runs").mkdir(parents=True)
    layout = make_report_run(workspace / "runs")
    err = io.StringIO()
    argv = ["collect", str(layout.root), "--local", "--overwrite"]
    code = main(argv, slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=io.StringIO(), stderr=err)
    assert code == 0, err.getvalue()
    facts = read_facts(facts_path(workspace))
    [recipe] = facts.recipes
    # the report's numbers of that run: writer 10 and judge 5 requests over its 5 rows
    assert (recipe.run_id, recipe.requests_per_record) == (layout.run_id, {"judge": 5 / 5, "writer": 10 / 5})
    # Issue 35: shard 1's first attempt failed (endpoint errors), so the allocations' time is no clean measure: no
    # model fact, no overhead, no CPU-stage rate from this run, and the command says so
    assert facts.models == () and recipe.allocation_overhead_s is None and recipe.cpu_stage_records_per_s is None
    assert "note: attempts of the run did not end cleanly (endpoint_errors x1)" in err.getvalue()


def test_a_faulted_runs_recipe_fact_keeps_what_an_earlier_clean_run_measured(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "runs").mkdir(parents=True)
    layout = make_report_run(workspace / "runs")
    key = read_plan(layout.plan).recipe_facts_key()
    clean = RecipeFact(recipe_sha256=key, requests_per_record={"writer": 9.0}, allocation_overhead_s=21.0,
                       cpu_stage_records_per_s=3.5, measured_by="run", run_id="clean", measured_at="t")  # fmt: skip
    write_facts(facts_path(workspace), Facts(recipes=(clean,)))
    recorded = record_facts(workspace, layout, Slurm(FakeSlurm(sacct=SACCT)))
    assert recorded.measured is not None and recorded.measured.unclean
    [recipe] = read_facts(facts_path(workspace)).recipes
    # each number the median of the runs that measured it: the writer's of both, the judge's of this one
    assert recipe.run_id == layout.run_id and recipe.requests_per_record == {"judge": 1.0, "writer": (9.0 + 2.0) / 2}
    assert (recipe.allocation_overhead_s, recipe.cpu_stage_records_per_s) == (21.0, 3.5)  # the clean run's stand
    assert [s.run_id for s in recipe.samples] == ["clean", layout.run_id]
    runs = {(n, a): recipe.runs(n, a) for n, a in [("requests_per_record", "writer"), ("requests_per_record", "judge"),
            ("allocation_overhead_s", None), ("client_cpu_s_per_request", None)]}  # fmt: skip
    assert runs == {("requests_per_record", "writer"): 2, ("requests_per_record", "judge"): 1,
                    ("allocation_overhead_s", None): 1, ("client_cpu_s_per_request", None): 0}  # fmt: skip


def test_requests_per_record_leaves_out_the_rows_of_an_attempt_killed_before_its_summary(tmp_path: Path) -> None:
    """Issue 35, item 2: shard 1's first attempt is SIGKILLed (no Data Designer summary: its requests are unknown)
    after saving a row, which the retry resumes. That row is left out with its unknown requests: the rate is over
    the rows the attempts with a summary generated themselves (shard 0's 3, the retry's own 1)."""
    workspace = tmp_path / "ws"
    (workspace / "runs").mkdir(parents=True)
    layout = make_report_run(workspace / "runs")
    (layout.shard(1).attempt("attempt-0").dir / "client.out").unlink()  # killed: no usage summary
    _models, recipe = measure_run(layout, Slurm(FakeSlurm(sacct=SACCT)))
    assert recipe is not None
    # writer: shard 0's 4 + the retry's 1; judge: 3 + 2; over 3 + 1 rows (requests over all 5 rows: 1.0 each)
    assert recipe.requests_per_record == {"writer": (4 + 1) / (3 + 1), "judge": (3 + 2) / (3 + 1)}
    # the tokens of the same summaries over the same rows (the bill's predicted hosted spend rests on them)
    assert recipe.input_tokens_per_record == {"writer": (100 + 5) / 4, "judge": (50 + 20) / 4}
    assert recipe.output_tokens_per_record == {"writer": (200 + 5) / 4, "judge": (10 + 4) / 4}


def test_two_runs_of_one_seeded_recipe_share_its_facts_key(tmp_path: Path) -> None:
    """The stored recipe points at each run's own copy of the seed (its digest differs run to run); the facts key
    is the recipe as the run file names it, so a later run finds what an earlier one measured."""
    seeded = STAGE_RECIPE.replace("Say {{ topic }}", "Say {{ topic }} {{ question }}") + (
        "  seed_config:\n    sampling_strategy: ordered\n    source: {seed_type: local, path: seed.csv}\n"
    )
    run, profile, env = stage_files(tmp_path, recipe=seeded)
    (tmp_path / "seed.csv").write_text("question\n" + "".join(f"q{i}\n" for i in range(12)))
    first = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe).plan
    second = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe).plan
    assert first.seed is not None and first.run_id != second.run_id
    assert first.recipe_sha256 != second.recipe_sha256  # each points at its own run's seed copy
    assert first.recipe_facts_key() == second.recipe_facts_key() == first.recipe_key != ""


def test_the_report_puts_each_fact_planned_with_beside_this_runs_measure(tmp_path: Path) -> None:
    """Issue 35: every input of the prediction beside what this run measured of it, with the runs it rests on:
    the report's JSON, its page and its lines. The measures are the run's own facts (``measure_run``); a fact the
    run did not measure says so."""
    _, layout = staged_in_workspace(tmp_path)
    plan = read_plan(layout.plan)
    assert plan.serving is not None
    alias = plan.serving.deployments[0].alias
    models, recipe = measure_run(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    [model] = models
    assert recipe is not None and recipe.cpu_stage_records_per_s is not None
    subject = f"{alias}:{model.shape.key()}"
    uses = (
        FactUse(name="load_s", subject=subject, value=60.0, origin="default"),
        FactUse(name="requests_per_s", subject=subject, value=3.25, origin="run", run_id="r-3", runs=3),
        FactUse(name="requests_per_record", subject=alias, value=0.5, origin="run", run_id="r-3", runs=2),
        FactUse(name="cpu_stage_records_per_s", subject="recipe", value=2.0, origin="default"),
        FactUse(name="requests_per_s", subject="other:vllm:x:tp1-pp1-dp1:", value=1.0, origin="default"),
    )
    prediction = msgspec.structs.replace(PREDICTION, facts=uses)
    atomic_write(layout.plan, encode(msgspec.structs.replace(plan, prediction=prediction)))
    out = io.StringIO()
    assert main(["report", str(layout.root), "--json"], slurm=Slurm(FakeSlurm(sacct=STAGED_SACCT)), stdout=out) == 0
    rows = [(f["name"], f["used"], f["runs"], f["measured"], f["ratio"]) for f in json.loads(out.getvalue())["facts"]]
    measured = [model.load_s, model.requests_per_s, recipe.requests_per_record[alias], recipe.cpu_stage_records_per_s]
    expected = [(u.name, u.value, u.runs, m, round(m / u.value, 3)) for u, m in zip(uses, measured, strict=False)]
    assert rows == [*expected, ("requests_per_s", 1.0, 0, None, None)]
    assert json.loads(out.getvalue())["facts"][-1]["note"] == "not measured: no allocation of the run measured it"
    page = Path(json.loads(out.getvalue())["report"]).read_text()
    assert "<h2>Facts planned with, and measured</h2>" in page
    text = io.StringIO()
    assert main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=STAGED_SACCT)), stdout=text) == 0
    ratio = round(model.requests_per_s / 3.25, 3)
    assert f"    requests_per_s of {subject}: 3.25 (run, 3 runs) / {model.requests_per_s:g} (x{ratio:g})\n" in (
        text.getvalue()
    )
    assert f"    load_s of {subject}: 60 (a default) / {model.load_s:g}" in text.getvalue()
