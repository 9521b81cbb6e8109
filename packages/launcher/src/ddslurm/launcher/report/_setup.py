"""How a run was set up, for its report (:func:`configuration`): the run file as submitted, the layout the planner
chose (allocations, shards, client workers, batches, resources, deployments, stages) and the versions of ddslurm
and Data Designer it was planned with."""

from __future__ import annotations

from ddslurm.launcher.report._model import Deployment, RunConfiguration
from ddslurm.launcher.report._read import RunFacts


def configuration(facts: RunFacts) -> RunConfiguration:
    plan = facts.plan
    serving = plan.serving
    return RunConfiguration(
        run_file=facts.run_file,
        recipe=plan.recipe_file,
        records=plan.num_records,
        shards=len(plan.shards),
        allocations=plan.allocations,
        client_workers=plan.client_workers,
        buffer_size=plan.buffer_size,
        partition=plan.generation.partition,
        time_minutes=plan.generation.time_minutes,
        cpus_per_task=plan.generation.cpus_per_task,
        gpus=serving.gpus if serving is not None else 0,
        stages=[s.kind for s in plan.stages],
        cpu_stage_workers=plan.cpu_stage_workers if plan.stages else None,
        deployments=[
            Deployment(alias=d.alias, model=d.model, replicas=len(d.replicas), gpus_per_replica=d.replica_gpus)
            for d in (serving.deployments if serving is not None else ())
        ],
        ddslurm_version=plan.ddslurm_version,
        data_designer_version=plan.data_designer_version,
    )
