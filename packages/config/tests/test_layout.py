"""The run-directory layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import LAYOUT_VERSION, AttemptLayout, RunLayout, ShardLayout, attempt_id_for

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

WS = Path("/ws")
RUN = RunLayout.in_workspace(WS, "run-20240101-abc")


def test_layout_version() -> None:
    assert LAYOUT_VERSION == 1


@pytest.mark.parametrize(
    ("attr", "want"),
    [
        pytest.param("root", "/ws/runs/run-20240101-abc", id="root"),
        pytest.param("plan", "/ws/runs/run-20240101-abc/run.json", id="plan"),
        pytest.param("inputs", "/ws/runs/run-20240101-abc/inputs", id="inputs"),
        pytest.param("recipe", "/ws/runs/run-20240101-abc/inputs/recipe.yaml", id="recipe"),
        pytest.param("snapshot", "/ws/runs/run-20240101-abc/inputs/snapshot.json", id="snapshot"),
        pytest.param("run_file", "/ws/runs/run-20240101-abc/inputs/run.yaml", id="run-file"),
        pytest.param("submissions", "/ws/runs/run-20240101-abc/submissions", id="submissions"),
        pytest.param("script", "/ws/runs/run-20240101-abc/generate.sbatch", id="script"),
        pytest.param("collect_script", "/ws/runs/run-20240101-abc/collect.sbatch", id="collect-script"),
        pytest.param("logs", "/ws/runs/run-20240101-abc/logs", id="logs"),
        pytest.param("shards", "/ws/runs/run-20240101-abc/shards", id="shards"),
        pytest.param("collections", "/ws/runs/run-20240101-abc/collections", id="collections"),
        pytest.param("dataset", "/ws/runs/run-20240101-abc/dataset", id="dataset"),
    ],
)
def test_run_layout_paths(attr: str, want: str) -> None:
    assert getattr(RUN, attr) == Path(want)


def test_run_id_is_the_directory_name() -> None:
    assert RUN.run_id == "run-20240101-abc"
    assert RunLayout(Path("/somewhere/else/r9")).run_id == "r9"


@pytest.mark.parametrize(
    ("index", "name"),
    [
        pytest.param(0, "shard-00000", id="first"),
        pytest.param(7, "shard-00007", id="single-digit"),
        pytest.param(12345, "shard-12345", id="five-digits"),
        pytest.param(123456, "shard-123456", id="wider-than-padding"),
    ],
)
def test_shard_layout(index: int, name: str) -> None:
    shard = RUN.shard(index)
    assert shard == ShardLayout(RUN.shards / name, index)
    assert shard.index == index
    assert shard.winner == RUN.shards / name / "winner.json"
    assert shard.attempts == RUN.shards / name / "attempts"


def test_attempt_layout() -> None:
    attempt_id = attempt_id_for("4242_3")
    assert attempt_id == "attempt-4242_3"
    attempt = RUN.shard(3).attempt(attempt_id)
    base = RUN.shards / "shard-00003" / "attempts" / "attempt-4242_3"
    assert attempt == AttemptLayout(base)
    assert (attempt.record, attempt.client_log, attempt.output) == (
        base / "attempt.json",
        base / "client.log",
        base / "output",
    )


def test_layouts_are_frozen() -> None:
    with pytest.raises(AttributeError):
        RUN.root = Path("/x")  # type: ignore[misc]
    with pytest.raises(AttributeError):
        RUN.shard(0).index = 1  # type: ignore[misc]


def test_every_run_path_is_inside_the_run_root() -> None:
    paths = [getattr(RUN, name) for name in ("plan", "recipe", "snapshot", "run_file", "script", "dataset")]
    paths += [RUN.shard(1).attempt("attempt-1").output]
    assert all(p.is_relative_to(RUN.root) and p != RUN.root for p in paths)
    assert len(set(paths)) == len(paths)


def test_a_shards_gpu_stage_has_the_shards_own_layout_under_stage_0(tmp_path: Path) -> None:
    shard = RunLayout(tmp_path / "run").shard(3)
    gpu = shard.stage(0)
    assert gpu.index == 3 and gpu.dir == shard.dir / "stage-0"
    assert gpu.winner == shard.dir / "stage-0" / "winner.json"
    assert gpu.attempt("attempt-7").record == shard.dir / "stage-0" / "attempts" / "attempt-7" / "attempt.json"
    assert gpu.claim("9") == shard.dir / "stage-0" / "claims" / "9.json"
    assert gpu.fresh == shard.dir / "stage-0" / "fresh.json"
