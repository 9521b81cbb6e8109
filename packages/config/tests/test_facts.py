"""The workspace's facts file: one fact per model shape and per recipe, the latest; written atomically."""

from __future__ import annotations

import statistics
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    ConfigError,
    Facts,
    ModelFact,
    ModelShape,
    RecipeFact,
    read_facts,
    update_facts,
    write_facts,
)
from ddslurm.config._facts import HISTORY


def _model(load: float, gpu_type: str = "") -> ModelFact:
    shape = ModelShape(model="Qwen/Qwen3-8B", tensor_parallel=2, gpu_type=gpu_type)
    return ModelFact(
        shape=shape, load_s=load, requests_per_s=4.0, capacity=8, measured_by="run", run_id="r1", measured_at="t"
    )


def test_no_file_is_no_facts(tmp_path: Path) -> None:
    assert read_facts(tmp_path / "facts.json") == Facts()


def test_a_later_fact_of_a_shape_replaces_the_earlier_one_and_round_trips(tmp_path: Path) -> None:
    facts = Facts().with_model(_model(60.0)).with_model(_model(90.0, "a100")).with_model(_model(75.0))
    assert [(f.shape.gpu_type, f.load_s) for f in facts.models] == [("a100", 90.0), ("", 75.0)]
    recipe = RecipeFact(
        recipe_sha256="abc", requests_per_record={"writer": 2.0}, measured_by="tune", run_id="r2", measured_at="t"
    )
    facts = facts.with_recipe(recipe).with_recipe(msgspec.structs.replace(recipe, requests_per_record={"writer": 3.0}))
    path = tmp_path / "facts.json"
    write_facts(path, facts)
    back = read_facts(path)
    assert back == facts
    assert back.model(ModelShape(model="Qwen/Qwen3-8B", tensor_parallel=2)) == _model(75.0)
    assert back.model(ModelShape(model="Qwen/Qwen3-8B")) is None
    assert back.recipe("abc") is not None and back.recipe("abc").requests_per_record == {"writer": 3.0}  # type: ignore[union-attr]
    assert path.stat().st_mode & 0o077 == 0


def test_a_recipe_fact_is_each_numbers_median_over_the_latest_runs_that_measured_it() -> None:
    """Seven runs of one recipe: the latest 5 are kept; each number is the median of those of them that measured
    it (an unclean run's None overhead leaves the others'), an alias one run did not use the median of the rest."""
    facts = Facts()
    measures = [(1.0, 10.0), (9.0, 11.0), (2.0, None), (3.0, 30.0), (4.0, None), (2.5, 12.0), (8.0, 14.0)]
    for i, (per_record, overhead) in enumerate(measures):
        judge = {"judge": float(i)} if i != 6 else {}
        fact = RecipeFact(
            recipe_sha256="abc", requests_per_record={"writer": per_record, **judge},
            allocation_overhead_s=overhead, measured_by="run", run_id=f"r{i}", measured_at="t",
        )  # fmt: skip
        facts = facts.with_recipe_run(fact)
    [recipe] = facts.recipes
    assert [s.run_id for s in recipe.samples] == ["r2", "r3", "r4", "r5", "r6"]
    assert recipe.requests_per_record == {"writer": 3.0, "judge": 3.5}  # median of 2, 3, 4, 2.5, 8; of 2, 3, 4, 5
    assert recipe.allocation_overhead_s == 14.0  # median of 30, 12, 14
    assert recipe.client_cpu_s_per_request is None and recipe.run_id == "r6"
    assert (recipe.runs("requests_per_record", "judge"), recipe.runs("allocation_overhead_s")) == (4, 3)


def test_tokens_per_record_are_each_aliass_median_and_runs_from_before_tokens_were_kept_leave_them_out() -> None:
    """Tokens per record are kept per alias as requests per record are: the median of the latest runs that measured
    them; a run from before they were kept (none measured) counts for its requests only."""
    facts = Facts()
    inputs = [None, {"judge": 100.0}, {"judge": 300.0}, {"judge": 200.0, "writer": 50.0}]
    for i, measured in enumerate(inputs):
        fact = RecipeFact(
            recipe_sha256="abc", requests_per_record={"judge": 1.0, "writer": 2.0},
            input_tokens_per_record=measured or {},
            output_tokens_per_record={a: v / 10 for a, v in (measured or {}).items()},
            measured_by="run", run_id=f"r{i}", measured_at="t",
        )  # fmt: skip
        facts = facts.with_recipe_run(fact)
    [recipe] = facts.recipes
    assert recipe.input_tokens_per_record == {"judge": statistics.median([100.0, 300.0, 200.0]), "writer": 50.0}
    assert recipe.output_tokens_per_record == {"judge": 20.0, "writer": 5.0}
    assert recipe.runs("input_tokens_per_record", "judge") == 3 and recipe.runs("requests_per_record", "judge") == 4
    assert recipe.runs("output_tokens_per_record", "writer") == 1


def test_a_damaged_facts_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    path.write_text('{"models": [{"shape": 3}]}')
    with pytest.raises(ConfigError, match=r"facts\.json"):
        read_facts(path)


def _recipe_doc(**fields: object) -> dict[str, object]:
    return {"recipe_sha256": "abc", "requests_per_record": {"w": 1.0}, "measured_by": "run", "run_id": "r",
            "measured_at": "t", **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "field", "says"),
    [  # issue 35 item 4: each was a traceback or a negative predicted time in the planner
        ({"recipes": [_recipe_doc(cpu_stage_records_per_s=0)]}, "$.recipes[0].cpu_stage_records_per_s", "> 0"),
        ({"recipes": [_recipe_doc(cpu_stage_records_per_s=-2.5)]}, "$.recipes[0].cpu_stage_records_per_s", "> 0"),
        ({"recipes": [_recipe_doc(requests_per_record={"w": -1})]}, "$.recipes[0].requests_per_record", ">= 0"),
        ({"recipes": [_recipe_doc(allocation_overhead_s=-30)]}, "$.recipes[0].allocation_overhead_s", ">= 0"),
        ({"recipes": [_recipe_doc(client_cpu_s_per_request=1e9)]}, "$.recipes[0].client_cpu_s_per_request", "<="),
        (
            {"models": [{**msgspec.to_builtins(_model(60.0)), "requests_per_s": -4.0}]},
            "$.models[0].requests_per_s",
            "> 0",
        ),
        ({"models": [{**msgspec.to_builtins(_model(-1.0))}]}, "$.models[0].load_s", ">= 0"),
        ({"models": [{**msgspec.to_builtins(_model(60.0)), "capacity": 0}]}, "$.models[0].capacity", ">= 1"),
        (
            {"models": [{**msgspec.to_builtins(_model(60.0)), "requests_per_s": 1e12}]},
            "$.models[0].requests_per_s",
            "<=",
        ),
        ({"version": 2}, "version 2", "newer ddslurm"),
    ],
)
def test_a_fact_out_of_its_range_is_an_error_naming_the_file_and_the_field(
    tmp_path: Path, doc: dict[str, object], field: str, says: str
) -> None:
    path = tmp_path / "facts.json"
    path.write_bytes(msgspec.json.encode({"version": 1, **doc}))
    with pytest.raises(ConfigError) as refused:
        read_facts(path)
    message = str(refused.value)
    assert str(path) in message and field in message and says in message, message


def test_updates_of_two_writers_at_once_both_land(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "facts.json"
    start = threading.Barrier(8)

    def add(i: int) -> None:
        start.wait()
        fact = msgspec.structs.replace(_model(float(i)), shape=ModelShape(model=f"m{i}"))
        update_facts(path, lambda facts: facts.with_model(fact))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(f.shape.model for f in read_facts(path).models) == [f"m{i}" for i in range(8)]
    before = path.stat().st_mtime_ns
    update_facts(path, lambda facts: facts)
    assert path.stat().st_mtime_ns == before  # unchanged facts are not rewritten


def _run_fact(rate: float, run: str, capacity: int = 8, load: float = 60.0) -> ModelFact:
    return msgspec.structs.replace(_model(load), requests_per_s=rate, capacity=capacity, run_id=run)


def test_a_model_fact_is_the_median_of_its_latest_clean_runs_so_one_run_cannot_poison_it() -> None:
    facts = Facts()
    for i, rate in enumerate((5.2, 6.6, 5.9)):
        facts = facts.with_model_run(_run_fact(rate, f"r{i}", load=50.0 + 10 * i))
    fact = facts.models[0]
    assert (fact.requests_per_s, fact.load_s, fact.runs()) == (5.9, 60.0, 3)
    poisoned = facts.with_model_run(_run_fact(0.16, "hung")).models[0]  # issue 35: a run whose replica served nothing
    assert poisoned.requests_per_s == statistics.median((5.2, 6.6, 5.9, 0.16)) > 5
    for i in range(10):  # only the latest HISTORY runs count
        poisoned = Facts(models=(poisoned,)).with_model_run(_run_fact(4.0, f"n{i}")).models[0]
    assert len(poisoned.samples) == HISTORY and poisoned.requests_per_s == 4.0


def test_a_rate_at_another_capacity_or_a_calibrations_is_not_mixed_with_a_runs() -> None:
    facts = Facts().with_model_run(_run_fact(5.0, "a")).with_model_run(_run_fact(7.0, "b"))
    at_256 = facts.with_model_run(_run_fact(40.0, "c", capacity=256)).models[0]
    assert (at_256.requests_per_s, at_256.runs(), at_256.capacity) == (40.0, 1, 256)
    tuned = msgspec.structs.replace(_run_fact(9.0, "t"), measured_by="tune")
    after_tune = Facts(models=(tuned,)).with_model_run(_run_fact(5.0, "d")).models[0]
    assert (after_tune.requests_per_s, after_tune.runs()) == (5.0, 1)
