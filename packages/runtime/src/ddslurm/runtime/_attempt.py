"""One attempt of one shard: run the engine, verify the candidate, publish the winner exactly once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from ddslurm.config import (
    AttemptLayout,
    AttemptRecord,
    Plan,
    ProviderSnapshot,
    RunLayout,
    WinnerRecord,
    atomic_write,
    attempt_id_for,
    digest,
    encode,
    make_private_dir,
    publish_once,
    read_json,
    read_regular,
    read_yaml,
    sha256_bytes,
    sha256_file,
    to_builtins,
)
from ddslurm.runtime._engine import EngineRequest, EngineResult, partition_seed
from ddslurm.runtime._verify import make_private, scan_for_secrets, verify_dataset
from ddslurm.runtime.errors import InputsError, RuntimeFailure, SecretMissingError, VerificationError

Engine = Callable[[EngineRequest], EngineResult]
Clock = Callable[[], datetime]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PARTIAL = 3


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Inputs:
    plan: Plan
    plan_sha256: str
    recipe: Mapping[str, Any]
    snapshot: ProviderSnapshot


def load_inputs(layout: RunLayout) -> Inputs:
    """Read the plan, recipe and snapshot from the run directory and check their recorded digests."""
    try:
        plan = read_json(layout.plan, Plan)
        recipe_bytes = read_regular(Path(plan.recipe_file))
        snapshot_bytes = read_regular(Path(plan.snapshot_file))
    except (OSError, msgspec.DecodeError, Exception) as exc:
        raise InputsError(f"cannot read the run's inputs in {layout.root}: {exc}") from exc
    if sha256_bytes(recipe_bytes) != plan.recipe_sha256:
        raise InputsError(f"{plan.recipe_file}: sha256 differs from the plan; the run's inputs were modified")
    if sha256_bytes(snapshot_bytes) != plan.snapshot_sha256:
        raise InputsError(f"{plan.snapshot_file}: sha256 differs from the plan; the run's inputs were modified")
    if plan.seed_file is not None:
        try:
            seed_sha = sha256_file(Path(plan.seed_file))
        except OSError as exc:
            raise InputsError(f"cannot read the run's seed dataset {plan.seed_file}: {exc}") from exc
        if seed_sha != plan.seed_sha256:
            raise InputsError(f"{plan.seed_file}: sha256 differs from the plan; the run's inputs were modified")
    snapshot = msgspec.json.decode(snapshot_bytes, type=ProviderSnapshot)
    recipe = to_builtins(read_yaml(Path(plan.recipe_file)))
    return Inputs(plan=plan, plan_sha256=digest(plan), recipe=recipe, snapshot=snapshot)


@dataclass(frozen=True, slots=True)
class Began:
    """An attempt that has its directory and a ``running`` record."""

    shard: int
    num_records: int
    layout: AttemptLayout
    record: AttemptRecord


def exit_code_for(record: AttemptRecord) -> int:
    return {"succeeded": EXIT_OK, "superseded": EXIT_OK, "partial": EXIT_PARTIAL}.get(record.state, EXIT_FAILED)


class AttemptRunner:
    """One attempt of one shard: begin it, run the engine, verify, publish once, or record the failure.

    Dependencies (engine, environment, scratch home, logger factory, clock) are passed in.
    """

    def __init__(
        self,
        layout: RunLayout,
        *,
        engine: Engine,
        env: Mapping[str, str],
        scratch_home: Path,
        make_logger: Callable[[IO[bytes]], Any],
        clock: Clock = utc_now,
    ) -> None:
        self._layout = layout
        self._engine = engine
        self._env = env
        self._scratch_home = scratch_home
        self._make_logger = make_logger
        self._clock = clock

    def _now(self) -> str:
        return self._clock().isoformat()

    def _write(self, attempt: AttemptLayout, record: AttemptRecord) -> None:
        atomic_write(attempt.record, encode(record))

    def begin(self, inputs: Inputs, shard_index: int, job_id: str, node: str) -> Began | None:
        """Create the attempt directory and its ``running`` record; None (recorded superseded) if the shard
        already has a winner."""
        plan = inputs.plan
        if not 0 <= shard_index < len(plan.shards):
            raise InputsError(f"shard {shard_index} does not exist; the plan has {len(plan.shards)} shard(s)")
        spec = plan.shards[shard_index]
        shard = self._layout.shard(shard_index)
        attempt_id = attempt_id_for(job_id)
        make_private_dir(shard.attempts, exist_ok=True)
        attempt = shard.attempt(attempt_id)
        make_private_dir(attempt.dir)
        record = AttemptRecord(
            shard=shard_index,
            attempt=attempt_id,
            job_id=job_id,
            node=node,
            state="running",
            started_at=self._now(),
            requested_rows=spec.num_records,
        )
        if shard.winner.exists():
            self._write(
                attempt,
                msgspec.structs.replace(record, state="superseded", ended_at=self._now(), reason="winner_exists"),
            )
            return None
        self._write(attempt, record)
        return Began(shard_index, spec.num_records, attempt, record)

    def resume(self, shard_index: int, attempt_id: str) -> Began:
        """The attempt a controller began, for the client step that runs the engine."""
        attempt = self._layout.shard(shard_index).attempt(attempt_id)
        record = read_json(attempt.record, AttemptRecord)
        return Began(shard_index, record.requested_rows or 0, attempt, record)

    def fail(self, began: Began, failure: RuntimeFailure) -> int:
        current = read_json(began.layout.record, AttemptRecord)
        if current.state != "running":
            return exit_code_for(current)
        self._write(
            began.layout,
            msgspec.structs.replace(
                current, state="failed", ended_at=self._now(), reason=failure.reason, message=failure.message
            ),
        )
        return EXIT_FAILED

    def run(
        self, inputs: Inputs, shard_index: int, job_id: str, node: str, endpoints: Mapping[str, str] | None = None
    ) -> int:
        """Begin and generate in this process (the hosted-only path outside Slurm, and tests)."""
        began = self.begin(inputs, shard_index, job_id, node)
        if began is None:
            return EXIT_OK
        return self.generate(inputs, began, endpoints or {})

    def generate(self, inputs: Inputs, began: Began, endpoints: Mapping[str, str]) -> int:
        with began.layout.client_log.open("ab") as log_stream:
            log = self._make_logger(log_stream).bind(shard=began.shard, attempt=began.record.attempt)
            log.info("attempt.generating", records=began.num_records, endpoints=dict(endpoints))
            try:
                return self._generate(inputs, began, endpoints, log)
            except RuntimeFailure as exc:
                log.error("attempt.failed", reason=exc.reason, message=exc.message)
                return self.fail(began, exc)

    def _generate(self, inputs: Inputs, began: Began, endpoints: Mapping[str, str], log: Any) -> int:
        plan = inputs.plan
        num_records, shard_index, attempt, record = began.num_records, began.shard, began.layout, began.record
        missing = [n for n in plan.secret_env if not self._env.get(n)]
        if missing:
            raise SecretMissingError(f"API-key variable(s) {', '.join(missing)} are unset in the job's environment")

        def on_batch(path: Path) -> None:
            log.info("batch.complete", file=str(path))

        result = self._engine(
            EngineRequest(
                recipe=partition_seed(inputs.recipe, shard_index, len(plan.shards)),
                snapshot=inputs.snapshot,
                endpoints=endpoints,
                artifact_path=attempt.output,
                scratch_home=self._scratch_home,
                dataset_name=f"shard-{shard_index:05d}",
                num_records=num_records,
                buffer_size=min(plan.buffer_size, num_records),
                on_batch_complete=on_batch,
            )
        )
        rows, files = verify_dataset(result.dataset_dir, result.rows)
        leaks = scan_for_secrets(attempt.dir, (self._env.get(n, "") for n in plan.secret_env))
        if leaks:
            raise VerificationError(f"a secret value was found in {len(leaks)} file(s), e.g. {leaks[0]}")
        make_private(result.dataset_dir)
        if rows < num_records:
            self._write(
                attempt,
                msgspec.structs.replace(
                    record,
                    state="partial",
                    ended_at=self._now(),
                    rows=rows,
                    reason="rows_dropped",
                    message=f"{rows} of {num_records} records generated",
                ),
            )
            log.warning("attempt.partial", rows=rows, requested=num_records)
            return EXIT_PARTIAL
        winner = WinnerRecord(
            shard=shard_index,
            attempt=record.attempt,
            rows=rows,
            dataset_dir=str(result.dataset_dir),
            files=files,
            plan_sha256=inputs.plan_sha256,
            published_at=self._now(),
        )
        if publish_once(self._layout.shard(shard_index).winner, encode(winner)):
            self._write(attempt, msgspec.structs.replace(record, state="succeeded", ended_at=self._now(), rows=rows))
            log.info("attempt.published", rows=rows, files=len(files))
        else:
            self._write(
                attempt,
                msgspec.structs.replace(
                    record, state="superseded", ended_at=self._now(), rows=rows, reason="winner_exists"
                ),
            )
            log.info("attempt.superseded", why="another attempt published first", rows=rows)
        return EXIT_OK
