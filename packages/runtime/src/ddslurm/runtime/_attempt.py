"""One attempt of one shard: run the engine, verify the candidate, publish the winner exactly once."""

from __future__ import annotations

import dataclasses
import random
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import msgspec

from ddslurm.config import (
    AttemptRecord,
    Plan,
    RunLayout,
    SeedRows,
    WinnerRecord,
    atomic_write,
    encode,
    llm_columns,
    parallel_requests,
    partition_seed,
    plan_split,
    publish_once,
    read_json,
    sized_parallel_requests,
    stage_recipe,
)
from ddslurm.runtime._attempt_record import EXIT_OK, EXIT_PARTIAL, AttemptRecords, Began, Clock, StageRun, utc_now
from ddslurm.runtime._dd_version import check_data_designer
from ddslurm.runtime._engine import EngineRequest, EngineResult, read_seed_block
from ddslurm.runtime._fill import fill_missing, recipe_reading
from ddslurm.runtime._hosted_gate import HostedGate, gate_wait_s
from ddslurm.runtime._inputs import Inputs
from ddslurm.runtime._key_budget import Caps
from ddslurm.runtime._progress import ProgressFile
from ddslurm.runtime._resume import EmptyLimit, continued_files, resume_source, seed_from
from ddslurm.runtime._shard_seed import fixed_seed_file, read_seed_file, shuffled_block, stage_seed_table
from ddslurm.runtime._usage import recording_usage
from ddslurm.runtime._verify import (
    FILL_DIR,
    make_private,
    reject_empty_outputs,
    rows_in,
    scan_for_secrets,
    verify_dataset,
)
from ddslurm.runtime.errors import (
    InputsError,
    OutputExistsError,
    ProviderUnavailableError,
    RuntimeFailure,
    SecretMissingError,
    VerificationError,
)

Engine = Callable[[EngineRequest], EngineResult]
SeedReader = Callable[[Mapping[str, Any], SeedRows], Any]
"""Reads a block of seed rows of a recipe's seed dataset as a ``pyarrow.Table`` (``read_seed_block``)."""

OUTAGE_PAUSE_CAP_S = 30.0
"""The longest pause between two tries of a provider that is unavailable."""


def outage_pause(tries: int, jitter: float) -> float:
    """Seconds to wait before the next try of an unavailable provider, after ``tries`` failed ones: doubling from
    1 s up to :data:`OUTAGE_PAUSE_CAP_S`, times a factor between 0.5 and 1.5 (``jitter`` in [0, 1)), so that the
    shards that failed together do not come back together."""
    return min(OUTAGE_PAUSE_CAP_S, 2.0 ** min(tries, 8)) * (0.5 + jitter)


class AttemptRunner(AttemptRecords):
    """One attempt of one shard: begin it, run the engine, verify, publish once, or record the failure.

    Dependencies (engine, environment, scratch home, logger factory, clock) are passed in.
    """

    def __init__(
        self,
        layout: RunLayout,
        *,
        engine: Engine,
        env: Mapping[str, str],
        scratch_home: Path | None = None,
        make_logger: Callable[[IO[bytes]], Any],
        clock: Clock = utc_now,
        read_seed: SeedReader = read_seed_block,
        stage: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(layout, env=env, clock=clock, stage=stage)
        self._sleep = sleep
        self._jitter = jitter
        self._engine = engine
        self._read_seed = read_seed
        self._scratch_home = scratch_home
        self._make_logger = make_logger

    def _require_scratch(self) -> Path:
        if self._scratch_home is None:
            raise RuntimeFailure("this runner has no scratch home for Data Designer (it only begins attempts)")
        return self._scratch_home

    def run(
        self, inputs: Inputs, shard_index: int, job_id: str, node: str, endpoints: Mapping[str, str] | None = None
    ) -> int:
        """Begin and generate in this process (the hosted-only path outside Slurm, and tests)."""
        began = self.begin(inputs, shard_index, job_id, node)
        if began is None:
            return EXIT_OK
        return self.generate(inputs, began, endpoints or {})

    def generate(self, inputs: Inputs, began: Began, endpoints: Mapping[str, str], *, resume_own: bool = False) -> int:
        with began.layout.client_log.open("ab") as log_stream:
            log = self._make_logger(log_stream).bind(shard=began.shard, attempt=began.record.attempt)
            log.info(
                "attempt.generating",
                records=began.num_records,
                endpoints=dict(endpoints),
                resume=resume_own,
                max_parallel_requests=parallel_requests(inputs.snapshot, inputs.plan.serving),
                sized_aliases=sorted(sized_parallel_requests(inputs.snapshot, inputs.plan.serving)),
            )
            with recording_usage(began.layout.client_usage, log):
                try:
                    check_data_designer(inputs.plan.data_designer_version)  # before Data Designer runs
                    return self._outlasting_outages(inputs, began, endpoints, log, resume_own)
                except RuntimeFailure as exc:
                    log.error("attempt.failed", reason=exc.reason, message=exc.message)
                    return self.fail(began, exc)

    def _outlasting_outages(
        self, inputs: Inputs, began: Began, endpoints: Mapping[str, str], log: Any, resume_own: bool
    ) -> int:
        """Generate; a provider that is unavailable (429, 5xx, refused, timed out) is tried again after a pause
        (:func:`outage_pause`), continuing the batches done so far, until the run file's ``provider_wait`` is
        spent: then its failure says how long it was waited out."""
        waited, tries, bound = 0.0, 0, inputs.plan.provider_wait_s
        while True:
            try:
                return self._generate(inputs, began, endpoints, log, resume_own, counted=tries == 0)
            except ProviderUnavailableError as exc:
                pause = outage_pause(tries, self._jitter())
                if waited + pause > bound:
                    raise ProviderUnavailableError(
                        f"{exc.message} (waited out for {waited:.0f} s over {tries + 1} tries; the run file's "
                        f"provider_wait is {bound} s)",
                        provider=exc.provider,
                    ) from exc
                log.warning(
                    "provider.unavailable", message=exc.message, waited_s=round(waited, 1), pause_s=round(pause, 1)
                )
                self._sleep(pause)
                waited, tries = waited + pause, tries + 1
                resume_own = True  # the batches done so far stay: the next try continues them

    def _generate(
        self, inputs: Inputs, began: Began, endpoints: Mapping[str, str], log: Any, resume_own: bool, *, counted: bool
    ) -> int:
        """One run of Data Designer for the attempt, its hosted providers behind the client's gate (their keys'
        shared budgets, :mod:`ddslurm.runtime._hosted_gate`); ``counted``: it is a client run of its own (not a
        further try of the same run after the provider was unavailable)."""
        gate = HostedGate(
            inputs.snapshot.providers,
            models=inputs.snapshot.models,
            budgets=self._layout.budgets,
            member=f"{began.record.job_id}-{began.record.attempt}",
            requests_file=began.layout.hosted_requests,
            caps={name: Caps(c.in_flight, c.requests_per_minute, c.tokens_per_minute)
                  for name, c in inputs.plan.hosted_limits.items()},
        )  # fmt: skip
        with gate.running() as hosted:
            return self._generate_gated(inputs, began, {**endpoints, **hosted}, log, resume_own, gate, counted=counted)

    def _generate_gated(
        self,
        inputs: Inputs,
        began: Began,
        endpoints: Mapping[str, str],
        log: Any,
        resume_own: bool,
        gate: HostedGate,
        *,
        counted: bool,
    ) -> int:
        plan = inputs.plan
        num_records, shard_index, attempt = began.num_records, began.shard, began.layout
        missing = [n for n in plan.secret_env if not self._env.get(n)]
        if missing:
            raise SecretMissingError(f"API-key variable(s) {', '.join(missing)} are unset in the job's environment")
        dataset_name = f"shard-{shard_index:05d}"
        target = attempt.output / dataset_name
        stage = self.stage_run(inputs, began)
        empty = EmptyLimit(llm_columns(stage.recipe), plan.max_empty_outputs)
        resume = self._prepare_output(plan, shard_index, began, target, resume_own, empty, log)
        record = read_json(attempt.record, AttemptRecord)
        if counted:  # its endpoints are there: a spare's wait is over (the first run says when it began generating)
            record = msgspec.structs.replace(
                record, client_runs=record.client_runs + 1, generating_at=record.generating_at or self._now()
            )
            self._write(attempt, record)
        checked = gate.checker(self._env)

        batch = min(plan.buffer_size, num_records)
        progress = ProgressFile(
            attempt.progress, target, columns=len(llm_columns(stage.recipe)), batch=batch, now=self._now, log=log
        )
        result = self._engine(
            EngineRequest(
                recipe=stage.recipe,
                snapshot=inputs.snapshot,
                endpoints=endpoints,
                artifact_path=attempt.output,
                scratch_home=self._require_scratch(),
                dataset_name=dataset_name,
                num_records=num_records,
                buffer_size=batch,
                serving=plan.serving,
                on_batch_complete=progress.batch_done,
                on_cell=progress.cell_done,
                resume=resume,
                preserve_dropped_columns=stage.numbered,
                source=plan.recipe_source,
                plugins=plan.plugins,
                hosted_wait_s=gate_wait_s(inputs.snapshot, endpoints),
                hosted_check=checked,
                run_config=plan.run_config,
                on_run_config=lambda applied: log.info("engine.run_config", applied=dict(applied)),
            )
        )
        if result.dataset_dir != target:
            raise VerificationError(f"Data Designer wrote {result.dataset_dir}, not the attempt's {target}")
        if not result.stopped_early:  # a provider that tripped the early-shutdown gate is not asked again now
            fill_missing(
                self._engine,
                self._require_scratch,
                inputs,
                began,
                stage,
                target,
                result.rows,
                endpoints,
                progress,
                log,
                checked,
            )
        rows, files = verify_dataset(result.dataset_dir, result.rows + rows_in(target / FILL_DIR))
        reject_empty_outputs(result.dataset_dir, stage.recipe, plan.max_empty_outputs, rows)
        scanned = (n for n in plan.secret_env if n not in plan.secret_env_unscanned)  # placeholders: not secrets
        roots = [attempt.dir, *([Path(began.record.allocation)] if began.record.allocation else [])]  # + its servers
        leaks = scan_for_secrets(roots, (self._env.get(n, "") for n in scanned))
        if leaks:
            raise VerificationError(f"a secret value was found in {len(leaks)} file(s), e.g. {leaks[0]}")
        make_private(result.dataset_dir)
        winner = WinnerRecord(
            shard=shard_index,
            attempt=record.attempt,
            rows=rows,
            dataset_dir=str(result.dataset_dir),
            files=files,
            plan_sha256=inputs.plan_sha256,
            published_at=self._now(),
            partial=rows < num_records or stage.partial_input,  # an accepted partial GPU stage stays partial
        )
        if rows < num_records:
            atomic_write(attempt.candidate, encode(winner))
            self._write(
                attempt,
                msgspec.structs.replace(
                    record,
                    state="partial",
                    ended_at=self._now(),
                    rows=rows,
                    reason="early_shutdown" if result.stopped_early else "rows_dropped",
                    message=f"{rows} of {num_records} records generated"
                    + (" (Data Designer stopped early: too many failed requests)" if result.stopped_early else ""),
                ),
            )
            log.warning("attempt.partial", rows=rows, requested=num_records)
            return EXIT_PARTIAL
        if publish_once(self._shard(shard_index).winner, encode(winner)):
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

    def stage_run(self, inputs: Inputs, began: Began) -> StageRun:
        """The recipe this attempt runs and its seed rows: the whole recipe (one stage) or the GPU stage's, each
        on the shard's seed block; or the CPU stage's, reading the shard's GPU-stage winner in order, each of its
        rows used once.

        Whatever the attempt derives for Data Designer to read is the shard's, fixed once (``_shard_seed``): a
        shuffled seed block in the order the plan's seed gives the shard, read in that order; the CPU stage's seed
        file (the verified GPU-stage winner, its rows numbered). Every attempt, resume, rerun and fill of the shard
        reads the same file at the same path, so Data Designer resumes what an earlier attempt began and a shuffle
        uses every seed row exactly as often as an unsharded run."""
        plan, spec = inputs.plan, inputs.plan.shards[began.shard]
        shard = self._layout.shard(began.shard)
        if self._stage == 1:
            first = self._stage_winner(began.shard)
            if first is None:
                raise InputsError(f"shard {began.shard}: the GPU stage has no result to read")
            seed_path = fixed_seed_file(shard.stage_seed(first.attempt), lambda: stage_seed_table(first))
            split = plan_split(plan.stages, plan.stage_reason)
            staged = stage_recipe(inputs.recipe, split, 1, seed_path=str(seed_path))
            return StageRun(staged, lambda: read_seed_file(seed_path), numbered=True, partial_input=first.partial)
        base = inputs.recipe if self._stage is None else stage_recipe(inputs.recipe, plan_split(plan.stages), 0)
        recipe = partition_seed(base, spec)
        block = spec.seed_rows
        if plan.seed is None or block is None:
            return StageRun(recipe, None)
        if plan.seed.sampling == "shuffle" and plan.seed.shuffle_seed is not None:
            seed = plan.seed.shuffle_seed
            ordered = fixed_seed_file(
                shard.seed_order, lambda: shuffled_block(self._read_seed(recipe, block), seed, began.shard)
            )
            return StageRun(recipe_reading(recipe, ordered), lambda: read_seed_file(ordered))
        return StageRun(recipe, lambda: self._read_seed(recipe, block), plan.seed.sampling)

    def _prepare_output(
        self, plan: Plan, shard_index: int, began: Began, target: Path, resume_own: bool, empty: EmptyLimit, log: Any
    ) -> bool:
        """Decide whether Data Designer resumes, and from what. Returns the resume flag.

        A fresh attempt never finds its dataset path in place: an existing non-empty path or a symbolic link
        there fails the attempt and is left exactly as it is. Resuming this attempt's own dataset (a rerun
        inside the allocation) continues in place; resuming across allocations seeds the new dataset directory
        with the completed batches of the shard's best earlier attempt, less those whose empty outputs
        verification would reject (``empty``).
        """
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise OutputExistsError(f"{target} is a symbolic link or not a directory; it was left untouched")
        if resume_own:
            if (target / "metadata.json").is_file():
                own = continued_files(target, empty)
                if own.left_out:  # batches verification would reject: continue the rest, keep all under a new name
                    aside = _keep_stopped(target)
                    rows = seed_from(dataclasses.replace(own, dataset=aside), target)
                    log.info("resume.own", rows=rows, left_out_for_empty_outputs=own.left_out, kept=str(aside))
                return True
            if target.exists():
                # The previous run of this attempt stopped before Data Designer recorded anything to resume:
                # keep what it left under another name, and let Data Designer start the dataset afresh.
                _keep_stopped(target)
            return False
        if target.exists():
            raise OutputExistsError(f"{target} already exists; it was left untouched")
        if plan.resume == "never":
            return False
        source = resume_source(self._shard(shard_index), began.record.attempt, empty)
        if source is None:
            if plan.resume == "always":
                log.info("resume.nothing", why="no earlier attempt of this shard completed a batch it may continue")
            return False
        rows = seed_from(source, target)
        record = read_json(began.layout.record, AttemptRecord)
        owner = source.dataset.parent.parent.name
        self._write(began.layout, msgspec.structs.replace(record, resumed_from=owner, resumed_rows=rows))
        log.info("resume.seeded", source=str(source.dataset), rows=rows, left_out_for_empty_outputs=source.left_out)
        return True


def _keep_stopped(dataset: Path) -> Path:
    """Rename what a stopped run of this attempt left at ``dataset`` to ``<name>.stopped-<token>`` beside it
    (nothing deleted); returns the new path."""
    aside = dataset.with_name(f"{dataset.name}.stopped-{secrets.token_hex(3)}")
    dataset.rename(aside)
    return aside
