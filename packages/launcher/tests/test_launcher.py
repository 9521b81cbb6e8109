"""Launcher units: scheduler output parsing, rendering, submission with a recording Slurm runner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddslurm.config import Plan, RunLayout, SubmissionRecord, read_json
from ddslurm.launcher import (
    Completed,
    Slurm,
    SlurmError,
    SubmitError,
    parse_job_key,
    prepare,
    render_generation,
    run_status,
    submit,
)
from ddslurm.launcher.cluster._engine_host import EngineHost
from ddslurm.launcher.cluster._process import Finished
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_unit_run

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

KEY = "sk-launcher-test-value-123"


class RecordingRunner:
    """Answers like :class:`FakeSlurm` (job ids from ``first_id``; ``sbatch_rc``: sbatch fails), and records every
    call with its environment."""

    def __init__(self, *, sbatch_rc: int = 0, squeue: str = "", sacct: str = "", first_id: int = 4242) -> None:
        self.calls: list[tuple[list[str], Mapping[str, str] | None]] = []
        self.sbatch_rc, self.slurm = sbatch_rc, FakeSlurm(squeue=squeue, sacct=sacct)
        self.slurm.next_id = first_id

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append((list(argv), env))
        if argv[0] == "sbatch" and self.sbatch_rc:
            return Completed(self.sbatch_rc, "", "sbatch: error: Invalid partition name specified")
        return self.slurm(argv, env=env)


def _files(tmp_path: Path, *, api_key: str = "HOSTED_KEY", run_extra: str = "") -> tuple[Path, Path, dict[str, str]]:
    providers = (
        f"- {{name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: {api_key}}}\n"
        "- {name: unused, endpoint: 'http://127.0.0.1:8/v1', api_key: OTHER_KEY}\n"
    )
    return write_unit_run(tmp_path, KEY, providers=providers, run_extra=run_extra)


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_submit_writes_run_dir_and_exports_the_key_by_name_only(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    runner = RecordingRunner()
    done = submit(
        run, profile, slurm=Slurm(runner), host=HOST, env=env, clock=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    )
    assert done.job_id == "4242"
    layout = done.layout
    assert layout.root.parent == tmp_path / "work" / "runs" and layout.run_id.startswith("unit-20260102-030405-")
    assert layout.root.stat().st_mode & 0o777 == 0o700
    plan = read_json(layout.plan, Plan)
    assert [s.num_records for s in plan.shards] == [4, 3, 3]
    assert plan.secret_env == ("HOSTED_KEY",)
    argv, call_env = next(c for c in runner.calls if c[0][0] == "sbatch")
    assert argv[:3] == ["sbatch", "--parsable", "--export=ALL"]
    assert call_env is not None and call_env["HOSTED_KEY"] == KEY  # sbatch reads the value itself
    assert KEY.encode() not in _all_bytes(layout.root)
    assert b"OTHER_KEY" not in layout.snapshot.read_bytes()  # only the providers the run needs
    assert read_json(layout.submissions / "4242.json", SubmissionRecord).shards == (0, 1, 2)


def test_rendered_script_asks_for_cpus_only_and_runs_the_runtime(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, run_extra="submission:\n  memory: 3G\n  qos: high\n  time_limit: '2:00:00'\n")
    prepared = prepare(run, profile, env, datetime.now(UTC), host=HOST)
    script = render_generation(prepared.plan, prepared.layout, [0, 2])
    for line in (
        "#SBATCH --array=0-1",
        "SHARDS=(0 2)",
        '--shard "${SHARDS[$SLURM_ARRAY_TASK_ID]}"',
        "#SBATCH --gres=none",
        "#SBATCH --partition=cpu",
        "#SBATCH --mem=3G",
        "#SBATCH --qos=high",
        "#SBATCH --time=120",
        "unset SLURM_EXPORT_ENV",
    ):
        assert line in script
    assert f"{tmp_path / 'venv' / 'bin' / 'ddslurm-runtime'} generate --run-dir {prepared.layout.root}" in script
    assert "#SBATCH --signal=B:USR1@90" in script


@pytest.mark.parametrize(
    ("api_key", "env_change", "needle"),
    [
        pytest.param("HOSTED_KEY", {"HOSTED_KEY": ""}, "HOSTED_KEY is unset or empty", id="key-unset"),
        pytest.param("sk-abc123literal", {}, "looks like a literal key", id="literal-key"),
    ],
)
def test_refused_submission_changes_nothing(
    tmp_path: Path, api_key: str, env_change: dict[str, str], needle: str
) -> None:
    run, profile, env = _files(tmp_path, api_key=api_key)
    runner = RecordingRunner()
    with pytest.raises(SubmitError, match=needle):
        submit(run, profile, slurm=Slurm(runner), host=HOST, env={**env, **env_change})
    # only what the profile's checks read (ddslurm doctor's): nothing submitted, cancelled or changed
    assert [argv[0] for argv, _ in runner.calls if argv[0] not in ("sinfo", "scontrol", "sacctmgr")] == []
    assert not (tmp_path / "work").exists()


def test_bad_run_file_error_points_at_line_and_field(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, run_extra="submission:\n  cpus: many\n")
    with pytest.raises(SubmitError, match=r"run\.yaml:6:3: submission\.cpus: expected int, got str"):
        prepare(run, profile, env, datetime.now(UTC), host=HOST)


@pytest.mark.parametrize(
    ("run_extra", "prices", "needle"),
    [
        pytest.param("hosted_limits:\n  hosted-typo: {in_flight: 4}\n", None,
                     r"run\.yaml:6:3: hosted_limits\.hosted-typo: no hosted alias of the run uses provider "
                     r"'hosted-typo' \(the hosted providers it uses: hosted\)", id="limit-of-an-unused-provider"),
        pytest.param("hosted_limits:\n  hosted: {in_flight: 0}\n", None,
                     r"run\.yaml:6:12: hosted_limits\.hosted\.in_flight: expected int >= 1", id="limit-below-one"),
        pytest.param("prices: none.yaml\n", None, r"run\.yaml:5:1: prices: no price file .*none\.yaml",
                     id="price-file-missing"),
        pytest.param("prices: prices.yaml\n", "version: 2\n", r"prices\.yaml:1:1: version: invalid enum value 2",
                     id="price-file-version"),
        pytest.param("prices: prices.yaml\n", "version: 1\nmodels:\n  m: {input: -1, output: 1}\n",
                     r"prices\.yaml:3:7: models\.m\.input: expected float >= 0\.0", id="negative-price"),
    ],
)  # fmt: skip
def test_hosted_limits_and_prices_are_checked_at_their_field(
    tmp_path: Path, run_extra: str, prices: str | None, needle: str
) -> None:
    run, profile, env = _files(tmp_path, run_extra=run_extra)
    if prices is not None:
        (run.parent / "prices.yaml").write_text(prices)
    with pytest.raises(SubmitError, match=needle):
        prepare(run, profile, env, datetime.now(UTC), host=HOST)


def test_failed_sbatch_leaves_no_run_dir(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    with pytest.raises(SlurmError, match="Invalid partition"):
        submit(run, profile, slurm=Slurm(RecordingRunner(sbatch_rc=1)), host=HOST, env=env)
    assert list((tmp_path / "work" / "runs").iterdir()) == []


@pytest.mark.parametrize(
    ("key", "want"),
    [
        pytest.param("12_3", [("12", 3)], id="task"),
        pytest.param("12_[0-2]", [("12", 0), ("12", 1), ("12", 2)], id="pending-range"),
        pytest.param("12_[1,4-5%2]", [("12", 1), ("12", 4), ("12", 5)], id="throttled-list"),
        pytest.param("12", [("12", None)], id="plain-job"),
    ],
)
def test_parse_job_key(key: str, want: list[tuple[str, int | None]]) -> None:
    assert parse_job_key(key) == want


@pytest.mark.parametrize(
    ("squeue", "sacct", "want_run", "want_shards"),
    [
        pytest.param("4242_[0-2]|PENDING|Priority\n", "", "pending", ["pending"] * 3, id="pending"),
        pytest.param(
            "4242_0|RUNNING|None\n4242_[1-2]|PENDING|Resources\n",
            "",
            "running",
            ["running", "pending", "pending"],
            id="running",
        ),
        pytest.param(
            "",
            "4242_0|FAILED|1:0|None\n4242_1|CANCELLED|0:0|None\n4242_2|TIMEOUT|0:0|None\n",
            "failed",
            ["failed", "cancelled", "failed"],
            id="failed",
        ),
        pytest.param(
            "",
            "4242_0|CANCELLED|0:0|None\n4242_1|CANCELLED|0:0|None\n4242_2|CANCELLED|0:0|None\n",
            "cancelled",
            ["cancelled"] * 3,
            id="cancelled",
        ),
        pytest.param("", "", "pending", ["unknown"] * 3, id="accounting-lag-is-not-lost"),
    ],
)
def test_status_from_one_squeue_and_one_sacct(
    tmp_path: Path, squeue: str, sacct: str, want_run: str, want_shards: list[str]
) -> None:
    run, profile, env = _files(tmp_path)
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=HOST, env=env)
    runner = RecordingRunner(squeue=squeue, sacct=sacct)
    status = run_status(RunLayout(done.layout.root), Slurm(runner))
    assert status.state == want_run
    assert [s.state for s in status.shards] == want_shards
    assert sorted(c[0][0] for c in runner.calls) == ["sacct", "squeue"]


def test_status_of_500_shards_costs_one_squeue_and_one_sacct(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    run.write_text(run.read_text().replace("num_records: 10\nshards: 3", "num_records: 1000\nshards: 500"))
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=HOST, env=env)
    live = "".join(f"4242_{t}|RUNNING|None\n" for t in range(200)) + "4242_[200-499]|PENDING|Resources\n"
    runner = RecordingRunner(squeue=live)
    status = run_status(RunLayout(done.layout.root), Slurm(runner))
    assert [c[0][0] for c in runner.calls].count("squeue") == 1
    assert [c[0][0] for c in runner.calls].count("sacct") == 1
    assert status.counts == {"running": 200, "pending": 300}


@pytest.mark.parametrize(
    ("max_array", "shards", "retries", "want_arrays"),
    [
        pytest.param("MaxArraySize = 4\n", 10, 0, [["0-3"], ["0-3"], ["0-1"]], id="split-by-max-array-size"),
        pytest.param(
            "MaxArraySize = 1001\n",
            3,
            2,
            [["0-2"], ["0-2", "afternotok"], ["0-2", "afternotok"]],
            id="automatic-retries-chain",
        ),
    ],
)
def test_arrays_respect_max_array_size_and_chain_retries(
    tmp_path: Path, max_array: str, shards: int, retries: int, want_arrays: list[list[str]]
) -> None:
    run, profile, env = _files(tmp_path)
    run.write_text(run.read_text().replace("shards: 3", f"shards: {shards}\nretries: {retries}\nmax_concurrent: 2"))

    class Runner(RecordingRunner):
        next_id = 100

        def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
            if argv[0] == "scontrol":
                self.calls.append((list(argv), env))
                return Completed(0, max_array, "")
            if argv[0] == "sbatch":
                self.calls.append((list(argv), env))
                Runner.next_id += 1
                return Completed(0, f"{Runner.next_id}\n", "")
            return super().__call__(argv, env=env)

    runner = Runner()
    done = submit(run, profile, slurm=Slurm(runner), host=HOST, env=env)
    scripts = [Path(c[0][-1]).read_text() for c in runner.calls if c[0][0] == "sbatch"]
    assert len(scripts) == len(want_arrays) == len(done.job_ids)
    for script, want in zip(scripts, want_arrays, strict=True):
        assert f"#SBATCH --array={want[0]}%2" in script
        assert ("--dependency=afternotok:" in script) == ("afternotok" in want)
    if retries:
        assert f"--dependency=afternotok:{done.job_ids[0]}" in scripts[1]
        assert f"--dependency=afternotok:{done.job_ids[1]}" in scripts[2]
        assert "--kill-on-invalid-dep=yes" in scripts[1]
    else:
        assert "SHARDS" not in scripts[1] and '--shard "$((4 + SLURM_ARRAY_TASK_ID))"' in scripts[1]
    covered = sorted(s for p in (done.layout.submissions).glob("*.json") for s in read_json(p, SubmissionRecord).shards)
    assert covered == sorted(list(range(shards)) * (retries + 1))


def test_dry_run_prints_plan_and_script_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ddslurm.launcher.cli import main

    run, profile, env = _files(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["submit", str(run), "--profile", str(profile), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --gres=none" in text
    allowed = "PATH, LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR, SLURM_CONF, SSL_CERT_FILE, SSL_CERT_DIR, "
    assert f"# sbatch --export=ALL from an environment of {allowed}" in text
    assert "HOSTED_KEY only" in text
    assert main(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["secret_env"] == ["HOSTED_KEY"] and "#SBATCH --array=0-2" in out["script"]
    assert KEY not in text and KEY not in json.dumps(out)
    assert not (tmp_path / "work").exists()


def test_local_seed_file_becomes_part_of_the_run_inputs(tmp_path: Path) -> None:
    import json

    from ddslurm.launcher import write_run_dir
    from ddslurm.providers import load_recipe

    run, profile, env = _files(tmp_path)
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds" / "q.csv").write_text("subject\na\nb\n")  # not "topic": the recipe's sampler has it
    recipe = (tmp_path / "recipe.yaml").read_text()
    (tmp_path / "recipe.yaml").write_text(
        recipe.replace(
            "  model_configs:",
            "  seed_config:\n    source: {seed_type: local, path: seeds/q.csv}\n"
            "    sampling_strategy: ordered\n  model_configs:",
        )
    )
    prepared = prepare(run, profile, env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    layout = prepared.layout
    copy = layout.inputs / "seed" / "q.csv"
    assert copy.read_text() == "subject\na\nb\n"
    seed = prepared.plan.seed
    assert seed is not None and seed.kind == "file" and seed.root == str(layout.inputs / "seed")
    assert [(f.path, f.size) for f in seed.files] == [("q.csv", 12)] and seed.files[0].sha256
    assert (seed.rows, seed.pool_start, seed.pool_size) == (2, 0, 2)  # counted by Data Designer's reader
    # more records than seed rows: every shard starts a cycle of the two rows, as an unsharded run cycles them
    assert {(s.seed_start, s.seed_end) for s in prepared.plan.shards} == {(0, 1)}
    stored = load_recipe(layout.recipe)
    assert stored["data_designer"]["seed_config"]["source"]["path"] == str(copy)
    assert json.loads(layout.recipe.read_text())  # stored as JSON, which is YAML too

    (tmp_path / "seeds" / "q.csv").unlink()
    with pytest.raises(SubmitError, match=r"seed_config\.source\.path: .*q\.csv is not a file"):
        prepare(run, profile, env, datetime.now(UTC), host=HOST)


def _with_seed(tmp_path: Path, seed_config: str) -> None:
    recipe = (tmp_path / "recipe.yaml").read_text()
    (tmp_path / "recipe.yaml").write_text(recipe.replace("  model_configs:", seed_config + "  model_configs:"))


def test_seed_directory_is_captured_with_a_manifest(tmp_path: Path) -> None:
    """A directory seed (relative to the recipe) is copied into the run: only the files Data Designer would
    match, each listed with size and sha256, and the stored recipe points at the copy."""
    from ddslurm.launcher import write_run_dir
    from ddslurm.providers import load_recipe

    run, profile, env = _files(tmp_path)
    traces = tmp_path / "traces"
    (traces / "deep").mkdir(parents=True)
    for name, text in {"a.md": "alpha", "b.md": "beta", "deep/c.md": "gamma", "skip.txt": "no"}.items():
        (traces / name).write_text(text)
    _with_seed(
        tmp_path,
        "  seed_config:\n    source: {seed_type: file_contents, path: traces, file_pattern: '*.md'}\n"
        "    sampling_strategy: ordered\n",
    )
    prepared = prepare(run, profile, env, datetime.now(UTC), host=HOST)
    seed = prepared.plan.seed
    assert seed is not None and seed.kind == "directory" and seed.seed_type == "file_contents"
    assert sorted(f.path for f in seed.files) == ["a.md", "b.md", "deep/c.md"]
    assert seed.rows == 3  # Data Designer's manifest: one row per matching file
    write_run_dir(prepared)
    copy = prepared.layout.inputs / "seed" / "traces"
    assert (copy / "deep" / "c.md").read_text() == "gamma" and not (copy / "skip.txt").exists()
    stored = load_recipe(prepared.layout.recipe)
    assert stored["data_designer"]["seed_config"]["source"]["path"] == str(copy) == seed.path


def test_seed_file_pattern_is_captured(tmp_path: Path) -> None:
    from ddslurm.launcher import write_run_dir

    run, profile, env = _files(tmp_path)
    (tmp_path / "parts").mkdir()
    for i in range(3):
        (tmp_path / "parts" / f"p{i}.csv").write_text(f"subject\nt{i}a\nt{i}b\n")
    _with_seed(tmp_path, "  seed_config:\n    source: {seed_type: local, path: parts/*.csv}\n")
    prepared = prepare(run, profile, env, datetime.now(UTC), host=HOST)
    seed = prepared.plan.seed
    assert seed is not None and seed.kind == "files" and seed.rows == 6
    assert seed.path == str(prepared.layout.inputs / "seed" / "parts" / "*.csv")
    write_run_dir(prepared)
    assert sorted(p.name for p in (prepared.layout.inputs / "seed" / "parts").iterdir()) == [
        "p0.csv",
        "p1.csv",
        "p2.csv",
    ]


@pytest.mark.parametrize(
    ("seed_config", "message"),
    [
        (
            "  seed_config:\n    source: {seed_type: hf, path: datasets/x/y/data.parquet}\n",
            r"seed_config\.source\.seed_type: Hugging Face seed datasets cannot be read on the nodes",
        ),
        ("  seed_config:\n    source: {seed_type: directory, path: ~/traces}\n", r"source\.path: '~/traces'"),
        ("  seed_config:\n    source: {seed_type: directory, path: nowhere}\n", r"nowhere is not a directory"),
        (
            "  seed_config:\n    source: {seed_type: local, path: q.csv}\n    selection_strategy: {start: 0, end: 5}\n",
            r"seed_config\.selection_strategy\.end: 5 is past the seed dataset's 2 rows",
        ),
        (
            "  seed_config:\n    source: {seed_type: local, path: q.csv}\n"
            "    selection_strategy: {index: 0, num_partitions: 3}\n",
            r"num_partitions: 3 exceeds the seed's 2 rows",
        ),
    ],
)
def test_seed_sources_that_would_fail_on_the_nodes_are_refused_at_submit(
    tmp_path: Path, seed_config: str, message: str
) -> None:
    run, profile, env = _files(tmp_path)
    (tmp_path / "q.csv").write_text("topic\na\nb\n")
    _with_seed(tmp_path, seed_config)
    with pytest.raises(SubmitError, match=message):
        prepare(run, profile, env, datetime.now(UTC), host=HOST)
    assert not (tmp_path / "work").exists()


def _attempt(layout: RunLayout, shard: int, job: str, state: str, rows: int = 0) -> None:
    from ddslurm.config import AttemptRecord, atomic_write, encode

    attempt = layout.shard(shard).attempt(f"attempt-{job}")
    attempt.dir.mkdir(parents=True)
    atomic_write(
        attempt.record,
        encode(
            AttemptRecord(
                shard=shard,
                attempt=f"attempt-{job}",
                job_id=job,
                node="n",
                state=state,  # type: ignore[arg-type]
                started_at="2026-01-01T00:00:00+00:00",
                rows=rows,
                reason=None if state == "partial" else "cancelled",
            )
        ),
    )


def test_retry_resubmits_only_shards_without_winner_or_live_task_and_rechecks_keys(tmp_path: Path) -> None:
    from ddslurm.config import WinnerRecord, encode, publish_once
    from ddslurm.launcher import LauncherError
    from ddslurm.launcher.runs._steer import retry

    run, profile, env = _files(tmp_path)
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=HOST, env=env)
    layout = RunLayout(done.layout.root)
    publish_once(
        layout.shard(0).winner,
        encode(
            WinnerRecord(
                shard=0, attempt="attempt-1", rows=4, dataset_dir="/x", files=(), plan_sha256="-", published_at="-"
            )
        ),
    )
    _attempt(layout, 1, "4243", "failed")
    runner = RecordingRunner(sacct="4242_1|CANCELLED|0:0|None\n", squeue="4242_2|RUNNING|None\n", first_id=5000)
    with pytest.raises(SubmitError, match="HOSTED_KEY"):
        retry(layout, Slurm(runner), {**env, "HOSTED_KEY": ""})
    retried = retry(layout, Slurm(runner), env)
    assert retried.shards == (1,)
    record = read_json(layout.submissions / f"{retried.job_ids[0]}.json", SubmissionRecord)
    assert record.kind == "retry" and record.shards == (1,)
    with pytest.raises(LauncherError, match="still running or queued"):
        retry(layout, Slurm(runner), env, [2])


def test_retry_fresh_excludes_every_earlier_attempt_from_resume(tmp_path: Path) -> None:
    from ddslurm.config import FreshRecord
    from ddslurm.launcher.runs._steer import retry

    run, profile, env = _files(tmp_path)
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=HOST, env=env)
    layout = RunLayout(done.layout.root)
    _attempt(layout, 1, "4243", "partial", rows=1)
    runner = RecordingRunner(
        sacct="4242_0|COMPLETED|0:0|None\n4242_1|FAILED|3:0|None\n4242_2|COMPLETED|0:0|None\n", first_id=6000
    )
    retried = retry(layout, Slurm(runner), env, [1], fresh=True)
    assert retried.shards == (1,)
    fresh = read_json(layout.shard(1).fresh, FreshRecord)
    assert fresh.excluded == ("attempt-4243",)
    assert not layout.shard(0).fresh.exists()  # only the retried shards start afresh


def test_cancel_targets_the_live_tasks_of_the_chosen_shards(tmp_path: Path) -> None:
    from ddslurm.launcher.runs._steer import cancel

    run, profile, env = _files(tmp_path)
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=HOST, env=env)
    runner = RecordingRunner(squeue="4242_0|RUNNING|None\n4242_1|RUNNING|None\n4242_2|PENDING|Priority\n")
    assert cancel(RunLayout(done.layout.root), Slurm(runner), [1, 2]).ids == ("4242_1", "4242_2")
    assert ["scancel", "4242_1", "4242_2"] in [c[0] for c in runner.calls]


def test_accept_partial_publishes_the_best_candidate_once(tmp_path: Path) -> None:
    from ddslurm.config import WinnerRecord, atomic_write, encode
    from ddslurm.launcher import LauncherError
    from ddslurm.launcher.runs._steer import accept_partial

    run, profile, env = _files(tmp_path)
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=HOST, env=env)
    layout = RunLayout(done.layout.root)
    for job, rows in (("7", 2), ("8", 3)):
        _attempt(layout, 1, job, "partial", rows)
        atomic_write(
            layout.shard(1).attempt(f"attempt-{job}").candidate,
            encode(
                WinnerRecord(
                    shard=1,
                    attempt=f"attempt-{job}",
                    rows=rows,
                    dataset_dir="/x",
                    files=(),
                    plan_sha256="-",
                    published_at="-",
                    partial=True,
                )
            ),
        )
    slurm = Slurm(RecordingRunner())
    done = accept_partial(layout, [1], slurm, env)
    assert [(a.shard, a.rows, a.stage) for a in done.accepted] == [(1, 3, None)] and done.cpu_stage == ()
    winner = read_json(layout.shard(1).winner, WinnerRecord)
    assert winner.partial and winner.attempt == "attempt-8"
    with pytest.raises(LauncherError, match="already has a winner"):
        accept_partial(layout, [1], slurm, env)
    with pytest.raises(LauncherError, match="no partial result"):
        accept_partial(layout, [2], slurm, env)


def test_jobs_get_exactly_the_environment_ddslurm_builds(tmp_path: Path) -> None:
    """sbatch runs with --export=ALL in an environment of the allow-list and the run's key only: neither the rest
    of the submitting shell nor (see tests/test_e2e_environment.py) the user's login files reach the job."""
    run, profile, env = _files(tmp_path)
    env |= {"LANG": "C.UTF-8", "OPENAI_API_KEY": "sk-unrelated", "SBATCH_ACCOUNT": "x", "SLURM_JOB_ID": "9"}
    runner = RecordingRunner()
    submit(run, profile, slurm=Slurm(runner, env={"PATH": "/elsewhere"}), host=HOST, env=env)
    argv, call_env = next(c for c in runner.calls if c[0][0] == "sbatch")
    assert "--export=ALL" in argv and not [a for a in argv if a.startswith("--export=") and a != "--export=ALL"]
    assert call_env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOSTED_KEY": KEY}


def test_collection_job_gets_only_the_allow_list() -> None:
    from ddslurm.launcher.cluster._slurm import job_environment

    runner = RecordingRunner()
    env = {"PATH": "/usr/bin", "TZ": "UTC", "HOSTED_KEY": KEY, "HF_TOKEN": "hf_x", "HOME": "/root", "EMPTY": ""}
    Slurm(runner, env=env).sbatch("/tmp/collect.sbatch")
    assert runner.calls == [
        (["sbatch", "--parsable", "--export=ALL", "/tmp/collect.sbatch"], {"PATH": "/usr/bin", "TZ": "UTC"})
    ]
    assert job_environment(env, ["HOME", "EMPTY", "UNSET"]) == {"PATH": "/usr/bin", "TZ": "UTC", "HOME": "/root"}


def test_submit_asks_python_env_only_through_its_engine_host(tmp_path: Path) -> None:
    """Every question to Data Designer goes through the host ``submit`` is given: its versions (doctor's check)
    and its check of the recipe, once each; a host that answers in-process starts no ``runtime inspect``."""
    run, profile, env = _files(tmp_path)
    host = InProcessHost(fallback=_Refusing())
    submit(run, profile, slurm=Slurm(RecordingRunner()), host=host, env=env)
    assert host.asked == {"versions": 1, "check": 1}


@pytest.mark.parametrize("nodes", ["1.0.0rc1", "0.8.0", None], ids=["newer", "oldest", "the-submit-hosts"])
def test_a_python_env_with_any_supported_data_designer_is_submitted_and_its_version_recorded(
    tmp_path: Path, nodes: str | None
) -> None:
    """The submit host keeps its Data Designer; python_env holds another supported one: doctor accepts it, and the
    plan records the nodes' version (the one each node checks), not the submit host's."""
    from importlib.metadata import version

    from ddslurm.launcher.testing import OtherPythonEnv

    run, profile, env = _files(tmp_path)
    host = OtherPythonEnv({} if nodes is None else {"data-designer": nodes}, fallback=_Refusing())
    done = submit(run, profile, slurm=Slurm(RecordingRunner()), host=host, env=env)
    assert done.plan.data_designer_version == (nodes or version("data-designer"))
    assert read_json(done.layout.plan, Plan).data_designer_version == done.plan.data_designer_version


class _Refusing(EngineHost):
    def exchange(self, runtime: Path, request: str, **_: object) -> Finished:
        raise AssertionError(f"a {request} question reached a runtime process: {runtime}")
