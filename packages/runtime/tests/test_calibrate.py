"""The calibration sweep of a tune allocation, against the stand-in (capacity 4, 0.2 s a request): requests per
second grow about linearly up to 4 in flight, then flatten."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ddslurm.config import (
    Calibration,
    DeploymentPlan,
    ReplicaPlan,
    ServingPlan,
    calibration_file,
    prompts_file,
    read_json,
)
from ddslurm.runtime._calibrate import CalibrationError, calibrate, measure_level
from ddslurm.runtime._log import new_logger

TOKEN = "the-allocations-own-token-" + "c" * 24
LATENCY = 0.2
CAPACITY = 4


def _body(n: int) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": f"p{n}"}], "max_tokens": 4}).encode()


def _serving(capacity: int | None) -> ServingPlan:
    replica = ReplicaPlan(index=0, gpus=1, cpus=1)
    deployment = DeploymentPlan(alias="gen", model="m", served_model_name="m", tensor_parallel=1,
                                replicas=(replica,), startup_timeout=60, capacity=capacity)  # fmt: skip
    return ServingPlan(deployments=(deployment,), gpus=1)


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    fake = pytest.importorskip("fake_vllm.testing")
    args = ("--max-num-seqs", str(CAPACITY), "--fake-latency", str(LATENCY))
    with fake.start_server("m", api_key=TOKEN, args=args) as running:
        yield running


def test_the_sweep_grows_to_the_capacity_then_flattens(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prompts_file(tmp_path, "gen").write_bytes(b"".join(_body(n) + b"\n" for n in range(5)))
    calibration = calibrate(
        _serving(8), (1, 2, 4, 8), tmp_path, {"gen": server.root_url}, {"gen": 12.5}, TOKEN,
        new_logger(io.BytesIO()), min_s=1.0, per_slot=4,
    )  # fmt: skip
    assert read_json(calibration_file(tmp_path), Calibration) == calibration
    (entry,) = calibration.entries
    assert (entry.alias, entry.load_s, entry.prompts) == ("gen", 12.5, 5)
    rates = {p.in_flight: p.requests_per_s for p in entry.sweep}
    assert list(rates) == [1, 2, 4, 8]
    # The stand-in's model (fake_vllm.handlers): a request admitted with k others running takes LATENCY x (1 + k / C),
    # so the ideal rates are 5, 8, 11.4 a second at 1, 2, 4 in flight, and at 8 (twice C, half of them queued)
    # C / (2 x LATENCY) = 10: growing up to the capacity, then flat. The shape, not the numbers (shared CPUs slow any
    # level, so a slowed 4 may measure below 8; no level can beat the ceiling the capacity sets, 11.4 a second, where
    # a server admitting all 8 would reach 8 / (LATENCY x (1 + 7 / C)) = 14.5):
    ideal = 1 / LATENCY
    ceiling = CAPACITY * ideal / (1 + (CAPACITY - 1) / CAPACITY)
    assert 0.4 * ideal <= rates[1] <= ideal * 1.05
    assert rates[2] >= 1.3 * rates[1] and rates[4] >= 1.2 * rates[2]
    assert max(rates[4], rates[8]) <= ceiling * 1.05


def test_each_alias_is_swept_at_the_levels_its_capacity_allows(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prompts_file(tmp_path, "gen").write_bytes(_body(0) + b"\n")
    calibration = calibrate(
        _serving(3), (1, 2, 3, 4, 8), tmp_path, {"gen": server.root_url}, {}, TOKEN, new_logger(io.BytesIO()),
        min_s=0.1, per_slot=1,
    )  # fmt: skip
    assert [p.in_flight for p in calibration.entries[0].sweep] == [1, 2, 3]


def test_a_refused_request_or_no_recorded_request_fails_the_sweep(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CalibrationError, match="401"):
        measure_level(server.root_url, "not-the-token", [_body(0)], 1, min_s=0.1, per_slot=1)
    with pytest.raises(CalibrationError, match="recorded no chat completion") as caught:
        calibrate(_serving(4), (1, 2, 4), tmp_path, {"gen": server.root_url}, {}, TOKEN, new_logger(io.BytesIO()))
    assert caught.value.reason == "calibration_failed"
    assert not calibration_file(tmp_path).exists()


def test_the_jobs_stop_signal_ends_a_level_at_its_next_request(server) -> None:  # type: ignore[no-untyped-def]
    class Stopped(Exception):
        pass

    sent: list[int] = []

    def check() -> None:
        sent.append(1)
        if len(sent) > 3:
            raise Stopped

    with pytest.raises(Stopped):
        measure_level(server.root_url, TOKEN, [_body(0)], 2, min_s=60.0, per_slot=100, check=check)
    assert len(sent) <= 6  # each slot stops at its next request, not after the level's 60 s
