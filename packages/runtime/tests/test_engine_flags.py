"""The engine versions each rendered flag needs (``_engine_flags.FLAG_VERSIONS``): versions read as the engines print
them, a rendered command line checked against a version (refused with the version needed, an unreadable one said,
not refused), the table agreeing with the stand-in acting as each release, and the CPUs vLLM's data parallel keeps
busy."""

from __future__ import annotations

from typing import Any

import pytest

from ddslurm.config import DeploymentPlan, ReplicaPlan, ServingPlan
from ddslurm.runtime import RankPlace
from ddslurm.runtime._engine_flags import (
    FLAG_VERSIONS,
    EngineVersion,
    api_server_count,
    check_flags,
    check_serving,
    data_parallel_cpus,
    parse_version,
    refusal_text,
)
from ddslurm.runtime._server_command import sglang_args, vllm_serve_args

UDS = "unix:/tmp/s/gen-0.sock"


def _dep(**kw: Any) -> DeploymentPlan:
    fields: dict[str, Any] = {
        "alias": "gen",
        "model": "M",
        "served_model_name": "s",
        "tensor_parallel": 1,
        "replicas": (ReplicaPlan(index=0, gpus=1, cpus=4),),
        "startup_timeout": 60,
    }
    return DeploymentPlan(**{**fields, **kw})


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("0.11.1", EngineVersion((0, 11, 1)), id="release"),
        pytest.param("0.10.1.1", EngineVersion((0, 10, 1, 1)), id="four-numbers"),
        pytest.param("0.11.1rc2.dev12+g1234", EngineVersion((0, 11, 1), unreleased=True), id="nightly"),
        pytest.param("0.11.1.dev5", EngineVersion((0, 11, 1), unreleased=True), id="dev"),
        pytest.param("0.12.0+cu128", EngineVersion((0, 12)), id="local-label"),
        pytest.param("0.4.6.post2", EngineVersion((0, 4, 6), post=2), id="sglang-post"),
        pytest.param("0.5.2", EngineVersion((0, 5, 2)), id="sglang"),
        pytest.param("v0.9.0\n", EngineVersion((0, 9)), id="v-and-newline"),
        pytest.param("unknown", None, id="unknown"),
        pytest.param("unknown (pyxis image vimg)", None, id="image"),
        pytest.param("fake-vllm 0.1.0 (vLLM stand-in)", None, id="prose"),
        pytest.param("", None, id="empty"),
    ],
)
def test_versions_as_the_engines_print_them(text: str, want: EngineVersion | None) -> None:
    assert parse_version(text) == want


@pytest.mark.parametrize(
    ("found", "needed", "want"),
    [
        ("0.11.1", "0.11.1", True),
        ("0.11.0", "0.11.1", False),
        ("0.10.1.1", "0.10.1", True),
        ("0.9", "0.9.0", True),
        ("0.12.0rc1", "0.11.1", True),
        ("0.11.1rc2.dev12+g1234", "0.11.1", None),
        ("0.11.1.post1", "0.11.1", True),
        ("0.4.6.post1", "0.4.6.post2", False),
        ("0.4.6", "0.4.6.post2", False),
        ("0.4.7", "0.4.6.post2", True),
        ("1.0.0", "0.11.1", True),
    ],
)
def test_a_version_has_what_came_in_another(found: str, needed: str, want: bool | None) -> None:
    parsed, need = parse_version(found), parse_version(needed)
    assert parsed is not None and need is not None
    assert parsed.at_least(need) is want


def _multi_node_pp(version: str) -> Any:
    dep = _dep(tensor_parallel=4, pipeline_parallel=2, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),))
    argvs = [(f"rank{k}", vllm_serve_args(dep, UDS, RankPlace(k, 2, "10.0.0.1", "29500"))) for k in (0, 1)]
    return check_flags("vllm", version, argvs)


def test_multi_node_pipeline_parallel_on_a_vllm_before_0_11_1_is_refused_with_the_version_needed() -> None:
    check = _multi_node_pp("0.11.0")
    # 0.11.0 has --uds and --headless: only the rendezvous flags are refused, in the command line's order
    assert [r.since.flag for r in check.refusals] == ["--nnodes", "--node-rank", "--master-addr", "--master-port"]
    assert all(r.found == "0.11.0" and r.since.version == "0.11.1" for r in check.refusals)
    text = refusal_text(check, "/opt/vllm/bin/vllm")
    assert text.startswith("/opt/vllm/bin/vllm is vLLM 0.11.0, too old for the run's command lines")
    assert "--nnodes (tensor x pipeline parallel over nodes) needs vLLM >= 0.11.1 (vllm-project/vllm#23691)" in text
    assert text.endswith("install vLLM >= 0.11.1 there")
    assert check.note == ""


def test_the_release_that_brought_the_flags_and_later_ones_pass() -> None:
    for version in ("0.11.1", "0.11.2", "0.19.0", "1.0.0+cu128"):
        check = _multi_node_pp(version)
        assert check.refusals == () and check.unsure == (), version
        assert "--nnodes" in check.checked and "--uds" in check.checked


def test_an_unknown_version_is_not_refused_but_said() -> None:
    for version in ("unknown", "unknown (pyxis image vimg)"):
        check = _multi_node_pp(version)
        assert check.refusals == ()
        assert set(check.unsure) == {"--uds", "--headless", "--nnodes", "--node-rank", "--master-addr", "--master-port"}
        assert check.note.startswith(f"vLLM version {version!r} cannot be read, so --uds, ")
    nightly = _multi_node_pp("0.11.1rc2.dev12+g1234")
    assert nightly.refusals == () and set(nightly.unsure) == {
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
    }
    assert "is a pre-release of the version that brought --nnodes" in nightly.note


def test_uds_needs_vllm_0_10_1_and_data_parallel_over_nodes_0_10_0() -> None:
    one_node = [("server-gen-0", vllm_serve_args(_dep(), UDS))]
    assert [r.since.flag for r in check_flags("vllm", "0.10.0", one_node).refusals] == ["--uds"]
    assert check_flags("vllm", "0.10.1", one_node).refusals == ()
    tcp = [("server-gen-0", vllm_serve_args(_dep(), "http://127.0.0.1:8000"))]
    assert check_flags("vllm", "0.8.5", tcp).refusals == ()  # nothing newer on a plain replica's line
    dp = _dep(data_parallel=4, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),))
    follower = [("rank1", vllm_serve_args(dp, UDS, RankPlace(1, 2, "10.0.0.1", "29500")))]
    assert [r.since.flag for r in check_flags("vllm", "0.9.2", follower).refusals] == ["--data-parallel-start-rank"]
    assert {r.since.flag for r in check_flags("vllm", "0.8.5", follower).refusals} == {
        "--data-parallel-size-local",
        "--data-parallel-address",
        "--data-parallel-rpc-port",
        "--headless",
        "--data-parallel-start-rank",
    }


def test_sglang_flags_and_its_post_releases() -> None:
    dep = _dep(engine="sglang", listen="tcp", pipeline_parallel=2, expert_parallel=True)
    argvs = [("server-gen-0", sglang_args(dep, "http://127.0.0.1:30000"))]
    refused = {r.since.flag: r.since.version for r in check_flags("sglang", "0.4.6.post1", argvs).refusals}
    assert refused == {"--pp-size": "0.4.6.post2"}
    assert check_flags("sglang", "0.4.7+fakevllm.0.1.0", argvs).refusals == ()
    older = {r.since.flag for r in check_flags("sglang", "0.3.5", argvs).refusals}
    assert older == {"--pp-size", "--ep-size", "--enable-metrics"}
    spanning = [
        ("r1", sglang_args(_dep(engine="sglang", listen="tcp"), "http://127.0.0.1:1", RankPlace(1, 2, "a", "1")))
    ]
    assert [r.since.flag for r in check_flags("sglang", "0.3.2", spanning).refusals] == [
        "--enable-metrics",
        "--dist-init-addr",
    ]


def test_check_serving_renders_every_rank_of_every_deployment() -> None:
    spanning = _dep(tensor_parallel=4, pipeline_parallel=2, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),))
    serving = ServingPlan(deployments=(spanning,), gpus=4, nodes=2)
    (check,) = check_serving(serving, {"vllm": "0.10.1"})
    assert {r.since.flag for r in check.refusals} == {"--nnodes", "--node-rank", "--master-addr", "--master-port"}
    assert {r.step for r in check.refusals} == {"server-gen-0"}  # each flag once, at the first step that has it


# The release before each minimum: the stand-in acting as it must refuse the flag as argparse does, and accept it
# acting as the minimum (the table and the stand-in's own list of releases agree).
BEFORE = {"0.9.0": "0.8.5", "0.10.0": "0.9.2", "0.10.1": "0.10.0", "0.11.1": "0.11.0", "0.3.3": "0.3.2",
          "0.3.5.post1": "0.3.5", "0.4.0.post1": "0.4.0", "0.4.6.post2": "0.4.6.post1"}  # fmt: skip
VALUE = {"--headless": [], "--dist-init-addr": ["h:1"], "--enable-metrics": []}


@pytest.mark.parametrize("since", FLAG_VERSIONS, ids=lambda s: f"{s.engine}{s.flag}")
def test_the_table_and_the_stand_in_agree(since: Any) -> None:
    cli = pytest.importorskip("fake_vllm.cli")
    head = ["M"] if since.engine == "vllm" else ["--model-path", "M"]
    argv = [*head, since.flag, *VALUE.get(since.flag, ["1"])]
    cli.build_parser(since.engine, since.version).parse_known_args(argv)  # the release that brought it: accepted
    with pytest.raises(SystemExit) as refused:
        cli.build_parser(since.engine, BEFORE[since.version]).parse_args(argv)
    assert refused.value.code == 2


def test_data_parallel_keeps_an_api_server_and_an_engine_core_busy_per_rank() -> None:
    assert data_parallel_cpus(_dep()) is None
    dp4 = _dep(data_parallel=4, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4),))
    assert api_server_count(dp4) == 4 and data_parallel_cpus(dp4) == 8
    enough = _dep(data_parallel=4, replicas=(ReplicaPlan(index=0, gpus=4, cpus=8),))
    assert data_parallel_cpus(enough) is None
    one = _dep(
        data_parallel=4, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4),), extra_args=("--api-server-count", "1")
    )
    assert api_server_count(one) == 1 and data_parallel_cpus(one) == 5
    eq = _dep(data_parallel=4, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4),), extra_args=("-asc=0",))
    assert api_server_count(eq) == 0 and data_parallel_cpus(eq) is None
    spanning = _dep(data_parallel=4, replicas=(ReplicaPlan(index=0, gpus=2, cpus=4, nodes=2),))
    assert data_parallel_cpus(spanning) == 6  # 4 API servers on the leader, 2 engine cores there
    assert data_parallel_cpus(_dep(engine="sglang", listen="tcp", data_parallel=4)) is None
