"""Why shards failed, as ``ddslurm retry`` weighs it before it submits anything: a key the provider still refuses
(``key_refused``, asked again with the endpoint check of ``submit --check-endpoints``), a failure the run's frozen
plan would repeat (:data:`FROZEN_PLAN`), and what each new attempt would resume (``retry --dry-run``'s preview, as
the runtime seeds an attempt: :func:`ddslurm.runtime.next_resume`).

``status`` and ``wait`` say the same of a failure the plan would repeat (:func:`frozen_hints`), so the way out they
name is the one ``retry`` would insist on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ddslurm.config import AttemptRecord, ConfigError, Plan, ProviderSnapshot, RunLayout, read_json, read_plan
from ddslurm.launcher.errors import RetryRefusedError
from ddslurm.launcher.runs._records import attempt_records, shards_named
from ddslurm.launcher.runs._status_model import RunStatus, ShardStatus

if TYPE_CHECKING:
    from ddslurm.launcher.submission._aliases import EndpointCheck


@dataclass(frozen=True, slots=True)
class FrozenFailure:
    """A failure that every attempt of the same run repeats: what caused it is fixed in the run's plan (or its
    inputs), which ``retry`` never changes."""

    frozen: str
    """What the plan fixes that made the attempt fail."""
    way_out: str
    """What to do instead of a retry."""
    unless_resumed: bool = False
    """Repeated only while a new attempt would start from nothing: an attempt that had the whole time limit to itself
    (its own array task, not a pulling allocation's remainder) and left no batch a new attempt continues. A retry
    that resumes saved batches gets further than the attempt before it."""


_SUBMIT_AGAIN = "fix the run file and submit it again (`ddslurm submit RUN_FILE`; the run's copy is {run_file})"

_OUT_OF_TIME = FrozenFailure(
    "submission.time_limit is frozen in the plan and the shard saved no batch a new attempt continues (a batch is "
    "buffer_size records), so a new attempt starts from nothing with the same time",
    "raise submission.time_limit, use more shards or a smaller buffer_size in the run file and submit it again "
    "(`ddslurm submit RUN_FILE`; the run's copy is {run_file})",
    unless_resumed=True,
)
"""``time_limit`` (the attempt stopped at Slurm's warning) and ``timeout`` (Slurm ended the task first)."""

FROZEN_PLAN: Mapping[str, FrozenFailure] = {
    "server_start_failed": FrozenFailure(
        "the model servers' command lines (the model, server.extra_args, server.env, the container image) are frozen "
        "in the plan, so every new attempt starts the same servers",
        _SUBMIT_AGAIN + "; `ddslurm logs {run} --step server` shows why the server exited",
    ),
    "server_not_ready": FrozenFailure(
        "server.startup_timeout is frozen in the plan, so every new attempt waits as long for the servers",
        "raise server.startup_timeout in the run file and submit it again (`ddslurm submit RUN_FILE`; the run's copy "
        "is {run_file}); `ddslurm logs {run} --step server` shows how far the server got",
    ),
    "recipe_invalid": FrozenFailure(
        "the recipe is frozen in the run directory (inputs/recipe.yaml), so Data Designer on the nodes refuses every "
        "new attempt the same way",
        _SUBMIT_AGAIN + "; if the cause was the nodes' python_env (its Data Designer or a plugin) and that is fixed "
        "now, `ddslurm retry {run} --force` retries anyway",
    ),
    "out_of_memory": FrozenFailure(
        "the memory each task asks Slurm for (submission.memory, the profile's memory_per_gpu) is frozen in the plan",
        "raise submission.memory in the run file (or use more shards) and submit it again (`ddslurm submit "
        "RUN_FILE`; the run's copy is {run_file})",
    ),
    "time_limit": _OUT_OF_TIME,
    "timeout": _OUT_OF_TIME,
}
"""The failures that a new attempt of the same run repeats, by reason code (``docs/reasons.md``), and what to do
instead. ``retry`` refuses a retry of only such shards unless forced (``--force``: the cause may have been outside
the plan, a node's disk, another user's port, a ``python_env`` fixed since) and names the ones of a mix; ``status``
and ``wait`` say so under the shard table. ``key_refused`` is not here: the key is read from the retrying shell, so
``retry`` asks the provider whether it still refuses it instead. ``inputs_invalid`` is not either: restoring the
file the message names is the way out, and a retry then runs. Nor ``server_killed``: a server killed by a signal
before it was ready (``kill``, the OOM killer) was ended from outside its command line."""


def _cause(layout: RunLayout, plan: Plan, status: ShardStatus) -> tuple[str | None, AttemptRecord | None]:
    """Why the shard's last attempt of the stage it is in failed, and its record: through ``not_retried`` (an
    automatic retry that started nothing) to the failure it did not retry after."""
    stage = _stage(plan, status)
    records = attempt_records(layout, status.shard, stage)
    latest = records[-1] if records else None
    if status.reason != "not_retried":
        return status.reason, latest
    ended = sorted((r for r in records if r.ended_at and r.reason != "not_retried"), key=lambda r: r.ended_at or "")
    return (ended[-1].reason, ended[-1]) if ended else (status.reason, latest)


def _stage(plan: Plan, status: ShardStatus) -> int | None:
    """The stage whose attempts ``status`` shows: None for a one-stage run, 0 for a GPU stage, 1 for a CPU stage."""
    if len(plan.stages) <= 1:
        return None
    return 0 if status.stage == "gpu" else 1


def retry_stage(layout: RunLayout, plan: Plan, shard: int) -> int | None:
    """The stage a retry of ``shard`` runs: None for a one-stage run; 1 (CPU) once its GPU stage has a result, else
    0 (GPU), as ``retry`` submits it."""
    if len(plan.stages) <= 1:
        return None
    return 1 if layout.shard(shard).stage(0).winner.exists() else 0


def resumed_rows(layout: RunLayout, plan: Plan, shard: int, *, fresh: bool = False) -> tuple[int, str | None]:
    """The rows a new attempt of ``shard`` would continue, and the attempt they are from (None: none), as the
    runtime would seed it; ``fresh``: none (``retry --fresh`` excludes every earlier attempt)."""
    from ddslurm.runtime import next_resume

    if fresh:
        return 0, None
    source = next_resume(layout, plan, shard, retry_stage(layout, plan, shard))
    return (source.rows, source.dataset.parent.parent.name) if source is not None else (0, None)


@dataclass(frozen=True, slots=True)
class Repeated:
    """Shards whose last failure a retry would repeat, by the reason they failed with."""

    reason: str
    shards: tuple[int, ...]
    why: FrozenFailure

    def text(self, layout: RunLayout) -> str:
        """One sentence a user acts on: the shards, why a retry would fail the same way, and the way out."""
        way_out = self.why.way_out.format(run_file=layout.run_file, run=layout.root)
        return (
            f"{shards_named(self.shards)} failed with {self.reason}, and a retry would fail the same way: "
            f"{self.why.frozen}; {way_out}"
        )


def repeated_failures(
    layout: RunLayout, plan: Plan, shards: Sequence[ShardStatus], *, fresh: bool = False
) -> list[Repeated]:
    """Of ``shards`` (failed ones count), those whose failure a new attempt of the run repeats (:data:`FROZEN_PLAN`),
    grouped by reason in the table's order."""
    found: dict[str, list[int]] = {}
    for status in shards:
        if status.state != "failed":
            continue
        reason, record = _cause(layout, plan, status)
        why = FROZEN_PLAN.get(reason or "")
        if why is None or reason is None:
            continue
        if why.unless_resumed:
            shared = record is not None and record.allocation is not None  # a pulling allocation's remainder
            if shared or resumed_rows(layout, plan, status.shard, fresh=fresh)[0] > 0:
                continue
        found.setdefault(reason, []).append(status.shard)
    return [Repeated(r, tuple(found[r]), FROZEN_PLAN[r]) for r in FROZEN_PLAN if r in found]


def frozen_hints(status: RunStatus) -> list[str]:
    """What ``status`` and ``wait`` say under the shard table of failures a retry would repeat (none: nothing). The
    run's plan and attempts are read only when a shard failed with a reason of :data:`FROZEN_PLAN` (or
    ``not_retried``)."""
    failed = [
        s for s in status.shards if s.state == "failed" and (s.reason in FROZEN_PLAN or s.reason == "not_retried")
    ]
    if not failed:
        return []
    layout = RunLayout(Path(status.run_dir))
    try:
        plan = read_plan(layout.plan)
    except (ConfigError, OSError):
        return []
    return [f"a retry would fail the same way: {r.text(layout)}" for r in repeated_failures(layout, plan, failed)]


def refuse_repeated(layout: RunLayout, repeated: list[Repeated], todo: Sequence[int], *, force: bool) -> list[str]:
    """A :class:`RetryRefusedError` when every shard of ``todo`` would fail the same way (unless ``force``); else the
    warnings that name the ones of a mix (and of a forced retry)."""
    if not repeated:
        return []
    same = sorted(s for r in repeated for s in r.shards)
    lines = [r.text(layout) for r in repeated]
    if len(same) == len(todo) and not force:
        raise RetryRefusedError(
            "nothing was submitted: " + "\n  ".join(lines) + f"\n  (`ddslurm retry {layout.root} --force` retries "
            "anyway, for a cause outside the plan that is gone now)"
        )
    if force and len(same) == len(todo):
        return [f"--force: {line}" for line in lines]
    return [f"{line} (retried with the others; --shards leaves them out)" for line in lines]


# --- a key the provider refused ---


@dataclass(frozen=True, slots=True)
class KeyAnswer:
    """What a provider answered now to the key the retrying shell holds."""

    provider: str
    key_env: str | None
    endpoint: str
    answer: str
    """The endpoint check's result (``ok``, ``key refused (HTTP 401)``, ``unreachable: ...``)."""

    @property
    def refused(self) -> bool:
        return self.answer.startswith(("key refused", "a key is required"))


def key_refused_shards(layout: RunLayout, plan: Plan, shards: Sequence[ShardStatus]) -> tuple[int, ...]:
    """Of ``shards``, the failed ones whose last attempt ended ``key_refused`` (an automatic retry's ``not_retried``
    after one included)."""
    return tuple(s.shard for s in shards if s.state == "failed" and _cause(layout, plan, s)[0] == "key_refused")


def ask_keys(snapshot: ProviderSnapshot, env: Mapping[str, str], check: EndpointCheck) -> list[KeyAnswer]:
    """Each hosted provider of the run's frozen snapshot asked with the key of this shell (one request per provider,
    the endpoint check of ``submit --check-endpoints``); never the key's value in what it returns."""
    from ddslurm.providers import snapshot_resolution

    checked = check(snapshot_resolution(snapshot, env), env)
    answers: dict[str, KeyAnswer] = {}
    for row in checked.rows:
        if row.check is not None and row.provider not in answers:
            answers[row.provider] = KeyAnswer(row.provider, row.key_env, row.endpoint, row.check)
    return list(answers.values())


def check_refused_keys(
    layout: RunLayout, env: Mapping[str, str], refused: tuple[int, ...], check: EndpointCheck
) -> list[str]:
    """After shards ``refused`` ended ``key_refused``: a :class:`RetryRefusedError` while a provider of the run still
    refuses the key this shell holds (naming the variable and the provider, never the value); else warnings for the
    providers that could not be asked (the retry goes on, as before)."""
    answers = ask_keys(read_json(layout.snapshot, ProviderSnapshot), env, check)
    still = [a for a in answers if a.refused]
    if still:
        said = "; ".join(
            f"provider {a.provider!r} ({a.endpoint}) still refuses "
            + (f"the key in {a.key_env}" if a.key_env else "requests without a key")
            + f": {a.answer}"
            for a in still
        )
        names = sorted({a.key_env for a in still if a.key_env})
        export = f"export the right key in {', '.join(names)} in this shell" if names else "give the provider a key"
        raise RetryRefusedError(
            f"{shards_named(refused)} failed with key_refused, and {said}; nothing was submitted: {export}, then "
            f"`ddslurm retry {layout.root}` again (`ddslurm providers RUN_FILE --check` asks every endpoint)"
        )
    return [
        f"could not ask provider {a.provider!r} whether it takes the key in {a.key_env} now ({a.answer}); "
        f"retrying {shards_named(refused)} as asked"
        for a in answers
        if a.answer != "ok" and not a.answer.startswith(("not checked", "model not listed"))
    ]


# --- retry --dry-run's preview ---


@dataclass(frozen=True, slots=True)
class RetryPreview:
    """What a retry would do for one shard (``retry --dry-run``)."""

    shard: int
    attempt: int
    """The attempt the retry makes, counted from 1 as ``status`` counts the shard's attempts (of that stage)."""
    stage: Literal["gpu", "cpu"] | None
    """The stage it runs (two-stage runs); None for a one-stage run."""
    resume: Literal["if_possible", "always", "never", "fresh"]
    """How it starts: the run's resume mode, or ``fresh`` (``--fresh``: no earlier batch continued)."""
    resume_rows: int
    """The rows it would continue from an earlier attempt's saved batches (0: it starts from nothing)."""
    resume_from: str | None
    """The attempt those rows are from."""
    repeats: str | None = None
    """The reason it failed with, when the retry would fail the same way (:data:`FROZEN_PLAN`)."""


def preview(
    layout: RunLayout, plan: Plan, todo: Sequence[int], repeated: list[Repeated], *, fresh: bool
) -> tuple[RetryPreview, ...]:
    """Each shard of ``todo``: the attempt a retry makes, the rows it resumes (from the batches on disk, as the
    runtime would) and how it starts."""
    same = {s: r.reason for r in repeated for s in r.shards}
    out = []
    for shard in todo:
        stage = retry_stage(layout, plan, shard)
        rows, source = resumed_rows(layout, plan, shard, fresh=fresh)
        out.append(
            RetryPreview(
                shard=shard,
                attempt=len(attempt_records(layout, shard, stage)) + 1,
                stage=None if stage is None else ("gpu" if stage == 0 else "cpu"),
                resume="fresh" if fresh else plan.resume,
                resume_rows=rows,
                resume_from=source,
                repeats=same.get(shard),
            )
        )
    return tuple(out)


def preview_lines(previews: Sequence[RetryPreview]) -> list[str]:
    """``retry --dry-run``'s lines, one a shard: ``shard 2: attempt 3, resumes 40 rows of attempt-4243
    (if_possible)``."""
    lines = []
    for p in previews:
        stage = f" ({p.stage} stage)" if p.stage else ""
        if p.resume_rows:
            how = f"resumes {p.resume_rows} rows of {p.resume_from} (resume: {p.resume})"
        elif p.resume == "fresh":
            how = "starts from nothing (--fresh)"
        elif p.resume == "never":
            how = "starts from nothing (resume: never)"
        else:
            how = f"starts from nothing: no saved batch to resume (resume: {p.resume})"
        same = f"; would fail the same way ({p.repeats})" if p.repeats else ""
        lines.append(f"  shard {p.shard}{stage}: attempt {p.attempt}, {how}{same}")
    return lines
