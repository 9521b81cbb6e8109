"""The fault campaign's own parts, without the cluster: the drawing (the same seed gives the same scenario; every
layout, recipe and fault kind is reachable; every drawn run file loads), the oracle (a lost, a duplicated and a
changed row are found on hand-made tables) and the command lines the harness kills by."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.chaos import cluster  # noqa: E402
from tools.chaos.draw import (  # noqa: E402
    FAULT_KINDS,
    LAYOUTS,
    PLACEMENTS,
    PROFILES,
    RECOVERY_KINDS,
    SEEDINGS,
    STAGES,
    applicable,
    draw,
)
from tools.chaos.oracle import build_reference, judge  # noqa: E402
from tools.chaos.recipes import recipe, run_yaml, write_recipe  # noqa: E402
from tools.chaos.scenario import files_holding  # noqa: E402

SEEDS = range(600)


def test_the_same_seed_draws_the_same_scenario() -> None:
    for seed in (0, 1, 17, 123456, 2**40 + 3):
        assert draw(seed) == draw(seed)
        assert run_yaml(draw(seed)) == run_yaml(draw(seed)) and recipe(draw(seed)) == recipe(draw(seed))
    assert len({draw(s) for s in range(50)}) == 50  # distinct seeds draw distinct scenarios
    assert all(draw(s).recipe_key == draw(s, "compact").recipe_key for s in range(50))  # drawn before the numbers


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_layout_recipe_and_fault_kind_is_reachable(profile: str) -> None:
    drawn = [draw(s, profile) for s in SEEDS]
    assert {s.layout for s in drawn} == set(LAYOUTS)
    assert {s.stages for s in drawn} == set(STAGES)
    assert {(s.placement, s.seeding, s.drop) for s in drawn} == {
        (p, k, d) for p in PLACEMENTS for k in SEEDINGS for d in (False, True)
    }
    assert {f.kind for s in drawn for f in s.faults} == set(FAULT_KINDS)
    assert {len(s.faults) for s in drawn} >= {1, 2, 3}
    assert {s.accept_partial for s in drawn} == {False, True}
    assert {s.client_workers for s in drawn if s.layout == "pulling"} == {1, 2, 3}
    assert {s.retries for s in drawn} == {0, 1, 2, 3} and {s.client_retries for s in drawn} == {0, 1}
    assert {s.recovery_fault.kind for s in drawn if s.recovery_fault} == set(RECOVERY_KINDS)
    assert {bool(f.after_rows) for s in drawn for f in s.faults} == {False, True}  # by time and by progress
    assert min(s.latency for s in drawn) < 0.5 and max(s.latency for s in drawn) > 1.5
    assert {s.buffer_size is None for s in drawn} == {False, True}  # the run file's batches and the planner's


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_drawn_numbers_stay_in_their_ranges_and_faults_fit_the_recipe(profile: str) -> None:
    sizes = PROFILES[profile]
    for s in (draw(seed, profile) for seed in SEEDS):
        assert sizes.records[0] <= s.records <= sizes.records[1]
        assert s.buffer_size is None or 2 <= s.buffer_size <= 7  # None: the planner's batches
        assert 1 <= s.shards <= min(sizes.max_shards, s.records) and s.profile == profile
        assert s.seed_rows == 0 or sizes.seed_rows[0] <= s.seed_rows <= sizes.seed_rows[1]
        timed = [f for f in s.faults if f.kind.startswith("hosted_") or f.kind == "node_down"]
        assert all(sizes.fault_duration[0] <= f.duration <= sizes.fault_duration[1] for f in timed)
        assert s.cpus >= s.client_workers
        if s.layout == "pulling":
            assert 1 <= s.allocations < s.shards and 1 <= s.client_workers <= 3
        else:
            assert s.allocations == s.shards
        assert (s.seed_rows == 0) == (s.seeding == "seedless")
        assert all(applicable(f.kind, s.placement, s.replicas) for f in s.faults)
        assert s.recovery_fault is None or applicable(s.recovery_fault.kind, s.placement, s.replicas)
        assert (s.time_limit_minutes == 2) == any(f.kind == "time_limit" for f in s.faults)
        assert sum(f.kind == "time_limit" for f in s.faults) <= 1


def test_every_drawn_run_file_loads(tmp_path: Path) -> None:
    from ddslurm.config._codec import load_run_file

    for seed in range(0, 600, 7):
        scenario = draw(seed)
        folder = tmp_path / str(seed)
        recipe_path = write_recipe(folder, scenario)
        (folder / "run.yaml").write_text(run_yaml(scenario))
        run = load_run_file(folder / "run.yaml")
        assert run.num_records == scenario.records and run.shards == scenario.shards
        assert bool(run.deployments) == scenario.has_deployment
        assert recipe_path.is_file() and (folder / "seed.parquet").is_file() == (scenario.seeding != "seedless")


# --- the oracle on hand-made tables ---


def _seeded(ids: list[int]) -> list[dict[str, object]]:
    return [
        {"seed_id": i, "topic": f"t{i}", "question": f"q{i}", "quality": {"Relevance": {"score": i % 3}}} for i in ids
    ]


ORDERED = build_reference(
    _seeded([k % 4 for k in range(10)]), key_columns=("seed_id", "topic"), records=10, mode="ordered"
)


def test_the_oracle_accepts_the_reference_in_any_order() -> None:
    rows = _seeded([k % 4 for k in range(10)])
    verdict = judge(ORDERED, list(reversed(rows)))
    assert verdict.ok and (verdict.lost, verdict.duplicated, verdict.changed) == (0, 0, 0)


def test_the_oracle_finds_a_lost_row() -> None:
    rows = _seeded([k % 4 for k in range(10)])
    del rows[3]
    verdict = judge(ORDERED, rows)
    assert not verdict.ok and (verdict.lost, verdict.duplicated, verdict.changed) == (1, 0, 0)
    assert "1 row(s) lost" in verdict.reason()


def test_the_oracle_finds_a_duplicated_row() -> None:
    rows = _seeded([k % 4 for k in range(10)])
    rows.append(dict(rows[0]))
    verdict = judge(ORDERED, rows)
    assert (verdict.lost, verdict.duplicated, verdict.changed) == (0, 1, 0) and "duplicated" in verdict.reason()
    # one seed row used twice in place of another: the total is right, the uses are not
    rows = _seeded([k % 4 for k in range(10)])
    rows[1] = _seeded([0])[0]
    verdict = judge(ORDERED, rows)
    assert (verdict.lost, verdict.duplicated) == (1, 1) and not verdict.ok


def test_the_oracle_finds_a_changed_row() -> None:
    rows = _seeded([k % 4 for k in range(10)])
    rows[5] = {**rows[5], "question": "something else"}
    verdict = judge(ORDERED, rows)
    assert (verdict.lost, verdict.duplicated, verdict.changed) == (0, 0, 1) and "changed" in verdict.reason()
    rows = _seeded([k % 4 for k in range(10)])
    rows[5] = {**rows[5], "quality": {"Relevance": {"score": 7}}}  # a struct column differs
    assert judge(ORDERED, rows).changed == 1
    rows = _seeded([k % 4 for k in range(10)])
    rows[2] = {**rows[2], "extra": 1}  # a column the reference does not have
    assert judge(ORDERED, rows).changed == 1


def test_an_accepted_partial_shard_explains_exactly_its_missing_rows() -> None:
    rows = _seeded([k % 4 for k in range(10)])[:8]
    assert judge(ORDERED, rows, allowed_lost=2).ok
    assert not judge(ORDERED, rows, allowed_lost=1).ok
    assert not judge(ORDERED, _seeded([k % 4 for k in range(10)]), allowed_lost=2).ok


def test_shuffle_compares_the_uses_per_seed_row_not_which_row_got_the_extra_use() -> None:
    # 10 records over 4 seed rows: two rows are used three times, two twice; which ones is SHUFFLE's draw
    every_row = _seeded([0, 1, 2, 3])
    shuffle = build_reference(every_row, key_columns=("seed_id", "topic"), records=10, mode="shuffle")
    assert judge(shuffle, _seeded([3, 2, 1, 0, 2, 3, 0, 1, 2, 3])).ok
    assert judge(shuffle, _seeded([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])).ok
    lopsided = judge(shuffle, _seeded([0, 0, 0, 0, 1, 2, 3, 1, 2, 3]))  # row 0 four times
    assert (lopsided.lost, lopsided.duplicated) == (1, 1) and not lopsided.ok
    assert judge(shuffle, _seeded([0, 1, 2, 3, 0, 1, 2, 3, 0])).lost == 1


def _seedless(ids: list[str], topics: list[str]) -> list[dict[str, object]]:
    return [
        {"topic": t, "difficulty": "easy", "record_id": i, "question": f"about {t}"}
        for i, t in zip(ids, topics, strict=True)
    ]


SEEDLESS = build_reference(
    _seedless(["r1", "r2", "r3"], ["a", "b", "c"]),
    key_columns=("topic", "difficulty"),
    records=4,
    mode="seedless",
    unique_column="record_id",
)


def test_seedless_rows_are_told_apart_by_their_uuid() -> None:
    assert judge(SEEDLESS, _seedless(["x1", "x2", "x3", "x4"], ["a", "a", "b", "c"])).ok
    repeated = judge(SEEDLESS, _seedless(["x1", "x2", "x3", "x3"], ["a", "a", "b", "b"]))
    assert (repeated.lost, repeated.duplicated) == (1, 1)
    extra = judge(SEEDLESS, _seedless(["x1", "x2", "x3", "x4", "x5"], ["a", "a", "b", "c", "c"]))
    assert (extra.lost, extra.duplicated) == (0, 1)
    lost = judge(SEEDLESS, _seedless(["x1", "x2", "x3"], ["a", "b", "c"]))
    assert (lost.lost, lost.duplicated) == (1, 0)
    changed = judge(
        SEEDLESS,
        [{**_seedless(["x1"], ["a"])[0], "question": "about b"}, *_seedless(["x2", "x3", "x4"], ["a", "b", "c"])],
    )
    assert changed.changed == 1
    unknown = judge(SEEDLESS, _seedless(["x1", "x2", "x3", "x4"], ["a", "a", "b", "zzz"]))
    assert unknown.changed == 1 and "no such row" in unknown.reason()


# --- the processes the harness kills, by command line ---


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["/v/bin/python3", "/v/bin/ddslurm-runtime", "client", "--run-dir", "/r"], "client"),
        (["/v/bin/ddslurm-runtime", "proxy", "--port", "1"], "proxy"),
        (["/v/bin/python", "/v/bin/ddslurm-runtime", "generate", "--run-dir", "/r"], "generate"),
        (["/v/bin/python", "/v/bin/fake-vllm", "serve", "Qwen/Qwen3-8B", "--port", "9"], "server"),
        (["/v/bin/python", "-m", "fake_vllm", "serve", "m"], "server"),
        (["srun", "--overlap", "/v/bin/ddslurm-runtime", "client", "--run-dir", "/r"], None),
        (["/bin/bash", "/r/generate.sbatch"], None),
        ([], None),
    ],
)
def test_processes_are_told_apart_by_their_command_lines(argv: list[str], kind: str | None) -> None:
    assert cluster.kind_of(argv) == kind


def test_the_secret_scan_reads_compressed_parquet_values_too(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    secret = "sk-chaos-" + "0123456789abcdef" * 2
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "client.out").write_text(f"... Authorization: Bearer {secret}\n")
    (tmp_path / "clean.txt").write_text("nothing here\n")
    values = [f"row {i} " + ("lorem ipsum " * 5 if i != 500 else secret) for i in range(1000)]
    table = pa.table({"text": values})
    pq.write_table(table, tmp_path / "batch.parquet", compression="zstd", use_dictionary=False, write_statistics=False)
    assert secret.encode() not in (tmp_path / "batch.parquet").read_bytes()  # the raw bytes do not show it
    assert files_holding(tmp_path, secret) == ["batch.parquet", "logs/client.out"]


def test_a_sigkilled_processs_scratch_is_found_by_its_creator_and_removed_by_the_products_sweep(tmp_path: Path) -> None:
    """The campaign's leftover check: a scratch directory whose creator it SIGKILLed is handed to the sweep a ddslurm
    step runs on the node; the sweep removes one whose creator is gone and keeps, saying why, one whose creator runs."""
    import os
    import socket
    import subprocess
    from datetime import UTC, datetime

    from ddslurm.runtime._scratch import create_scratch, process_start_time, scratch_owner

    def made_by(pid: int) -> Path:
        owner = scratch_owner(
            {}, "attempt-1", uid=os.getuid(), user="u", pid=pid, pid_start=process_start_time(pid),
            host=socket.gethostname(), now=datetime.now(UTC),
        )  # fmt: skip
        return create_scratch(tmp_path, owner)

    gone = subprocess.Popen(["sleep", "60"])
    dead = made_by(gone.pid)
    gone.kill()
    gone.wait()
    alive = made_by(os.getpid())
    assert cluster.scratch_creator(dead) == gone.pid and cluster.scratch_creator(alive) == os.getpid()
    assert cluster.scratch_creator(tmp_path) is None  # no marker

    note = cluster.sweep_scratch([dead, alive])
    assert not dead.exists() and alive.is_dir()
    assert alive.name in note and "kept" in note and dead.name not in note
