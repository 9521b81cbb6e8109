"""The planner: time limits, record splitting and the pure compilation of a hosted-only plan."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import itertools
import math
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    AliasSpend,
    Batching,
    ClusterProfile,
    Collection,
    Deployment,
    Plan,
    ProviderSnapshot,
    RecipeColumn,
    Resources,
    RunFile,
    RunLayout,
    ServerSpec,
    ShardSpec,
    SnapshotModel,
    SnapshotProvider,
    SpendForecast,
    StagePlan,
    Submission,
    digest,
    encode,
    load_profile,
    load_run_file,
)
from ddslurm.planner import (
    VLLM_DEFAULT_MAX_NUM_SEQS,
    PlanError,
    PlanInputs,
    compile_plan,
    parse_time_limit,
    plan_shards,
    server_capacity,
)
from ddslurm.planner._batches import CHECKPOINT_S, CHECKPOINTS_PER_SHARD, DD_DEFAULT_BUFFER_SIZE

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

REPO = Path(__file__).resolve().parents[3]
LAYOUT = RunLayout.in_workspace(Path("/ws"), "run-1")
SNAPSHOT = ProviderSnapshot(
    providers=(
        SnapshotProvider(name="zeta", endpoint="https://z/v1", api_key_env="ZETA_API_KEY"),
        SnapshotProvider(name="alpha", endpoint="https://a/v1", api_key_env="ALPHA_API_KEY"),
        SnapshotProvider(name="open", endpoint="http://o/v1"),
    ),
    models=(SnapshotModel(alias="gen", model="m", provider="zeta"),),
)


def make_run(**overrides: object) -> RunFile:
    fields: dict[str, object] = {"name": "demo", "recipe": "recipe.yaml", "num_records": 100}
    fields.update(overrides)
    return RunFile(**fields)  # type: ignore[arg-type]


def make_profile(**overrides: object) -> ClusterProfile:
    fields: dict[str, object] = {"workspace": "/ws", "python_env": "/venv"}
    fields.update(overrides)
    return ClusterProfile(**fields)  # type: ignore[arg-type]


def make_inputs(
    run: RunFile | None = None,
    profile: ClusterProfile | None = None,
    snapshot: ProviderSnapshot = SNAPSHOT,
) -> PlanInputs:
    return PlanInputs(
        run=run or make_run(),
        profile=profile or make_profile(),
        snapshot=snapshot,
        layout=LAYOUT,
        recipe_sha256="1" * 64,
        snapshot_sha256="2" * 64,
    )


# --- parse_time_limit ---


@pytest.mark.parametrize(
    ("value", "minutes"),
    [
        pytest.param(90, 90, id="int-minutes"),
        pytest.param(1, 1, id="int-one-minute"),
        pytest.param("90", 90, id="str-minutes"),
        pytest.param(" 45 ", 45, id="surrounding-space"),
        pytest.param("1:30:00", 90, id="h-mm-ss"),
        pytest.param("01:00:00", 60, id="hh-mm-ss"),
        pytest.param("12:00:00", 720, id="twelve-hours"),
        pytest.param("2-00:00:00", 2880, id="days-hh-mm-ss"),
        pytest.param("1-2", 1440 + 120, id="days-hours"),
        pytest.param("1-02:30", 1440 + 150, id="days-hh-mm"),
        pytest.param("0-00:00:01", 1, id="days-seconds-round-up"),
        pytest.param("00:00:30", 1, id="thirty-seconds-rounds-up"),
        pytest.param("00:01:01", 2, id="one-second-over-rounds-up"),
        pytest.param("00:01:00", 1, id="exact-minute"),
        pytest.param("10:30", 11, id="mm-ss-ten-minutes-thirty-seconds"),
        pytest.param("10:00", 10, id="mm-ss-exact"),
        pytest.param("0:59", 1, id="mm-ss-under-a-minute"),
    ],
)
def test_parse_time_limit(value: str | int, minutes: int) -> None:
    assert parse_time_limit(value) == minutes


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("", "is not a Slurm time", id="empty"),
        pytest.param("abc", "is not a Slurm time", id="word"),
        pytest.param("1h", "is not a Slurm time", id="unit-suffix"),
        pytest.param("1.5", "is not a Slurm time", id="decimal"),
        pytest.param("-5", "is not a Slurm time", id="negative-string"),
        pytest.param("1:2:3:4", "is not a Slurm time", id="four-fields"),
        pytest.param("1-", "is not a Slurm time", id="dangling-day"),
        pytest.param("1:", "is not a Slurm time", id="dangling-colon"),
        pytest.param("UNLIMITED", "is not a Slurm time", id="unlimited"),
        pytest.param("0", "shorter than one minute", id="zero-string"),
        pytest.param("00:00:00", "shorter than one minute", id="zero-hms"),
        pytest.param(0, "at least 1 minute", id="zero-int"),
        pytest.param(-3, "at least 1 minute", id="negative-int"),
    ],
)
def test_parse_time_limit_rejects(value: str | int, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_time_limit(value)


# --- plan_shards ---


@pytest.mark.parametrize(
    ("total", "shards", "sizes"),
    [
        pytest.param(10, 1, [10], id="one-shard"),
        pytest.param(10, 2, [5, 5], id="even"),
        pytest.param(10, 3, [4, 3, 3], id="remainder-goes-first"),
        pytest.param(7, 7, [1] * 7, id="one-record-each"),
        pytest.param(40, 6, [7, 7, 7, 7, 6, 6], id="forty-by-six"),
        pytest.param(1, 1, [1], id="single-record"),
    ],
)
def test_plan_shards_sizes(total: int, shards: int, sizes: list[int]) -> None:
    specs = plan_shards(total, shards)
    assert [s.num_records for s in specs] == sizes


@pytest.mark.parametrize(
    ("total", "shards"),
    [(1, 1), (10, 3), (100, 7), (1000, 999), (12345, 64), (5, 5), (1_000_000, 1000)],
)
def test_plan_shards_invariants(total: int, shards: int) -> None:
    specs = plan_shards(total, shards)

    assert len(specs) == shards
    assert [s.index for s in specs] == list(range(shards))
    sizes = [s.num_records for s in specs]
    assert sum(sizes) == total
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1
    assert specs[0].first_record == 0
    for prev, nxt in itertools.pairwise(specs):
        assert nxt.first_record == prev.first_record + prev.num_records
    assert specs[-1].first_record + specs[-1].num_records == total


@pytest.mark.parametrize(
    ("total", "shards", "message"),
    [
        pytest.param(3, 4, r"shards \(4\) exceeds num_records \(3\)", id="more-shards-than-records"),
        pytest.param(0, 1, r"shards \(1\) exceeds num_records \(0\)", id="no-records"),
        pytest.param(5, 0, r"shards must be at least 1, got 0", id="zero-shards"),
        pytest.param(5, -1, r"shards must be at least 1, got -1", id="negative-shards"),
    ],
)
def test_plan_shards_rejects(total: int, shards: int, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_shards(total, shards)


# --- compile_plan ---


def test_hosted_only_plan() -> None:
    run = make_run(
        num_records=40,
        shards=2,
        buffer_size=10,
        resume="always",
        submission=Submission(
            account="acct",
            qos="normal",
            time_limit="00:20:00",
            memory="2G",
            cpus=2,
            constraint="intel",
            reservation="resv",
            extra_sbatch=("--exclusive",),
        ),
        collection=Collection(memory="1G", time_limit="00:10:00", cpus=3),
    )
    profile = make_profile(partition="gpu", cpu_partition="cpu", extra_sbatch=("--comment=ddslurm",))

    plan = compile_plan(make_inputs(run, profile))

    assert plan == Plan(
        run_id="run-1",
        run_name="demo",
        num_records=40,
        shards=(
            ShardSpec(index=0, first_record=0, num_records=20),
            ShardSpec(index=1, first_record=20, num_records=20),
        ),
        resume="always",
        buffer_size=10,
        batching=Batching(by="run file", rule="buffer_size 10 from the run file", shard_records=20, batches=2),
        recipe_file="/ws/runs/run-1/inputs/recipe.yaml",
        recipe_sha256="1" * 64,
        snapshot_file="/ws/runs/run-1/inputs/snapshot.json",
        snapshot_sha256="2" * 64,
        ddslurm_version=importlib.metadata.version("ddslurm-planner"),  # recorded for the report
        secret_env=("ALPHA_API_KEY", "ZETA_API_KEY"),
        python_env="/venv",
        generation=Resources(
            partition="cpu",
            account="acct",
            qos="normal",
            time_minutes=20,
            nodes=1,
            cpus_per_task=2,
            memory="2G",
            gres="none",
            gpus=None,
            constraint="intel",
            reservation="resv",
            extra_sbatch=("--comment=ddslurm", "--exclusive"),
        ),
        collection=Resources(
            partition="cpu",
            account="acct",
            time_minutes=10,
            cpus_per_task=3,
            memory="1G",
            gres="none",
            extra_sbatch=("--comment=ddslurm",),
        ),
        client_cpus=2,
        serving=None,
        # no earlier run of the recipe: its hosted alias's spend is not predicted; no GPUs, so none of them
        spend=SpendForecast(
            records=40,
            hosted=(AliasSpend(alias="gen", model="m", provider="zeta"),),
            gpu_hours=0.0,
            cpu_hours=0.0,
        ),
    )


def test_hosted_limits_reach_the_plan_for_providers_the_run_uses_and_others_are_refused_at_their_field() -> None:
    from ddslurm.config import HostedLimit

    limit = HostedLimit(in_flight=16, requests_per_minute=120)
    assert compile_plan(make_inputs(make_run(hosted_limits={"zeta": limit}))).hosted_limits == {"zeta": limit}
    with pytest.raises(PlanError, match=r"^hosted_limits\.zeta-typo: no hosted alias .* uses: alpha, open, zeta\)"):
        compile_plan(make_inputs(make_run(hosted_limits={"zeta-typo": limit})))


def test_gres_is_none_for_every_job() -> None:
    plan = compile_plan(make_inputs(profile=make_profile(gpus_per_node=8, partition="gpu")))
    assert (plan.generation.gres, plan.collection.gres) == ("none", "none")
    assert (plan.generation.gpus, plan.collection.gpus) == (None, None)


@pytest.mark.parametrize(
    ("submission", "collection", "cpu_partition", "partition", "want_generation", "want_collection"),
    [
        pytest.param("sub", "col", "cpu", "gpu", "sub", "col", id="run-file-wins"),
        pytest.param(None, None, "cpu", "gpu", "cpu", "cpu", id="profile-cpu-partition"),
        pytest.param(None, None, None, "gpu", "gpu", "gpu", id="profile-partition"),
        pytest.param(None, None, None, None, None, None, id="cluster-default"),
        pytest.param("sub", None, None, "gpu", "sub", "gpu", id="collection-does-not-inherit-submission"),
    ],
)
def test_partition_fallback(
    submission: str | None,
    collection: str | None,
    cpu_partition: str | None,
    partition: str | None,
    want_generation: str | None,
    want_collection: str | None,
) -> None:
    run = make_run(submission=Submission(partition=submission), collection=Collection(partition=collection))
    profile = make_profile(cpu_partition=cpu_partition, partition=partition)

    plan = compile_plan(make_inputs(run, profile))

    assert plan.generation.partition == want_generation
    assert plan.collection.partition == want_collection


@pytest.mark.parametrize(
    ("run_account", "profile_account", "want"),
    [
        pytest.param("mine", "site", "mine", id="run-file-wins"),
        pytest.param(None, "site", "site", id="profile-default"),
        pytest.param(None, None, None, id="none"),
    ],
)
def test_account_fallback(run_account: str | None, profile_account: str | None, want: str | None) -> None:
    plan = compile_plan(
        make_inputs(make_run(submission=Submission(account=run_account)), make_profile(account=profile_account))
    )
    assert (plan.generation.account, plan.collection.account) == (want, want)


@pytest.mark.parametrize(
    ("snapshot", "want"),
    [
        pytest.param(SNAPSHOT, ("ALPHA_API_KEY", "ZETA_API_KEY"), id="sorted-names"),
        pytest.param(ProviderSnapshot(), (), id="no-providers"),
        pytest.param(
            ProviderSnapshot(
                providers=(
                    SnapshotProvider(name="a", endpoint="e", api_key_env="SHARED_KEY"),
                    SnapshotProvider(name="b", endpoint="e", api_key_env="SHARED_KEY"),
                )
            ),
            ("SHARED_KEY",),
            id="shared-name-once",
        ),
    ],
)
def test_secret_env_equals_the_snapshot_key_names(snapshot: ProviderSnapshot, want: tuple[str, ...]) -> None:
    plan = compile_plan(make_inputs(snapshot=snapshot))
    assert plan.secret_env == want == snapshot.secret_env_names()


@pytest.mark.parametrize(
    ("buffer_size", "num_records", "want"),
    [
        pytest.param(1000, 40, 40, id="capped-at-num-records"),
        pytest.param(10, 40, 10, id="smaller-kept"),
        pytest.param(40, 40, 40, id="equal"),
    ],
)
def test_buffer_size_is_capped_at_num_records(buffer_size: int, num_records: int, want: int) -> None:
    plan = compile_plan(make_inputs(make_run(buffer_size=buffer_size, num_records=num_records)))
    assert plan.buffer_size == want


@pytest.mark.parametrize(
    ("generation", "collection", "want"),
    [
        pytest.param("01:00:00", "00:30:00", (60, 30), id="defaults"),
        pytest.param(90, "10:30", (90, 11), id="int-and-mm-ss"),
        pytest.param("1-00:00:00", 5, (1440, 5), id="days"),
    ],
)
def test_time_limits_in_minutes(generation: str | int, collection: str | int, want: tuple[int, int]) -> None:
    run = make_run(submission=Submission(time_limit=generation), collection=Collection(time_limit=collection))
    plan = compile_plan(make_inputs(run))
    assert (plan.generation.time_minutes, plan.collection.time_minutes) == want


def test_bad_time_limit_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="'soon' is not a Slurm time"):
        compile_plan(make_inputs(make_run(submission=Submission(time_limit="soon"))))


def test_more_shards_than_records_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match=r"shards: 5 shards for 4 records"):
        compile_plan(make_inputs(make_run(num_records=4, shards=5)))


def _gpu_profile(**overrides: object) -> ClusterProfile:
    fields: dict[str, object] = {"partition": "gpu", "cpu_partition": "cpu", "gpus_per_node": 4}
    fields.update(overrides)
    return make_profile(**fields)


def test_mixed_run_gets_one_gpu_node_with_replicas_on_distinct_gpus() -> None:
    run = make_run(
        deployments=(Deployment(model_alias="gen", model="org/gen", replicas=2, tensor_parallel=2),),
        submission=Submission(cpus=3),
    )
    plan = compile_plan(make_inputs(run, _gpu_profile()))
    assert plan.serving is not None
    gen = plan.serving.deployments[0]
    assert (gen.alias, gen.served_model_name, gen.proxy) == ("gen", "org/gen", True)
    assert [(r.index, r.gpus, r.port) for r in gen.replicas] == [(0, 2, None), (1, 2, None)]
    res = plan.generation
    assert (res.partition, res.gres, res.gpus, res.nodes) == ("gpu", "gpu:4", None, 1)
    assert res.cpus_per_task == 3 + 2 * 4 + 1  # client + two replicas of 4 CPUs + one proxy
    assert plan.client_cpus == 3


def test_a_single_replica_is_behind_its_proxy_on_a_unix_socket_and_gpus_mode_uses_gpus_flag() -> None:
    """vLLM serves /invocations, /tokenize, /pooling... without its API key: the proxy, which wants the token on
    every route, is the only way in, and the replica listens where no other user can connect."""
    run = make_run(deployments=(Deployment(model_alias="gen", model="m", served_model_name="s"),))
    plan = compile_plan(make_inputs(run, _gpu_profile(gpu_request="gpus")))
    assert plan.serving is not None
    dep = plan.serving.deployments[0]
    assert (dep.proxy, dep.listen) == (True, "unix")
    assert plan.generation.cpus_per_task == run.submission.cpus + dep.replicas[0].cpus + plan.serving.proxy_cpus
    assert (plan.generation.gres, plan.generation.gpus) == ("none", 1)


def test_two_deployments_share_the_node_and_explicit_ports_are_kept() -> None:
    run = make_run(
        deployments=(
            Deployment(model_alias="gen", model="g", replicas=1, tensor_parallel=2, server=ServerSpec(port=8100)),
            Deployment(model_alias="judge", model="j", replicas=2, tensor_parallel=1),
        )
    )
    plan = compile_plan(make_inputs(run, _gpu_profile()))
    assert plan.serving is not None and plan.serving.gpus == 4
    assert [r.port for r in plan.serving.deployments[0].replicas] == [8100]
    assert [(d.listen, d.proxy) for d in plan.serving.deployments] == [("tcp", True), ("unix", True)]


@pytest.mark.parametrize(
    ("extra_args", "want"),
    [
        pytest.param((), VLLM_DEFAULT_MAX_NUM_SEQS, id="vllm-default"),
        pytest.param(("--max-model-len", "8192"), VLLM_DEFAULT_MAX_NUM_SEQS, id="other-flags-only"),
        pytest.param(("--max-num-seqs", "64"), 64, id="separate-value"),
        pytest.param(("--max-model-len", "8192", "--max-num-seqs=48", "--enforce-eager"), 48, id="inline-value"),
        pytest.param(("--max_num_seqs", "32"), 32, id="underscores-as-vllm-accepts"),
        pytest.param(("--max-num-seqs", "8", "--max-num-seqs=16"), 16, id="last-wins"),
        pytest.param(("--max-num-seqs-per-step", "3"), VLLM_DEFAULT_MAX_NUM_SEQS, id="longer-flag-is-not-it"),
    ],
)
def test_server_capacity_reads_max_num_seqs(extra_args: tuple[str, ...], want: int) -> None:
    assert server_capacity(extra_args) == want


def test_vllm_default_max_num_seqs_is_the_openai_servers_on_gpus() -> None:
    assert VLLM_DEFAULT_MAX_NUM_SEQS == 256  # vLLM's EngineArgs._set_default_args, OPENAI_API_SERVER on GPUs


@pytest.mark.parametrize(
    ("extra_args", "needle"),
    [
        pytest.param(("--max-num-seqs",), "--max-num-seqs needs a whole number of at least 1, got ''", id="missing"),
        pytest.param(("--max-num-seqs", "0"), "got '0'", id="zero"),
        pytest.param(("--max-num-seqs=lots",), "got 'lots'", id="not-a-number"),
        pytest.param(("--max-num-seqs", "--enforce-eager"), "got '--enforce-eager'", id="next-is-a-flag"),
    ],
)
def test_bad_max_num_seqs_is_refused_at_its_field(extra_args: tuple[str, ...], needle: str) -> None:
    run = make_run(
        deployments=(
            Deployment(model_alias="judge", model="j"),
            Deployment(model_alias="gen", model="m", server=ServerSpec(extra_args=extra_args)),
        )
    )
    with pytest.raises(PlanError) as info:
        compile_plan(make_inputs(run, _gpu_profile()))
    assert str(info.value).startswith("deployments[1].server.extra_args: "), str(info.value)
    assert needle in str(info.value)


def test_each_deployment_gets_its_capacity_and_the_clients_parallel_requests() -> None:
    run = make_run(
        deployments=(
            Deployment(
                model_alias="gen",
                model="g",
                replicas=3,
                server=ServerSpec(extra_args=("--max-model-len", "4096", "--max-num-seqs", "8")),
            ),
            Deployment(model_alias="judge", model="j", replicas=1),
        )
    )
    plan = compile_plan(make_inputs(run, _gpu_profile()))
    assert plan.serving is not None
    sized = {d.alias: (d.capacity, d.max_parallel_requests) for d in plan.serving.deployments}
    assert sized == {"gen": (8, 3 * 8), "judge": (VLLM_DEFAULT_MAX_NUM_SEQS, VLLM_DEFAULT_MAX_NUM_SEQS)}
    # The sizing is part of the hashed plan; a plan written before it decodes with neither set.
    again = msgspec.json.decode(encode(plan), type=Plan)
    assert again.serving is not None and again.serving.deployments[0].max_parallel_requests == 24
    older = msgspec.to_builtins(plan)
    for deployment in older["serving"]["deployments"]:
        del deployment["capacity"], deployment["max_parallel_requests"]
    old = msgspec.convert(older, type=Plan)
    assert old.serving is not None
    assert {(d.capacity, d.max_parallel_requests) for d in old.serving.deployments} == {(None, None)}


@pytest.mark.parametrize(
    ("memory", "per_gpu", "want"),
    [
        pytest.param("24G", "8G", "24G", id="explicit-memory-wins"),
        pytest.param(None, "8G", "16384M", id="derived-from-gpus"),
        pytest.param(None, None, None, id="site-default"),
    ],
)
def test_memory_request(memory: str | None, per_gpu: str | None, want: str | None) -> None:
    run = make_run(
        deployments=(Deployment(model_alias="gen", model="m", tensor_parallel=2),),
        submission=Submission(memory=memory),
    )
    plan = compile_plan(make_inputs(run, _gpu_profile(memory_per_gpu=per_gpu)))
    assert plan.generation.memory == want


@pytest.mark.parametrize(
    ("deployments", "profile", "submission", "needles"),
    [
        pytest.param(
            (Deployment(model_alias="gen", model="m", replicas=3, tensor_parallel=2),),
            {},
            {},
            ["need 6 GPUs", "gen: 3 x 2", "a node has 4"],
            id="more-gpus-than-a-node",
        ),
        pytest.param(
            (Deployment(model_alias="gen", model="m", tensor_parallel=3),),
            {},
            {},
            ["deployments[0].tensor_parallel: 3 does not divide the 4 GPUs", "(model alias 'gen')"],
            id="tp-does-not-divide",
        ),
        pytest.param(
            (Deployment(model_alias="gen", model="m", tensor_parallel=8),),
            {},
            {},
            ["tensor_parallel: 8 is more than the 4 GPUs"],
            id="tp-larger-than-node",
        ),
        pytest.param(
            (Deployment(model_alias="gen", model="m"),),
            {},
            {"partition": "cpu"},
            ["'cpu' is the profile's CPU-only partition"],
            id="cpu-partition",
        ),
        pytest.param(
            (Deployment(model_alias="gen", model="m"),),
            {"gpus_per_node": 0},
            {},
            ["profile.gpus_per_node: 0, but the run deploys models"],
            id="no-gpus-in-profile",
        ),
        pytest.param(
            (Deployment(model_alias="gen", model="m"),),
            {},
            {"memory": "lots"},
            ["'lots' is not a Slurm size"],
            id="bad-memory",
        ),
    ],
)
def test_plans_that_cannot_fit_are_refused(
    deployments: tuple[Deployment, ...], profile: dict[str, object], submission: dict[str, object], needles: list[str]
) -> None:
    run = make_run(deployments=deployments, submission=Submission(**submission))  # type: ignore[arg-type]
    with pytest.raises(PlanError) as info:
        compile_plan(make_inputs(run, _gpu_profile(**profile)))
    for needle in needles:
        assert needle in str(info.value)


def test_plan_is_a_pure_function() -> None:
    first = compile_plan(make_inputs())
    second = compile_plan(make_inputs())

    assert first == second
    assert digest(first) == digest(second)
    assert encode(first) == encode(second)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"run": make_run(num_records=101)}, id="num-records"),
        pytest.param({"profile": make_profile(python_env="/other")}, id="python-env"),
        pytest.param({"snapshot": ProviderSnapshot()}, id="snapshot"),
        pytest.param({"recipe_sha256": "3" * 64}, id="recipe-digest"),
        pytest.param({"snapshot_sha256": "4" * 64}, id="snapshot-digest"),
        pytest.param({"layout": RunLayout.in_workspace(Path("/ws"), "run-2")}, id="run-id"),
    ],
)
def test_plan_digest_depends_on_every_input(change: dict[str, object]) -> None:
    base = make_inputs()
    changed = PlanInputs(
        **{
            "run": base.run,
            "profile": base.profile,
            "snapshot": base.snapshot,
            "layout": base.layout,
            "recipe_sha256": base.recipe_sha256,
            "snapshot_sha256": base.snapshot_sha256,
            **change,
        }  # type: ignore[arg-type]
    )
    assert digest(compile_plan(changed)) != digest(compile_plan(base))


def test_plan_round_trips_through_json() -> None:
    plan = compile_plan(make_inputs())
    assert msgspec.json.decode(encode(plan), type=Plan) == plan


def test_compile_the_hosted_only_example() -> None:
    run = load_run_file(REPO / "examples" / "hosted-only" / "run.yaml")
    profile = load_profile(REPO / "examples" / "local-profile.yaml")

    plan = compile_plan(make_inputs(run, profile))

    assert [(s.first_record, s.num_records) for s in plan.shards] == [(0, 20), (20, 20)]
    assert plan.buffer_size == 10
    assert plan.generation.partition == "cpu"
    assert plan.generation.gres == "none"
    assert (plan.generation.time_minutes, plan.collection.time_minutes) == (20, 10)
    assert (plan.generation.memory, plan.collection.memory) == ("2G", "1G")
    assert plan.python_env == profile.python_env


# --- every refusal starts with the field it is about (run-file fields as written; profile fields "profile.") ---


@pytest.mark.parametrize(
    ("run", "profile", "want"),
    [
        pytest.param(
            {"submission": Submission(memory="lots")},
            {},
            "submission.memory: 'lots' is not a Slurm size such as 16G or 500M",
            id="submission-memory",
        ),
        pytest.param(
            {"collection": Collection(memory="lots")},
            {},
            "collection.memory: 'lots' is not a Slurm size such as 16G or 500M",
            id="collection-memory",
        ),
        pytest.param(
            {"submission": Submission(time_limit="soon")},
            {},
            "submission.time_limit: 'soon' is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)",
            id="submission-time-limit",
        ),
        pytest.param(
            {"collection": Collection(time_limit="0")},
            {},
            "collection.time_limit: '0' is shorter than one minute",
            id="collection-time-limit",
        ),
        pytest.param(
            {"num_records": 4, "shards": 5},
            {},
            "shards: 5 shards for 4 records; every shard needs at least one record",
            id="shards",
        ),
        pytest.param(
            {"deployments": (Deployment(model_alias="gen", model="m"),)},
            {"gpus_per_node": 0},
            "profile.gpus_per_node: 0, but the run deploys models (deployments); set the GPUs of a node",
            id="profile-gpus",
        ),
        pytest.param(
            {"deployments": (Deployment(model_alias="gen", model="m"),)},
            {"gpus_per_node": 4, "memory_per_gpu": "much"},
            "profile.memory_per_gpu: 'much' is not a Slurm size such as 16G or 500M",
            id="profile-memory-per-gpu",
        ),
        pytest.param(
            {"deployments": (Deployment(model_alias="gen", model="m", tensor_parallel=3),)},
            {"gpus_per_node": 4},
            "deployments[0].tensor_parallel: 3 does not divide the 4 GPUs of a node (model alias 'gen')",
            id="tensor-parallel",
        ),
        pytest.param(
            {"deployments": (Deployment(model_alias="gen", model="m", tensor_parallel=8),)},
            {"gpus_per_node": 4},
            "deployments[0].tensor_parallel: 8 is more than the 4 GPUs of one node (model alias 'gen')",
            id="tensor-parallel-too-large",
        ),
        pytest.param(
            {"deployments": (Deployment(model_alias="gen", model="m", replicas=2, server=ServerSpec(port=65535)),)},
            {"gpus_per_node": 4},
            "deployments[0].server.port: 65535 + 2 replicas exceeds 65535 (model alias 'gen')",
            id="port",
        ),
        pytest.param(
            {"deployments": (Deployment(model_alias="gen", model="m", replicas=3, tensor_parallel=2),)},
            {"gpus_per_node": 4},
            "deployments: the deployments need 6 GPUs (gen: 3 x 2) but a node has 4",
            id="gpus-in-total",
        ),
        pytest.param(
            {
                "deployments": (Deployment(model_alias="gen", model="m"),),
                "submission": Submission(partition="cpu"),
            },
            {"gpus_per_node": 4, "partition": "gpu", "cpu_partition": "cpu"},
            "submission.partition: 'cpu' is the profile's CPU-only partition",
            id="partition",
        ),
    ],
)
def test_refusals_start_with_their_field(run: dict[str, object], profile: dict[str, object], want: str) -> None:
    with pytest.raises(PlanError) as info:
        compile_plan(make_inputs(make_run(**run), make_profile(**profile)))
    assert str(info.value).startswith(want), str(info.value)


# --- stages: auto ---

STAGES = (StagePlan(kind="gpu", columns=("gen",)), StagePlan(kind="cpu", columns=("judge",)))
COLUMNS = (
    RecipeColumn(name="gen", column_type="llm-text", aliases=("gen",), refs=(), required=(), side_effects=(),
                 drop=False, skips=False, propagate_skip=True, sampler_type=None),
    RecipeColumn(name="judge", column_type="llm-judge", aliases=("judge",), refs=("gen",), required=("gen",),
                 side_effects=(), drop=False, skips=False, propagate_skip=True, sampler_type=None),
)  # fmt: skip
"""A local generator and a hosted judge over it, as Data Designer's column configs describe them."""


def _staged_inputs(run: RunFile, profile: ClusterProfile) -> PlanInputs:
    return PlanInputs(
        run=run,
        profile=profile,
        snapshot=SNAPSHOT,
        layout=LAYOUT,
        recipe_sha256="1" * 64,
        snapshot_sha256="2" * 64,
        recipe={"columns": [{"name": "gen"}, {"name": "judge"}]},
        columns=COLUMNS,
    )


def test_a_split_recipe_gets_its_stages_and_a_cpu_only_stage_on_the_cpu_partition() -> None:
    run = make_run(
        deployments=(Deployment(model_alias="gen", model="m"),),
        submission=Submission(cpus=3, partition="gpu", constraint="h100", time_limit="02:00:00"),
    )
    plan = compile_plan(_staged_inputs(run, _gpu_profile()))
    assert plan.stages == STAGES and plan.column_order == ("gen", "judge")
    assert (plan.stage_reason or "").startswith("two stages: GPU stage 1 column(s) ('gen'); CPU stage 1 column(s)")
    cpu = plan.cpu_stage
    assert cpu is not None
    assert (cpu.partition, cpu.gres, cpu.gpus, cpu.cpus_per_task, cpu.constraint) == ("cpu", "none", None, 3, None)
    assert cpu.time_minutes == plan.generation.time_minutes == 120


def test_stages_single_and_hosted_only_runs_have_one_stage() -> None:
    single = make_run(deployments=(Deployment(model_alias="gen", model="m"),), stages="single")
    plan = compile_plan(_staged_inputs(single, _gpu_profile()))
    assert (plan.stages, plan.cpu_stage) == ((), None)
    assert plan.stage_reason == "single stage: the run file says stages: single"
    hosted = compile_plan(_staged_inputs(make_run(), _gpu_profile()))
    assert (hosted.stages, hosted.cpu_stage, hosted.stage_reason) == ((), None, None)


def test_every_run_gets_the_one_column_order_of_its_recipe() -> None:
    """Hosted-only, single- and two-stage runs of one recipe list its columns in one order (``final_columns``:
    the seed's columns, then the recipe's as Data Designer writes them); none where Data Designer did not read the
    columns, or a plugin's processor may change them."""
    inputs = dataclasses.replace(_staged_inputs(make_run(), _gpu_profile()), seed_columns=("q",))
    deployed = (Deployment(model_alias="gen", model="m"),)
    runs = (make_run(), make_run(deployments=deployed, stages="single"), make_run(deployments=deployed))
    plans = [compile_plan(dataclasses.replace(inputs, run=run)) for run in runs]
    assert [len(p.stages) for p in plans] == [0, 0, 2]
    assert {p.column_order for p in plans} == {("q", "gen", "judge")}
    assert compile_plan(dataclasses.replace(inputs, columns=None)).column_order is None
    plugin = {"columns": [], "processors": [{"processor_type": "my-plugin", "name": "p"}]}
    assert compile_plan(dataclasses.replace(inputs, recipe=plugin)).column_order is None


# --- buffer_size: the planner's batches where the run file sets none (test_batches.py: the rule) ---


@pytest.mark.parametrize(
    ("records", "shards", "want"),
    [(60, 1, 12), (61, 1, 12), (3, 1, 1), (1, 1, 1), (60, 7, 1), (100_000, 10, 1000), (4_000, 1, 800)],
)
def test_without_buffer_size_a_shard_saves_at_least_four_times(records: int, shards: int, want: int) -> None:
    plan = compile_plan(make_inputs(make_run(num_records=records, shards=shards, buffer_size=None)))
    largest = max(s.num_records for s in plan.shards)
    assert plan.buffer_size == want
    assert plan.batching is not None and plan.batching.by == "planner"
    assert plan.batching.batches == math.ceil(largest / want)
    # at least 5 saves where a shard has 5 records or more, unless Data Designer's default caps the batch lower
    assert plan.batching.batches >= min(largest, CHECKPOINTS_PER_SHARD)
    assert want <= DD_DEFAULT_BUFFER_SIZE


def test_a_run_with_deployments_sizes_its_batches_by_the_cost_models_rate() -> None:
    deployment = Deployment(model_alias="gen", model="org/gen", replicas=1)
    run = make_run(num_records=8_000, shards=2, buffer_size=None, deployments=(deployment,))
    plan = compile_plan(make_inputs(run, _gpu_profile()))
    assert plan.prediction is not None and plan.batching is not None
    record_s = plan.prediction.chosen.shard_record_s
    assert record_s > 0
    assert plan.batching.batch_s == pytest.approx(plan.buffer_size * record_s)
    assert plan.buffer_size == min(
        1000, math.ceil(4_000 / CHECKPOINTS_PER_SHARD), max(1, int(CHECKPOINT_S // record_s))
    )
