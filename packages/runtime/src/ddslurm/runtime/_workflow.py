"""A builder that returns a Data Designer workflow (``DataDesigner.compose_workflow``): the stage a run is.

Each stage of the workflow is a ddslurm run of its own (``config._workflow``). Here, in ``python_env``, the
workflow the builder returned gives the config of one stage: the stage's builder, and for a stage after the first
the seed Data Designer's own ``CompositeWorkflow.run`` gives it, the Parquet files of the stage before
(``LocalFileSeedSource`` of ``<dataset>/*.parquet``) with the stage's sampling and selection strategies. What a
stage may add that no sharded run can do as Data Designer does is refused, saying why (:func:`unshardable`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddslurm.config import WorkflowShape, WorkflowStage
from ddslurm.runtime.errors import BuilderFailure


def is_workflow(value: Any) -> bool:
    """Whether a builder returned a Data Designer workflow (``CompositeWorkflow``; Data Designer >= 0.9)."""
    try:
        from data_designer.interface.composite_workflow import CompositeWorkflow
    except ImportError:
        return False
    return isinstance(value, CompositeWorkflow)


def _stages(workflow: Any) -> list[Any]:
    """The workflow's stages in order (Data Designer keeps them as ``_stages``; no public accessor exists)."""
    stages = getattr(workflow, "_stages", None)
    if not isinstance(stages, list):
        raise BuilderFailure("returned a workflow whose stages this Data Designer does not expose")
    return stages


def unshardable(stage: Any) -> str | None:
    """Why a stage cannot run as ddslurm runs a stage (sharded, each shard's rows those of the whole), or None."""
    if stage.on_success is not None:
        return (
            "on_success runs a function of yours over the stage's whole output on the machine that runs the "
            "workflow; ddslurm generates each stage in shards on the nodes and has no such place: turn it into a "
            "processor or a column of the stage (or of the next stage)"
        )
    if stage.output_processors:
        return (
            "output_processors run over the stage's whole output after it is made; ddslurm collects the stage's "
            "dataset from its shards and feeds it on as it is: add them as processors of the next stage's builder"
        )
    if stage.output != "final":
        return (
            f"output={stage.output!r} feeds a processor's artifact to the next stage; ddslurm collects and feeds "
            "the stage's final dataset (output='final')"
        )
    return None


def shape(workflow: Any) -> WorkflowShape:
    """The workflow as the submit host needs it: its name, and each stage's name, records and ``allow_empty``."""
    return WorkflowShape(
        name=str(workflow.name),
        stages=tuple(
            WorkflowStage(name=s.name, num_records=s.num_records, allow_empty=bool(s.allow_empty))
            for s in _stages(workflow)
        ),
    )


def stage_of(workflow: Any, index: int) -> Any:
    """Stage ``index`` of the workflow (Data Designer's ``_WorkflowStage``); :class:`BuilderFailure` saying why for
    a workflow with a stage that cannot be sharded, or without that stage."""
    stages = _stages(workflow)
    if not stages:
        raise BuilderFailure(f"returned workflow {workflow.name!r} with no stage (add one with add_stage)")
    if not 0 <= index < len(stages):
        raise BuilderFailure(f"returned workflow {workflow.name!r} with {len(stages)} stage(s), none at {index + 1}")
    for number, stage in enumerate(stages, 1):
        why = unshardable(stage)
        if why is not None:
            raise BuilderFailure(f"workflow {workflow.name!r}, stage {number} {stage.name!r}: {why}")
    return stages[index]


def stage_builder(workflow: Any, index: int, seed: str | None) -> Any:
    """The config builder of stage ``index`` (:func:`stage_of`), seeded from ``seed`` (the previous stage's
    dataset directory) as Data Designer's ``CompositeWorkflow.run`` seeds it; :class:`BuilderFailure` for a seed
    that is missing, or given to the first stage."""
    from data_designer.interface import composite_workflow as cw

    stage = stage_of(workflow, index)
    builder = cw._clone_config_builder(stage.config_builder)
    if index == 0:
        if seed is not None:
            raise BuilderFailure("the first stage of a workflow reads no earlier stage's dataset")
        return builder
    if seed is None:
        raise BuilderFailure(f"stage {index + 1} {stage.name!r} needs the dataset of the stage before it")
    builder.with_seed_dataset(
        cw._local_seed_source_from_path(Path(seed)),
        sampling_strategy=stage.sampling_strategy,
        selection_strategy=stage.selection_strategy,
    )
    return builder
