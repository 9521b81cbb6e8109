"""The run-directory layout (version 1). Every path a run uses is derived here and nowhere else.

<workspace>/runs/<run_id>/
    run.json                      the plan (immutable, hashed)
    inputs/recipe.yaml            the recipe as submitted (for a builder script: the config it built)
    inputs/recipe-source.py       the builder script the recipe was built by (provenance only; never run)
    inputs/snapshot.json          the provider snapshot (owner-only)
    inputs/run.yaml               the run file as submitted
    submit-plan.json              written once before the first sbatch: every array the submission makes
    submissions/<array_job_id>.json   one per array submitted (plan_index: which planned array)
    cancelled.json                written once by ``ddslurm cancel`` (whole run): no later attempt generates
    workflow-next.json            a workflow stage's run: the run that took the next stage (written once)
    generate.sbatch               the rendered batch script
    generate-<stamp>-<NNNN>.sbatch    the script of each array submitted
    logs/slurm-<array>_<task>.out each array task's batch output (``_slurm_names``: made and read there only)
    shards/shard-<NNNNN>/
        winner.json               written once by the first verified attempt
        claims/<array_job_id>.json    the allocation of a pulling array that took the shard (once per array)
        cancelled.json            ``ddslurm cancel --shards`` of a shard run by pulling allocations
        stage-0/                  a two-stage run's GPU stage: winner.json, attempts/, claims/ as above
        attempts/attempt-<job_id>/
            attempt.json          attempt record (state, reason, rows)
            client.log            structured log of the generation step
            output/<dataset>/     Data Designer's own dataset directory
    allocations/allocation-<job_id>/  a pulling allocation's server and proxy logs (kept across its shards);
                                  allocation-<job_id>-r<n>/ after the n-th requeue
        busy-<alias>-<i>.jsonl    when replica i of the alias had requests in flight through its proxy (a one-shard
                                  task's: in its attempt directory)
    slots/<array_job_id>/task-<task>.json   the free worker slots of an allocation of a pulling array
                                  waiting for a shard (a ``SlotsRecord``; gone when it has none)
    collections/<id>/             collection working area
    dataset/                      the final dataset (published atomically)
    report.html                   ``ddslurm report``: the run's timeline, rates, models, GPU-hours (default place)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddslurm.config._slurm_names import ArrayTask

LAYOUT_VERSION = 1


@dataclass(frozen=True, slots=True)
class AttemptLayout:
    dir: Path

    @property
    def record(self) -> Path:
        return self.dir / "attempt.json"

    @property
    def client_log(self) -> Path:
        return self.dir / "client.log"

    @property
    def output(self) -> Path:
        return self.dir / "output"

    @property
    def progress(self) -> Path:
        return self.dir / "progress.json"

    @property
    def candidate(self) -> Path:
        """A verified but short result, publishable only by ``ddslurm accept-partial``."""
        return self.dir / "candidate.json"

    @property
    def client_usage(self) -> Path:
        """What the attempt's client step used (:class:`~ddslurm.config.ClientUsage`), written when it ends."""
        return self.dir / "client-usage.json"

    @property
    def draining(self) -> Path:
        """Present while the attempt's shard drains in a pulling allocation (its last records in flight, its worker
        slot given to a spare): written and removed by the allocation's controller only, never by the client, so no
        writer of ``attempt.json`` races it. ``status`` shows such a shard ``draining``, not ``running``."""
        return self.dir / "draining"

    @property
    def hosted_requests(self) -> Path:
        """Every hosted request of the attempt's client runs, as sent and answered
        (:class:`~ddslurm.config.HostedRequest` lines)."""
        return self.dir / "hosted-requests.jsonl"


@dataclass(frozen=True, slots=True)
class ShardLayout:
    dir: Path
    index: int

    @property
    def winner(self) -> Path:
        return self.dir / "winner.json"

    @property
    def attempts(self) -> Path:
        return self.dir / "attempts"

    @property
    def fresh(self) -> Path:
        """Attempts a new attempt must not resume from (``ddslurm retry --fresh``): a ``FreshRecord``."""
        return self.dir / "fresh.json"

    def attempt(self, attempt_id: str) -> AttemptLayout:
        return AttemptLayout(self.attempts / attempt_id)

    @property
    def claims(self) -> Path:
        return self.dir / "claims"

    def claim(self, array_job_id: str) -> Path:
        """The claim of this shard by an allocation of pulling array ``array_job_id`` (a ``ClaimRecord``)."""
        return self.claims / f"{array_job_id}.json"

    @property
    def cancelled(self) -> Path:
        """``ddslurm cancel --shards`` of a shard of pulling allocations (a ``ShardCancelRecord``)."""
        return self.dir / "cancelled.json"

    def stage(self, index: int) -> ShardLayout:
        """The results of an earlier stage of a two-stage run (``stage-0/``: the GPU stage), laid out like the
        shard itself (winner.json, attempts/, claims/, fresh.json). The last stage uses the shard's own layout."""
        return ShardLayout(self.dir / f"stage-{index}", self.index)

    def cleared_cancel(self, stamp: str) -> Path:
        return self.dir / f"cancelled-cleared-{stamp}.json"

    @property
    def seed_order(self) -> Path:
        """The shard's block of a shuffled seed dataset in its fixed order (``seed_config.sampling_strategy:
        shuffle``), written once by the shard's first attempt; every attempt, resume, rerun and fill reads it."""
        return self.dir / "seed-order.parquet"

    def stage_seed(self, winner_attempt: str) -> Path:
        """The seed file a two-stage run's CPU stage reads: the rows of the GPU stage's winner (by the attempt
        that published it), written once, at one path for every CPU-stage attempt of the shard."""
        return self.dir / f"stage-seed-{winner_attempt}.parquet"


@dataclass(frozen=True, slots=True)
class RunLayout:
    root: Path

    @classmethod
    def in_workspace(cls, workspace: Path, run_id: str) -> RunLayout:
        return cls(workspace / "runs" / run_id)

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def plan(self) -> Path:
        return self.root / "run.json"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def recipe(self) -> Path:
        return self.inputs / "recipe.yaml"

    @property
    def recipe_source(self) -> Path:
        """The builder script the recipe was built by (``recipe: build.py``), kept for provenance; never run."""
        return self.inputs / "recipe-source.py"

    @property
    def snapshot(self) -> Path:
        return self.inputs / "snapshot.json"

    @property
    def seed_dir(self) -> Path:
        return self.inputs / "seed"

    @property
    def run_file(self) -> Path:
        return self.inputs / "run.yaml"

    @property
    def submissions(self) -> Path:
        return self.root / "submissions"

    @property
    def submit_plan(self) -> Path:
        """Every array of the run's submission (a ``SubmitPlanRecord``), written once before the first sbatch."""
        return self.root / "submit-plan.json"

    @property
    def submit_lock(self) -> Path:
        """Held while arrays of the run are being submitted, so that two submitters never submit the same array."""
        return self.root / ".submit.lock"

    def array_script(self, stamp: str, index: int) -> Path:
        """The batch script of array ``index`` of the submission made at ``stamp``."""
        return self.root / f"generate-{stamp}-{index:04d}.sbatch"

    @property
    def cancelled(self) -> Path:
        """The whole run was cancelled: an attempt that begins after this exists ends at once."""
        return self.root / "cancelled.json"

    @property
    def workflow_next(self) -> Path:
        """A workflow stage's run: the run that took the workflow's next stage (a ``WorkflowNext``, written once)."""
        return self.root / "workflow-next.json"

    @property
    def workflow_lock(self) -> Path:
        """Held while the workflow's next stage is being submitted from this run's dataset."""
        return self.root / ".workflow.lock"

    def cleared_cancel(self, stamp: str) -> Path:
        """Where ``retry --resume-cancelled`` moves the cancel record (kept, so the history stays readable)."""
        return self.root / f"cancelled-cleared-{stamp}.json"

    @property
    def script(self) -> Path:
        return self.root / "generate.sbatch"

    @property
    def collect_script(self) -> Path:
        return self.root / "collect.sbatch"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def batch_output(self, task: ArrayTask) -> Path:
        """Where Slurm writes array task ``task``'s batch output: ``logs/slurm-<array>_<task>.out``."""
        return self.logs / task.batch_output

    @property
    def budgets(self) -> Path:
        """One file a hosted key the run uses (:class:`~ddslurm.config.KeyBudgetState`): its shared budget."""
        return self.root / "budgets"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def collections(self) -> Path:
        return self.root / "collections"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    def shard(self, index: int) -> ShardLayout:
        return ShardLayout(self.shards / f"shard-{index:05d}", index)

    def stage_shard(self, index: int, stage: int | None) -> ShardLayout:
        """Where shard ``index``'s attempts, claims and winner of ``stage`` live: a two-stage run's GPU stage (0) in
        the shard's ``stage-0/``, the last (or only) stage (1, or None) in the shard's own directory."""
        shard = self.shard(index)
        return shard.stage(0) if stage == 0 else shard

    @property
    def allocations(self) -> Path:
        return self.root / "allocations"

    def allocation(self, job_id: str, restart: int = 0) -> Path:
        """A pulling allocation's own directory: its model servers' and proxies' logs, serving.json, endpoints.json.
        One per incarnation, named like its attempts (:func:`attempt_id_for`): a job that Slurm requeued keeps its
        id but serves anew (new servers, ports, token), so it never reads what the earlier incarnation left."""
        return self.allocations / (f"allocation-{job_id}" if restart == 0 else f"allocation-{job_id}-r{restart}")

    def slots(self, array_job_id: str) -> Path:
        """The free worker slots the allocations of a pulling array publish (``task-<task>.json`` each)."""
        return self.root / "slots" / array_job_id

    def slot_file(self, array_job_id: str, task: int) -> Path:
        """One allocation's free worker slots (a ``SlotsRecord``): array task ``task`` of ``array_job_id``."""
        return self.slots(array_job_id) / f"task-{task}.json"


def attempt_id_for(job_id: str, restart: int = 0) -> str:
    """The attempt directory name of a Slurm job (unique per cluster, so no counter is needed); a job that
    Slurm requeued gets a new attempt per restart."""
    return f"attempt-{job_id}" if restart == 0 else f"attempt-{job_id}-r{restart}"


def attempt_restart(attempt_id: str) -> int:
    """The restart of its Slurm job an attempt was begun in: the inverse of :func:`attempt_id_for` (0 for a first
    run)."""
    head, _, restart = attempt_id.rpartition("-r")
    return int(restart) if head and restart.isdigit() else 0


def calibration_file(serving_dir: Path) -> Path:
    """A ``ddslurm tune`` allocation's :class:`~ddslurm.config.Calibration` (its serving directory)."""
    return serving_dir / "calibration.json"


PROMPTS_KEPT = 256
"""The most request bodies a tune allocation's proxy records per alias (:func:`prompts_file`)."""


def prompts_file(serving_dir: Path, alias: str) -> Path:
    """The chat completion request bodies the proxy of ``alias`` forwarded in a ``ddslurm tune`` allocation (one
    JSON object a line, at most :data:`PROMPTS_KEPT`; never a header): what its calibration sweep replays."""
    return serving_dir / f"prompts-{alias}.jsonl"


def busy_log(serving_dir: Path, alias: str, replica: int) -> Path:
    """The spans in which replica ``replica`` (:attr:`ReplicaPlan.index`) of ``alias`` had requests in flight
    through the alias's proxy (:class:`BusySpan` lines), in a serving directory: a pulling allocation's
    (:meth:`RunLayout.allocation`), or a one-shard task's attempt directory."""
    return serving_dir / f"busy-{alias}-{replica}.jsonl"
