"""Seed datasets on the real cluster: an uneven sharding of a seed file uses every seed row exactly as an
unsharded run does, and a seed directory given relative to the recipe is captured, so every shard reads the
run's copy (the submitter's directory is gone before the jobs run)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e import REPO, run_cli
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]


def _seeded_recipe(root: Path, seed_config: str) -> Path:
    root.mkdir(parents=True)
    recipe = root / "recipe.yaml"
    text = (REPO / "examples" / "hosted-only" / "recipe.yaml").read_text()
    recipe.write_text(text.replace("  seed_config: null\n", seed_config))
    return recipe


def _run(files: Any, *, remove: Path | None = None) -> pa.Table:
    run_dir = Path(
        _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
    )
    if remove is not None:
        shutil.rmtree(remove)  # nodes must read the run's copy, never the submitter's tree
    final = _cli("wait", str(run_dir), "--json", "--timeout", "300", env=files.env)
    assert final["state"] == "succeeded", final
    dataset = Path(_cli("collect", str(run_dir), "--local", "--json", env=files.env)["dataset"])
    return pq.read_table(dataset)


def test_seven_shards_over_sixty_seed_rows_use_each_row_once(make_run_files: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    recipe = _seeded_recipe(
        source,
        "  seed_config:\n    sampling_strategy: ordered\n    selection_strategy: null\n"
        "    source: {seed_type: local, path: seed.parquet}\n",
    )
    pq.write_table(pa.table({"seed_id": list(range(60))}), source / "seed.parquet")
    files = make_run_files("sixty", num_records=60, shards=7, buffer_size=4, recipe=recipe)
    table = _run(files)
    ids = table.column("seed_id").to_pylist()
    # An unsharded Data Designer run of this recipe uses rows 0..59 in order (tests/test_seed_sharding.py checks
    # the engine itself); the merged shards must too: none twice, none missing.
    assert Counter(ids) == Counter(range(60))
    assert ids == list(range(60))


def test_relative_seed_directory_is_captured_and_read_from_the_run(make_run_files: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    recipe = _seeded_recipe(
        source,
        "  seed_config:\n    sampling_strategy: ordered\n"
        "    source: {seed_type: file_contents, path: notes, file_pattern: '*.txt'}\n",
    )
    notes = source / "notes"
    (notes / "more").mkdir(parents=True)
    for i in range(5):
        (notes / ("more" if i % 2 else ".") / f"n{i}.txt").write_text(f"note number {i}")
    files = make_run_files("dir", num_records=5, shards=3, buffer_size=2, recipe=recipe)
    (files.root / "notes").mkdir()
    shutil.copytree(notes, files.root / "notes", dirs_exist_ok=True)
    table = _run(files, remove=files.root / "notes")
    assert sorted(table.column("content").to_pylist()) == [f"note number {i}" for i in range(5)]


def test_retry_completes_a_partial_shard_with_exactly_its_missing_seed_rows(
    make_run_files: Any, tmp_path: Path
) -> None:
    """A flaky provider makes Data Designer drop records (the shard is partial); once the provider heals,
    `ddslurm retry` generates exactly the dropped records, for the seed rows they belonged to."""
    from ddslurm.config import AttemptRecord, read_json
    from fake_vllm.testing import free_port, start_server

    source = tmp_path / "src"
    recipe = _seeded_recipe(
        source,
        "  seed_config:\n    sampling_strategy: ordered\n    selection_strategy: null\n"
        "    source: {seed_type: local, path: seed.parquet}\n",
    )
    # the flaky phase must reach generation: Data Designer's one-request health probe would fail the run first
    recipe.write_text(recipe.read_text().replace("skip_health_check: false", "skip_health_check: true"))
    pq.write_table(pa.table({"seed_id": list(range(24))}), source / "seed.parquet")
    files = make_run_files("partial", num_records=24, shards=2, buffer_size=6, recipe=recipe)
    key, port = files.env["DEMO_HOSTED_API_KEY"], free_port()
    (files.dd_home / "model_providers.yaml").write_text(
        f"providers:\n- {{name: demo-hosted, endpoint: 'http://127.0.0.1:{port}/v1', api_key: DEMO_HOSTED_API_KEY}}\n"
    )
    served = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]
    with start_server("demo", args=[*served, "--fake-error-rate", "0.6", "--fake-seed", "3"], api_key=key, port=port):
        run_dir = Path(
            _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
        )
        done = run_cli("wait", str(run_dir), "--json", "--timeout", "300", env=files.env, timeout=400)
    first = json.loads(done.stdout)
    short = [s for s in first["shards"] if s["state"] == "partial"]
    assert short, f"the flaky provider should have left a shard short: {first}"
    with start_server("demo", args=served, api_key=key, port=port):
        retried = _cli("retry", str(run_dir), "--json", env=files.env)
        assert sorted(retried["shards"]) == sorted(s["shard"] for s in first["shards"] if s["state"] != "succeeded")
        final = _cli("wait", str(run_dir), "--json", "--timeout", "300", env=files.env)
    assert final["state"] == "succeeded" and final["records_done"] == 24, final
    for shard in short:
        records = [
            read_json(p, AttemptRecord)
            for p in run_dir.glob(f"shards/shard-{shard['shard']:05d}/attempts/*/attempt.json")
        ]
        won = [r for r in records if r.state == "succeeded"]
        assert won and won[0].resumed_from, records  # the retry kept the records it had and added the rest
    dataset = Path(_cli("collect", str(run_dir), "--local", "--json", env=files.env)["dataset"])
    ids = pq.read_table(dataset).column("seed_id").to_pylist()
    assert Counter(ids) == Counter(range(24))
